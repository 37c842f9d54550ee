"""``hf`` rollout server: a plain transformers causal LM behind the asynchronous server interface.

Runs everywhere (CPU included). Concurrent requests are gathered into one batch and decoded together
(left-padded prefill, then one token per step with a KV cache); a batch runs to completion while the
next requests queue. The forward passes run on one executor thread so the event loop stays free to
take requests and aborts.

Sampling is per request: each request draws its noise from its own generator, seeded from the engine
seed and the request id, by Gumbel-max (argmax of logits / T + Gumbel noise is a draw from
softmax(logits / T)). So a request's tokens depend on the weights, its prompt and its id, not on which
other requests shared its batch: runs are reproducible however requests happen to be grouped.

Every sampling option is explicit (temperature, top-k, top-p; nothing from the checkpoint's
generation_config), so the rollout samples from exactly the policy the trainer scores. The returned
log-prob of a token is log softmax(logits / T) over the full vocabulary, the quantity the trainer
recomputes (top-k/top-p only restrict what can be drawn).
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Iterable

import torch

from hybridflow.workers.rollout.sampling import SamplingParams, request_seed
from hybridflow.workers.rollout.server import (
    ABORT,
    LENGTH,
    STOP,
    AsyncRolloutServer,
    ServerSpec,
    TokenOutput,
    register_rollout_server,
)
from hybridflow.workers.rollout.weights import StrictWeightLoader

logger = logging.getLogger(__name__)


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    request_id: str
    logprobs: bool
    future: asyncio.Future
    tokens: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)


def _filter_logits(scaled: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """(B, V) temperature-scaled logits with everything outside top-k / the top-p nucleus set to -inf."""
    if 0 < top_k < scaled.size(-1):
        kth = torch.topk(scaled, top_k, dim=-1).values[:, -1:]  # (B, 1)
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, descending=True, dim=-1)
        probs = sorted_logits.softmax(-1)
        # drop a token when the mass before it already reaches top_p (the top token always stays)
        drop_sorted = (probs.cumsum(-1) - probs) >= top_p
        scaled = scaled.masked_fill(drop_sorted.scatter(-1, order, drop_sorted), float("-inf"))
    return scaled


def sample_rows(logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row of (B, V) logits; returns tokens (B,) and their log-probs (B,) under
    softmax(logits / T). Greedy rows take the argmax; sampling rows a Gumbel-max draw from their own
    generator, after their top-k / top-p filter."""
    temps = torch.tensor([p.temperature if p.temperature > 0 else 1.0 for p in params], device=logits.device)
    scaled = logits / temps[:, None]  # (B, V)
    tokens = scaled.argmax(-1)
    sampled = [i for i, p in enumerate(params) if not p.greedy]
    if sampled:
        rows = torch.tensor(sampled, device=logits.device)
        noise = torch.stack([torch.rand(logits.size(-1), generator=generators[i], device=logits.device) for i in sampled])
        gumbel = -torch.log(-torch.log(noise.clamp_(min=1e-20)))  # (b, V)
        filters = {(params[i].top_k, params[i].top_p) for i in sampled}
        filtered = scaled[rows]
        if len(filters) == 1:
            filtered = _filter_logits(filtered, *filters.pop())
        else:  # rare: rows with different filters in one batch
            filtered = torch.cat([_filter_logits(filtered[j:j + 1], params[i].top_k, params[i].top_p)
                                  for j, i in enumerate(sampled)])
        tokens[rows] = (filtered + gumbel).argmax(-1)
    log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, log_probs


@register_rollout_server("hf")
class HFServer(AsyncRolloutServer):
    """``spec.module`` is the inference copy of the model (the worker loads it); config keys used:
    ``max_num_seqs`` (largest batch), ``seed``."""

    def __init__(self, spec: ServerSpec):
        if spec.module is None:
            raise ValueError("the hf rollout server needs the model module in ServerSpec.module")
        self.module = spec.module.eval()
        self.device = next(self.module.parameters()).device
        self.pad_token_id = int(spec.pad_token_id)
        self.eos_token_ids = list(spec.eos_token_ids)
        self.max_batch = int(spec.config.get("max_num_seqs") or 1024)
        self.seed = int(spec.config.get("seed") or 0)
        self.free_cache = bool(spec.config.get("free_cache_engine", False)) and self.device.type == "cuda"
        self._pending: list[_Request] = []
        self._kick: asyncio.Event | None = None
        self._scheduler: asyncio.Task | None = None
        self._abort = False
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hf-rollout")
        self._weights = StrictWeightLoader(self.module)

    # ------------------------------------------------------------------------------ requests
    async def generate(self, prompt_ids, params: SamplingParams, request_id: str, logprobs: bool = True) -> TokenOutput:
        if not prompt_ids:
            raise ValueError(f"request {request_id!r}: empty prompt")
        if self._scheduler is None or self._scheduler.done():
            self._kick = asyncio.Event()
            self._scheduler = asyncio.get_running_loop().create_task(self._schedule())
        req = _Request(list(map(int, prompt_ids)), params, request_id, logprobs, asyncio.get_running_loop().create_future())
        self._pending.append(req)
        self._kick.set()
        return await req.future

    async def abort_all(self) -> int:
        """Pending requests return at once; the running batch stops after its current step."""
        pending, self._pending = self._pending, []
        for req in pending:
            if not req.future.done():
                req.future.set_result(TokenOutput([], [] if req.logprobs else None, ABORT))
        self._abort = True
        return len(pending)

    async def _schedule(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._kick.wait()
            self._kick.clear()
            await self._settle()
            while self._pending:
                batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
                self._abort = False
                try:
                    stops = await loop.run_in_executor(self._executor, self._decode, batch)
                except BaseException as e:  # every waiting request learns why
                    for req in batch:
                        if not req.future.done():
                            req.future.set_exception(e)
                    if not isinstance(e, Exception):
                        raise
                    continue
                for req, stop in zip(batch, stops):
                    if not req.future.done():
                        req.future.set_result(TokenOutput(req.tokens, req.log_probs if req.logprobs else None, stop))

    async def _settle(self, quiet_steps: int = 3, max_wait_s: float = 0.05) -> None:
        """Requests of one batch arrive over a few ms (one per trajectory): wait until the queue stops
        growing (for ``quiet_steps`` short sleeps) so they decode together."""
        loop = asyncio.get_running_loop()
        deadline, quiet, seen = loop.time() + max_wait_s, 0, len(self._pending)
        while quiet < quiet_steps and loop.time() < deadline and len(self._pending) < self.max_batch:
            await asyncio.sleep(0.002)
            quiet = quiet + 1 if len(self._pending) == seen else 0
            seen = len(self._pending)

    # ------------------------------------------------------------------------------ decoding
    @torch.no_grad()
    def _decode(self, batch: list[_Request]) -> list[str]:
        """Decode ``batch`` to completion (executor thread); fills each request's tokens/log-probs."""
        from transformers import DynamicCache

        width = max(len(r.prompt_ids) for r in batch)
        ids = torch.full((len(batch), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for i, r in enumerate(batch):  # left padding
            ids[i, width - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
            mask[i, width - len(r.prompt_ids):] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P), as transformers' generate builds them
        generators = [torch.Generator(device=self.device).manual_seed(request_seed(self.seed, r.request_id)) for r in batch]
        stop_ids = [set(r.params.stop_token_ids if r.params.stop_token_ids is not None else self.eos_token_ids)
                    for r in batch]
        stops = [LENGTH] * len(batch)
        rows = list(range(len(batch)))  # the batch rows in the cache, in cache order (finished ones until pruned)
        live = set(rows)
        cache = DynamicCache()
        logits = self.module(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                             use_cache=True).logits[:, -1, :].float()  # (B, V)
        while live and not self._abort:
            tokens, log_probs = sample_rows(logits, [batch[i].params for i in rows], [generators[i] for i in rows])
            for i, token, logp in zip(rows, tokens.tolist(), log_probs.tolist()):
                if i not in live:
                    continue
                req = batch[i]
                req.tokens.append(token)
                if req.logprobs:
                    req.log_probs.append(logp)
                if token in stop_ids[i] and not req.params.ignore_eos:
                    stops[i] = STOP
                    live.discard(i)
                elif len(req.tokens) >= req.params.response_length:
                    live.discard(i)
            if not live:
                break
            if len(live) <= 0.75 * len(rows):  # drop finished rows from the batch and the cache
                keep = torch.tensor([j for j, i in enumerate(rows) if i in live], device=self.device)
                cache.batch_select_indices(keep)
                mask, positions, tokens = mask[keep], positions[keep], tokens[keep]
                rows = [i for i in rows if i in live]
            mask = torch.cat([mask, mask.new_ones(len(rows), 1)], dim=1)
            positions = positions[:, -1:] + 1
            logits = self.module(input_ids=tokens[:, None], attention_mask=mask, position_ids=positions,
                                 past_key_values=cache, use_cache=True).logits[:, -1, :].float()
        for i in live:  # only left when aborted
            stops[i] = ABORT
        return stops

    # ------------------------------------------------------------------------------ weights / memory
    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._weights.load, list(named_tensors))

    async def finish_weight_update(self) -> None:
        self._weights.finish()

    async def sleep(self, level: int = 1) -> None:
        if self.free_cache:  # the weights wait in host memory while the trainer has the GPU
            await asyncio.get_running_loop().run_in_executor(self._executor, self.module.to, "cpu")
            torch.cuda.empty_cache()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self.free_cache:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.module.to, self.device)

    async def shutdown(self) -> None:
        await self.abort_all()
        if self._scheduler is not None:
            self._scheduler.cancel()
        self._executor.shutdown(wait=False)
