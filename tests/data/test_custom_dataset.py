"""veRL's ``data.custom_cls``: main_ppo builds its datasets with the user's class from a file."""

from __future__ import annotations

import json

import pytest

from hybridflow.config.data import DataConfig
from hybridflow.config.loader import ConfigError
from hybridflow.config.module import ModuleConfig
from hybridflow.data.custom_dataset import rl_dataset_class
from hybridflow.data.rl_dataset import RLHFDataset

CUSTOM = '''
import json
from hybridflow.data.rl_dataset import RLHFDataset

class RelabelledDataset(RLHFDataset):
    """Every prompt's ground truth becomes "7"; each construction is logged to MARK."""
    def __init__(self, data_files, tokenizer, config, processor=None):
        super().__init__(data_files, tokenizer, config, processor)
        with open(MARK, "a") as f:
            f.write(json.dumps({"files": [str(p) for p in self.data_files], "n": len(self)}) + "\\n")

    def __getitem__(self, i):
        row = super().__getitem__(i)
        row["reward_model"] = {"style": "rule", "ground_truth": "7"}
        return row

class NotADataset:
    pass
'''


def write_custom(tmp_path) -> tuple[str, str]:
    mark = tmp_path / "built.jsonl"
    path = tmp_path / "my_dataset.py"
    path.write_text(f"MARK = {str(mark)!r}\n" + CUSTOM)
    return str(path), str(mark)


def test_main_ppo_trains_on_the_custom_class(tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import run_ppo
    from hybridflow.trainer.ppo import ray_trainer
    from tests.trainer.e2e_helpers import base_overrides

    path, mark = write_custom(tmp_path)
    seen = []
    reward = ray_trainer.RayPPOTrainer.compute_reward

    def recording_reward(trainer, batch, metrics):
        seen.extend(r["ground_truth"] for r in batch.non_tensor_batch["reward_model"])
        return reward(trainer, batch, metrics)

    monkeypatch.setattr(ray_trainer.RayPPOTrainer, "compute_reward", recording_reward)
    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, steps=1, backend="inprocess")
    run_ppo(
        load_config(
            "ppo_trainer",
            [
                *overrides,
                "trainer.test_freq=-1",
                f"data.custom_cls.path={path}",
                "data.custom_cls.name=RelabelledDataset",
            ],
        )
    )
    built = [json.loads(line) for line in open(mark)]
    assert [b["files"][0].rsplit("/", 1)[-1] for b in built] == ["train.parquet", "test.parquet"]
    assert seen and set(seen) == {"7"}  # the training batch came from the custom class's rows


@pytest.mark.parametrize(
    "custom, match",
    [
        ({"path": "PATH", "name": None}, "needs data.custom_cls.name"),
        ({"path": "PATH", "name": "Missing"}, "data.custom_cls.name='Missing': no such class"),
        ({"path": "PATH", "name": "NotADataset"}, "is not a torch.utils.data.Dataset subclass"),
        ({"path": "/nowhere/x.py", "name": "X"}, "data.custom_cls.path='/nowhere/x.py'"),
    ],
)
def test_bad_custom_class_names_the_key(tmp_path, custom, match):
    path, _ = write_custom(tmp_path)
    custom = {k: (path if v == "PATH" else v) for k, v in custom.items()}
    with pytest.raises(ConfigError, match=match):
        rl_dataset_class(DataConfig(custom_cls=ModuleConfig(**custom)))


def test_no_custom_class_is_rlhf_dataset():
    assert rl_dataset_class(DataConfig()) is RLHFDataset
