"""Status of every key of configs/generation.yaml (``python -m hybridflow.main_generation``).

veRL 0.9.1 has no generation.yaml (its main_generation_server reads ppo_trainer); the keys are those
of veRL main's generation.yaml (b178a3cd, January 2026), the newest veRL that has one.
"""

from __future__ import annotations

from hybridflow.config.keys.common import rollout, targets, trainer_device
from hybridflow.config.support import KeyTable, honoured, not_supported, note

TABLE = KeyTable.build(
    "generation",
    [
        trainer_device(),
        honoured("trainer.nnodes", "trainer.n_gpus_per_node", "trainer.backend",
                 "data.path", "data.prompt_key", "data.n_samples", "data.output_path", "data.batch_size",
                 "data.apply_chat_template_kwargs.**",
                 "model.path", "model.external_lib", "model.trust_remote_code", "model.override_config.**"),
        rollout("rollout", log_probs=False, training=False),
        note("actor.**", reason="main_generation does not train (veRL keeps this section for backward compatibility)"),
        honoured("ray_kwargs.ray_init.num_cpus", "ray_kwargs.ray_init.address", "ray_kwargs.ray_init.include_dashboard"),
        not_supported("ray_kwargs.ray_init.**",
                      reason="hybridflow passes only address, num_cpus and include_dashboard to ray.init"),
        not_supported("ray_kwargs.timeline_json_file", reason="writing a Ray timeline is not implemented"),
        targets(),
    ],
    aliases=(
        ("ray_init", "ray_kwargs.ray_init"),
        ("ray_init.timeline_json_file", "ray_kwargs.timeline_json_file"),
    ),
)
