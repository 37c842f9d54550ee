"""A plain (non-editable) install works: the wheel carries the yaml configs, and the installed
package finds them and imports without the GPU-only extras (vllm, flash_attn).

The wheel is built from a copy of the checkout (VCS, venv and build leftovers excluded), so the
build's own build/ and *.egg-info land in a temporary directory, never in the repository.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[1]
_NOT_SOURCE = shutil.ignore_patterns(
    ".git",
    ".venv",
    "__pycache__",
    "*.egg-info",
    "build",
    "dist",
    ".pytest_cache",
    ".hypothesis",
    "outputs",
    "checkpoints",
    "runs",
    "*.pyc",
)

# Makes `import vllm` / `import flash_attn` fail even where they are installed, as on a CPU machine.
_SITECUSTOMIZE = textwrap.dedent(
    """
    import sys

    class _BlockGpuExtras:
        blocked = ("vllm", "flash_attn")

        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in self.blocked:
                raise ImportError(f"{name} is blocked by the packaging test")
            return None

    sys.meta_path.insert(0, _BlockGpuExtras())
    """
)

_CHECK = textwrap.dedent(
    """
    import json, sys
    import hybridflow, hybridflow.protocol, hybridflow.single_controller.ray
    import hybridflow.devtools.check_verl_examples  # what users run ships
    from hybridflow.trainer.config import AlgoConfig  # veRL's paths: served by hybridflow.compat
    from hybridflow.workers.config import FSDPActorConfig
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from hybridflow.config.loader import config_dir, load_config, raw_default_config

    blocked = {}
    for name in ("vllm", "flash_attn"):
        try:
            __import__(name)
            blocked[name] = False
        except ImportError:
            blocked[name] = True
    cfg = load_config("ppo_trainer", [])
    with initialize_config_module("hybridflow.trainer.config", version_base=None):  # pkg://hybridflow.trainer.config
        tree = OmegaConf.to_container(compose(config_name="ppo_trainer"))
    print("RESULT" + json.dumps({
        "tree_is_ppo_trainer": tree == raw_default_config("ppo_trainer"),
        "hybridflow": hybridflow.__file__, "config_dir": str(config_dir()), "blocked": blocked,
        "adv_estimator": cfg.algorithm.adv_estimator, "has_ray_init": "ray_init" in cfg,
        "gpu_modules_loaded": sorted(m for m in sys.modules if m.split(".")[0] in ("vllm", "flash_attn")),
    }))
    """
)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src") / "hybridflow"
    shutil.copytree(REPO_ROOT, src, ignore=_NOT_SOURCE)
    out = tmp_path_factory.mktemp("wheel")
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w", str(out), str(src)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (whl,) = out.glob("hybridflow-*.whl")
    return whl


def test_wheel_contains_configs_and_package(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    yamls = sorted(p.name for p in (REPO_ROOT / "configs").glob("*.yaml"))
    assert "ppo_trainer.yaml" in yamls and len(yamls) >= 4  # the configs the design names are there
    for name in yamls:
        assert f"hybridflow/configs/{name}" in names
    assert "hybridflow/protocol.py" in names
    assert "hybridflow/single_controller/ray/base.py" in names
    assert not [n for n in names if n.startswith(("tests/", "configs/", "devtools/"))]  # only the package is shipped
    assert "hybridflow/compat/paths.py" in names and "hybridflow/devtools/check_verl_examples.py" in names
    assert not [n for n in names if "config_yaml" in n or "verl_keys" in n]  # maintainers' tools stay behind
    tree = sorted(str(p.relative_to(REPO_ROOT)) for p in (REPO_ROOT / "hybridflow/trainer/config").rglob("*.yaml"))
    assert "hybridflow/trainer/config/actor/dp_actor.yaml" in tree
    assert [n for n in tree if n not in names] == []  # veRL's config tree, for hydra.searchpath


def test_installed_wheel_finds_configs_without_gpu_extras(wheel, tmp_path):
    pytest.importorskip("ray")  # a dependency of the CPU install, whose check imports the Ray backend
    target, site = tmp_path / "site", tmp_path / "blocker"
    cmd = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    site.mkdir()
    (site / "sitecustomize.py").write_text(_SITECUSTOMIZE)

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    # the caller's other PYTHONPATH entries stay (a GPU machine's carried wheels); the checkout does not
    kept = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and Path(p).resolve() != REPO_ROOT]
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(target), *kept])
    proc = subprocess.run(
        [sys.executable, "-c", _CHECK], cwd="/tmp", env=env, capture_output=True, text=True, timeout=300
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    got = json.loads(lines[-1][len("RESULT") :])

    # the installed copy is the one imported (not the checkout through the editable install)
    assert Path(got["hybridflow"]).resolve().is_relative_to(target.resolve())
    assert Path(got["config_dir"]).resolve().is_relative_to(target.resolve())
    assert got["adv_estimator"] == "gae" and got["has_ray_init"]
    assert got["tree_is_ppo_trainer"]  # the installed tree composes into the installed ppo_trainer
    assert got["blocked"] == {"vllm": True, "flash_attn": True}
    assert got["gpu_modules_loaded"] == []
