"""Status of every key of configs/evaluation.yaml (``python -m hybridflow.main_eval``)."""

from __future__ import annotations

from hybridflow.config.support import KeyTable, honoured, note

TABLE = KeyTable.build(
    "evaluation",
    [
        honoured("data.path", "data.prompt_key", "data.response_key", "data.data_source_key", "data.reward_model_key",
                 "custom_reward_function.path", "custom_reward_function.name", "custom_reward_function.reward_kwargs.**"),
        note("ray_kwargs.**", reason="main_eval scores in its own process and does not start Ray"),
    ],
    aliases=(
        ("ray_init", "ray_kwargs.ray_init"),
        ("ray_init.timeline_json_file", "ray_kwargs.timeline_json_file"),
    ),
)
