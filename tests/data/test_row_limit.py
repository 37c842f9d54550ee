"""veRL's ``data.train_max_samples`` / ``data.val_max_samples``: which rows a dataset keeps, in the RL and
SFT datasets, for a dataset class of the user's, and through main_ppo's and the SFT trainer's config keys."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from hybridflow.config.data import DataConfig
from hybridflow.config.loader import ConfigError
from hybridflow.config.module import ModuleConfig
from hybridflow.config.sft_trainer import SFTDataConfig
from hybridflow.data.custom_dataset import build_rl_dataset
from hybridflow.data.multiturn_sft_dataset import MultiTurnSFTDataset
from hybridflow.data.rl_dataset import RLHFDataset
from hybridflow.data.row_limit import row_subset
from hybridflow.data.sft_dataset import SFTDataset
from hybridflow.models.tiny import build_tiny_tokenizer
from hybridflow.trainer.sft_trainer import create_sft_dataset


@pytest.fixture(scope="module")
def tok():
    return build_tiny_tokenizer()


def write(tmp_path, rows, name) -> str:
    path = str(tmp_path / name)
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def rl_file(tmp_path, contents, name="rl.parquet") -> str:
    rows = [
        {
            "data_source": "openai/gsm8k",
            "prompt": [{"role": "user", "content": c}],
            "reward_model": {"style": "rule", "ground_truth": "1"},
            "extra_info": {"index": i},
        }
        for i, c in enumerate(contents)
    ]
    return write(tmp_path, rows, name)


def prompts_of(ds) -> list[str]:
    return [ds[i]["raw_prompt"][0]["content"] for i in range(len(ds))]


def test_row_subset_keeps_every_row_unless_a_smaller_positive_limit_is_set():
    for limit in (-1, 0, 10, 11):
        assert row_subset(10, limit, shuffle=True, seed=1) is None
    assert row_subset(10, 3, shuffle=False, seed=1) == [0, 1, 2]


def test_a_shuffled_subset_is_distinct_rows_fixed_by_the_seed():
    first = row_subset(1000, 50, shuffle=True, seed=7)
    assert len(first) == 50 and len(set(first)) == 50 and all(0 <= i < 1000 for i in first)
    assert row_subset(1000, 50, shuffle=True, seed=7) == first
    assert row_subset(1000, 50, shuffle=True, seed=8) != first
    assert first != list(range(50)) and first != sorted(first)  # drawn, not the first rows


def test_the_shuffled_subset_is_the_one_verl_draws():
    # veRL 0.9.1's RLHFDataset: np.random.default_rng(seed).choice(total, size=max_samples, replace=False)
    assert row_subset(40, 6, shuffle=True, seed=3) == np.random.default_rng(3).choice(40, 6, replace=False).tolist()


def test_rl_dataset_keeps_the_first_rows_or_a_seeded_draw(tmp_path, tok):
    contents = [f"q{i}" for i in range(12)]
    path = rl_file(tmp_path, contents)
    first = RLHFDataset(path, tok, {"max_prompt_length": 32, "shuffle": False}, max_samples=4)
    assert prompts_of(first) == ["q0", "q1", "q2", "q3"]
    drawn = RLHFDataset(path, tok, {"max_prompt_length": 32, "shuffle": True, "seed": 5}, max_samples=4)
    expected = [contents[i] for i in row_subset(12, 4, shuffle=True, seed=5)]
    assert prompts_of(drawn) == expected and expected != ["q0", "q1", "q2", "q3"]
    assert len(RLHFDataset(path, tok, {"max_prompt_length": 32}, max_samples=-1)) == 12


def test_the_limit_applies_before_long_prompts_are_filtered(tmp_path, tok):
    # as veRL: 2 rows kept out of 4, then the long one of them dropped, leaving 1 (not 2 short ones)
    path = rl_file(tmp_path, ["x" * 60, "a", "b", "c"])
    ds = RLHFDataset(
        path, tok, {"max_prompt_length": 32, "filter_overlong_prompts": True, "shuffle": False}, max_samples=2
    )
    assert prompts_of(ds) == ["a"]


CUSTOM = """
from hybridflow.data.rl_dataset import RLHFDataset

class WithLimit(RLHFDataset):
    def __init__(self, data_files, tokenizer, config, processor=None, max_samples=-1):
        self.given = max_samples
        super().__init__(data_files, tokenizer, config, processor, max_samples=max_samples)

class WithoutLimit(RLHFDataset):
    def __init__(self, data_files, tokenizer, config, processor=None):
        super().__init__(data_files, tokenizer, config, processor)
"""


def test_a_custom_class_gets_the_limit_or_a_clear_error(tmp_path, tok):
    path = rl_file(tmp_path, [f"q{i}" for i in range(6)])
    module = tmp_path / "my_dataset.py"
    module.write_text(CUSTOM)

    def config(name):
        return DataConfig(max_prompt_length=32, shuffle=False, custom_cls=ModuleConfig(path=str(module), name=name))

    with_limit = build_rl_dataset(path, tok, config("WithLimit"), 2, "data.train_max_samples")
    assert with_limit.given == 2 and prompts_of(with_limit) == ["q0", "q1"]
    assert len(build_rl_dataset(path, tok, config("WithoutLimit"), -1, "data.val_max_samples")) == 6
    with pytest.raises(ConfigError, match=r"data.val_max_samples=3: the dataset class WithoutLimit"):
        build_rl_dataset(path, tok, config("WithoutLimit"), 3, "data.val_max_samples")


def test_sft_datasets_keep_the_first_rows(tmp_path, tok):
    keys = {"prompt_key": "prompt", "response_key": "response", "max_length": 64}
    path = write(tmp_path, [{"prompt": f"p{i}", "response": f"r{i}"} for i in range(5)], "sft.parquet")
    single = SFTDataset(path, tok, keys, max_samples=2)
    assert single.prompts == ["p0", "p1"] and single.responses == ["r0", "r1"]
    conversations = [
        {"messages": json.dumps([{"role": "user", "content": f"u{i}"}, {"role": "assistant", "content": f"a{i}"}])}
        for i in range(5)
    ]
    conv_path = write(tmp_path, conversations, "conv.parquet")
    multi = MultiTurnSFTDataset(conv_path, tok, {"max_length": 64}, max_samples=3)
    assert [c[0]["content"] for c in multi.conversations] == ["u0", "u1", "u2"]
    # the SFT trainer's builder passes the key's value on
    built = create_sft_dataset(path, SFTDataConfig(**keys), tok, 4, "data.train_max_samples")
    assert built.prompts == ["p0", "p1", "p2", "p3"]


def test_main_ppo_reads_both_keys(tiny_model_dir, tiny_data_dir, tmp_path):
    from hybridflow.config.loader import load_config
    from hybridflow.main_ppo import build_trainer, checked_config
    from hybridflow.utils.environ import restored_environ
    from tests.trainer.e2e_helpers import base_overrides

    overrides = base_overrides(tiny_model_dir, tiny_data_dir, tmp_path, backend="inprocess")
    config = checked_config(
        load_config("ppo_trainer", overrides + ["data.train_max_samples=8", "data.val_max_samples=5"])
    )
    with restored_environ(["HYBRIDFLOW_DEVICE"]):
        trainer = build_trainer(config)
    assert len(trainer.train_dataloader.dataset) == 8 and len(trainer.val_dataset) == 5
    assert len(trainer.train_dataloader) == 8 // 4  # data.train_batch_size=4: the steps of an epoch follow
