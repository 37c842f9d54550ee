"""veRL 0.9's ``gdpo`` reward manager (``reward.reward_manager.name=gdpo``, its GDPO example): the naive
manager's call of the reward function, with the run's ``trainer.experiment_name`` in ``extra_info`` (veRL's
rlla scorer picks the chat format to parse from it) and none of the agent loop's turn fields.

A dict result keeps every key as an extra column (the per-component rewards ``algorithm.gdpo_reward_keys``
names, normalised one by one by ``adv_estimator=gdpo``); a number is also logged as ``acc``."""

from __future__ import annotations

import inspect

from hybridflow.rewards.loop_manager import RewardManagerBase
from hybridflow.rewards.scorers import default_compute_score


class GDPORewardManager(RewardManagerBase):
    """``config``: the run's config (its ``trainer.experiment_name`` is read); scored one row at a time."""

    def __init__(self, config, tokenizer, compute_score=None, reward_router_address=None, reward_model_tokenizer=None):
        super().__init__(config, tokenizer, compute_score)
        self.compute_score = compute_score or default_compute_score
        # the run's config as veRL hands it to reward-loop managers (a DictConfig); without a trainer section: ""
        self.experiment_name = str(getattr(getattr(config, "trainer", None), "experiment_name", "") or "")

    async def run_single(self, data) -> dict:
        row = data[-1:]  # a multi-sequence sample is scored on its last sequence, as veRL does
        item = row[0]
        responses = item.batch["responses"]
        length = int(item.batch["attention_mask"][-responses.shape[-1] :].sum())
        text = self.tokenizer.decode(responses[:length], skip_special_tokens=True)
        extra_info = dict(item.non_tensor_batch.get("extra_info") or {})
        extra_info["experiment_name"] = self.experiment_name
        kwargs = {
            "data_source": item.non_tensor_batch["data_source"],
            "solution_str": text,
            "ground_truth": item.non_tensor_batch["reward_model"]["ground_truth"],
            "extra_info": extra_info,
        }
        if inspect.iscoroutinefunction(self.compute_score):
            result = await self.compute_score(**kwargs)
        else:
            result = await self.loop.run_in_executor(None, lambda: self.compute_score(**kwargs))
        if isinstance(result, dict):
            return {"reward_score": result["score"], "reward_extra_info": dict(result)}
        return {"reward_score": result, "reward_extra_info": {"acc": result}}
