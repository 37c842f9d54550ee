"""The in-process backend needs no Ray: run registered methods with `import ray` made impossible."""

import os
import subprocess
import sys
import textwrap

from tests.subprocess_env import pythonpath_with

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

SCRIPT = textwrap.dedent(
    """
    import sys

    class _NoRay:  # any attempt to import ray fails, as on a machine without it
        def find_spec(self, name, path=None, target=None):
            if name == "ray" or name.startswith("ray."):
                raise ImportError("ray is not installed (blocked by the test)")
            return None

    sys.meta_path.insert(0, _NoRay())

    import torch
    from hybridflow import DataProto
    from hybridflow.single_controller.base import ClassWithInitArgs, Dispatch, Worker, register
    from hybridflow.single_controller.inprocess import InProcessWorkerGroup

    class Doubler(Worker):
        @register(dispatch_mode=Dispatch.DP_COMPUTE_PROTO)
        def double(self, data):
            return DataProto.from_dict(tensors={"y": data.batch["x"] * 2})

    wg = InProcessWorkerGroup(ClassWithInitArgs(Doubler))
    out = wg.double(DataProto.from_dict(tensors={"x": torch.arange(5.0)}))
    assert out.batch["y"].tolist() == [0.0, 2.0, 4.0, 6.0, 8.0], out.batch["y"]
    assert "ray" not in sys.modules
    print("OK")
    """
)


def test_inprocess_backend_runs_without_ray():
    env = dict(os.environ, PYTHONPATH=pythonpath_with(REPO))
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("OK")
