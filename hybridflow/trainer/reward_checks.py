"""Start-up checks of the reward-model settings (part of ``validate_ppo_config``).

A generative reward model (``reward.reward_manager.name=genrm``) needs a model and an engine to serve
it; a discriminative one is scored by the FSDP worker, and veRL's engine keys
(``reward.reward_model.rollout.*``, set by veRL's reward-loop examples) do not apply to it.
"""

from __future__ import annotations

from hybridflow.config.loader import default_config
from hybridflow.rewards.registry import manager_needs_judge

RM, ROLLOUT = "reward.reward_model", "reward.reward_model.rollout"
JUDGE_ENGINES = ("hf", "vllm")


def check_reward_model(r) -> None:
    """Errors and notes into report ``r`` (a config_checks report: ``get``, ``errors``, ``notes``)."""
    manager = r.get("reward.reward_manager.name")
    enable, name = bool(r.get(f"{RM}.enable")), r.get(f"{ROLLOUT}.name")
    if not manager_needs_judge(manager):
        if enable and name is not None and r.get("reward.custom_reward_function.path"):
            r.errors.append(
                f"{RM}.enable=True with {ROLLOUT}.name={name} and reward.custom_reward_function.path: veRL's GenRM "
                f"pattern, where the function posts to the reward model's HTTP router (reward_router_address); "
                f"hybridflow serves no HTTP router. Use reward.reward_manager.name=genrm (its template and verdict "
                f"parser in reward.reward_kwargs) and no custom function"
            )
        elif enable and name is not None:
            r.notes.append(
                f"{ROLLOUT}.name={name}: {RM}.model_path is scored as a discriminative (sequence-classification) "
                f"reward model by hybridflow's FSDP worker, which does not read {ROLLOUT}.*; an engine serves a "
                f"generative reward model only (reward.reward_manager.name=genrm)"
            )
        return
    where = f"reward.reward_manager.name={manager}"
    if not enable:
        r.errors.append(
            f"{where} grades with a judge model: set {RM}.enable=True, {RM}.model_path and {ROLLOUT}.name (hf or vllm)"
        )
    if not r.get(f"{RM}.model_path"):
        r.errors.append(f"{where} needs {RM}.model_path: the judge's model (a causal LM directory)")
    if name not in JUDGE_ENGINES:
        r.errors.append(
            f"{where} needs {ROLLOUT}.name set to an engine that serves the judge: hf or vllm (got {name!r})"
        )
    if r.get("reward.custom_reward_function.path"):
        r.errors.append(f"{where} scores with the judge: reward.custom_reward_function.path must be null")
    tp = r.get(f"{ROLLOUT}.tensor_model_parallel_size") or 1
    if name == "vllm" and tp > 1:
        r.errors.append(
            f"{ROLLOUT}.tensor_model_parallel_size={tp}: the judge runs one engine in each trainer "
            "worker, which sees one device; set it to 1"
        )
    elif (
        name == "hf"
        and tp != default_config("ppo_trainer")["reward"]["reward_model"]["rollout"]["tensor_model_parallel_size"]
    ):
        r.notes.append(f"{ROLLOUT}.tensor_model_parallel_size={tp} is ignored: the hf engine does not shard")
    if str(r.get(f"{ROLLOUT}.load_format") or "").startswith("dummy"):
        r.errors.append(
            f"{ROLLOUT}.load_format={r.get(f'{ROLLOUT}.load_format')}: the judge never receives "
            "weights, so it must load its own (auto)"
        )
    if r.get(f"{ROLLOUT}.do_sample") and (r.get(f"{ROLLOUT}.temperature") or 0) <= 0:
        r.errors.append(
            f"{ROLLOUT}.do_sample=True needs {ROLLOUT}.temperature > 0; for a greedy judge set "
            f"{ROLLOUT}.do_sample=False"
        )
