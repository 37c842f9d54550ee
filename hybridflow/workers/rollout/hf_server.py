"""``hf`` rollout server: a plain transformers causal LM behind the asynchronous server interface.

Runs everywhere (CPU included). Continuous batching: concurrent requests decode together (left-padded
prefill, then one token per step with a KV cache); requests that arrive while a batch runs are
prefilled and join it at the next step, and each request returns the moment it finishes. The forward
passes run on one executor thread so the event loop stays free to take requests and aborts. Requests
that arrive together with the same prompt (a GRPO group) share one prefill row; on the CPU, grouped-query
models attend without copying the KV cache's heads (``hf_attention.py``). Both give the same tokens and
log-probs; on the quickstart's 16 prompts x 8 samples they cut the rollout's CPU time by ~40%.

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
import threading
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from hybridflow.rollout.sampling import SamplingParams, request_seed
from hybridflow.rollout.server import (
    ABORT,
    LENGTH,
    STOP,
    AsyncRolloutServer,
    ServerSpec,
    TokenOutput,
    register_rollout_server,
)
from hybridflow.workers.rollout.hf_attention import restore_attention, use_grouped_sdpa
from hybridflow.workers.rollout.weights import StrictWeightLoader

logger = logging.getLogger(__name__)


@dataclass(eq=False)  # a request is itself (identity), whatever its fields
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


def sample_rows(
    logits: torch.Tensor, params: list[SamplingParams], generators: list[torch.Generator]
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
        noise = torch.stack(
            [torch.rand(logits.size(-1), generator=generators[i], device=logits.device) for i in sampled]
        )
        gumbel = -torch.log(-torch.log(noise.clamp_(min=1e-20)))  # (b, V)
        filters = {(params[i].top_k, params[i].top_p) for i in sampled}
        filtered = scaled[rows]
        if len(filters) == 1:
            filtered = _filter_logits(filtered, *filters.pop())
        else:  # rare: rows with different filters in one batch
            filtered = torch.cat(
                [_filter_logits(filtered[j : j + 1], params[i].top_k, params[i].top_p) for j, i in enumerate(sampled)]
            )
        tokens[rows] = (filtered + gumbel).argmax(-1)
    log_probs = torch.log_softmax(scaled, dim=-1).gather(-1, tokens[:, None]).squeeze(-1)
    return tokens, log_probs


@dataclass
class _Row:
    """A request being decoded: its place in the running batch and its sampling state."""

    req: _Request
    generator: torch.Generator
    stop_ids: set


def _left_pad_cache(cache, pad: int) -> None:
    """Add ``pad`` empty (masked) positions on the left of every layer of a DynamicCache."""
    if pad:
        for layer in cache.layers:
            layer.keys = torch.nn.functional.pad(layer.keys, (0, 0, pad, 0))
            layer.values = torch.nn.functional.pad(layer.values, (0, 0, pad, 0))


def _cat_caches(into, other) -> None:
    """Append ``other``'s rows to ``into`` (same length, layer by layer)."""
    for mine, theirs in zip(into.layers, other.layers):
        mine.keys = torch.cat([mine.keys, theirs.keys])
        mine.values = torch.cat([mine.values, theirs.values])


def _mergeable(cache) -> bool:
    """Continuous batching pads and concatenates caches; only plain full-attention layers allow it."""
    from transformers.cache_utils import DynamicLayer

    return all(type(layer) is DynamicLayer for layer in getattr(cache, "layers", [None]))


class _Batch:
    """The running batch: rows in cache order, the shared KV cache (left-padded), the attention mask
    and each row's next position, and the logits each row samples its next token from."""

    def __init__(self, rows, cache, mask, positions, logits):
        self.rows, self.cache, self.mask, self.positions, self.logits = rows, cache, mask, positions, logits
        self.mergeable = _mergeable(cache)

    def add(self, other: _Batch) -> None:
        """Newcomers join: both sides are left-padded to the same cache length, then concatenated."""
        width, theirs = self.mask.size(1), other.mask.size(1)
        _left_pad_cache(self.cache, theirs - width if theirs > width else 0)
        _left_pad_cache(other.cache, width - theirs if width > theirs else 0)
        pad = max(width, theirs)
        left = lambda m: torch.nn.functional.pad(m, (pad - m.size(1), 0))  # noqa: E731
        _cat_caches(self.cache, other.cache)
        self.mask = torch.cat([left(self.mask), left(other.mask)])
        self.positions = torch.cat([self.positions, other.positions])
        self.logits = torch.cat([self.logits, other.logits])
        self.rows = self.rows + other.rows

    def keep(self, keep: list[int]) -> None:
        """Drop the other rows, and the cache columns that are padding for every row left."""
        index = torch.tensor(keep, device=self.mask.device)
        self.cache.batch_select_indices(index)
        self.mask, self.positions = self.mask[index], self.positions[index]
        self.rows = [self.rows[i] for i in keep]
        first = int(self.mask.any(0).nonzero()[0]) if self.rows else 0
        if first:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask = self.mask[:, first:]


@register_rollout_server("hf")
class HFServer(AsyncRolloutServer):
    """``spec.module`` is the inference copy of the model (the worker loads it); rollout fields used:
    ``max_num_seqs`` (largest batch; 1 under ``full_determinism``), ``seed``, ``free_cache_engine``.

    Continuous batching: one decode loop (on the executor thread) runs while there is work. Before each
    step it takes the requests that arrived (prefilled together, then joined to the running batch), and
    a request returns as soon as it finishes, so short requests never wait for long ones and a new
    turn of a multi-turn trajectory joins at once. A weight update lets the running rows finish and
    holds new requests until it is done (the callers drain or abort first anyway)."""

    needs_module = True  # the worker's transformers copy of the model (ServerSpec.module)

    def __init__(self, spec: ServerSpec):
        if spec.module is None:
            raise ValueError("the hf rollout server needs the model module in ServerSpec.module")
        self.module = spec.module.eval()
        self.device = next(self.module.parameters()).device
        # on the CPU, grouped-query attention without copying the KV cache's heads at every token
        # (hf_attention.py; same results); shutdown() puts the module's own attention back
        self._attention_before = use_grouped_sdpa(self.module)
        self.pad_token_id = int(spec.pad_token_id)
        self.eos_token_ids = list(spec.eos_token_ids)
        # full_determinism: one sequence at a time, so no row's numbers depend on the rows beside it
        self.max_batch = 1 if spec.config.full_determinism else int(spec.config.max_num_seqs)
        self.seed = int(spec.config.seed)
        self.free_cache = bool(spec.config.free_cache_engine) and self.device.type == "cuda"
        self._lock = threading.Lock()  # guards the fields below, shared by the event loop and the decode loop
        self._pending: list[_Request] = []
        self._aborts = 0  # abort_all calls so far: rows admitted before the latest one stop
        self._updating = False  # a weight update is under way: admit nothing
        self._driving = False  # a driver task runs the decode loop
        self._running: list[_Request] = []  # admitted by the decode loop, not finished (errors reach them)
        self._executor = ThreadPoolExecutor(1, thread_name_prefix="hf-rollout")
        self._weights = StrictWeightLoader(self.module)

    # ------------------------------------------------------------------------------ requests
    async def generate(self, prompt_ids, params: SamplingParams, request_id: str, logprobs: bool = True) -> TokenOutput:
        if not prompt_ids:
            raise ValueError(f"request {request_id!r}: empty prompt")
        loop = asyncio.get_running_loop()
        req = _Request(list(map(int, prompt_ids)), params, request_id, logprobs, loop.create_future())
        with self._lock:
            self._pending.append(req)
        self._drive_if_idle()
        return await req.future

    async def abort_all(self) -> int:
        """Pending requests return at once; running ones stop after the current step, with their tokens."""
        with self._lock:
            pending, self._pending = self._pending, []
            self._aborts += 1
        for req in pending:
            _resolve(req, ABORT)
        return len(pending)

    def _drive_if_idle(self) -> None:
        with self._lock:
            start = not self._driving and not self._updating and bool(self._pending)
            self._driving = self._driving or start
        if start:
            asyncio.get_running_loop().create_task(self._drive())

    async def _drive(self) -> None:
        """Run the decode loop until no work is left (or a weight update waits)."""
        loop = asyncio.get_running_loop()
        while True:
            try:
                await loop.run_in_executor(self._executor, self._decode_loop, loop)
            except BaseException as e:  # every request the failed loop held learns why
                with self._lock:
                    failed, self._running = self._running, []
                for req in failed:
                    if not req.future.done():
                        req.future.set_exception(e)
                if not isinstance(e, Exception):
                    with self._lock:
                        self._driving = False
                    raise
            with self._lock:
                if not self._pending or self._updating:
                    self._driving = False
                    return

    def _settle(self, quiet_steps: int = 3, max_wait_s: float = 0.05) -> None:
        """The requests of one call arrive over a few ms (one per trajectory): before starting from
        idle, wait until the queue stops growing (``quiet_steps`` short sleeps) so they prefill together."""
        deadline, quiet, seen = time.monotonic() + max_wait_s, 0, len(self._pending)
        while quiet < quiet_steps and time.monotonic() < deadline and seen < self.max_batch:
            time.sleep(0.002)
            quiet = quiet + 1 if len(self._pending) == seen else 0
            seen = len(self._pending)

    # ------------------------------------------------------------------------------ decoding
    @torch.no_grad()
    def _decode_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        """Decode until nothing runs and nothing waits (executor thread). Finished requests are
        resolved on the event loop as they finish."""
        self._settle()
        batch: _Batch | None = None
        aborts = self._aborts
        while True:
            with self._lock:
                if self._aborts != aborts and batch is not None:  # abort_all since these rows started
                    for row in batch.rows:
                        loop.call_soon_threadsafe(_resolve, row.req, ABORT)
                    self._running, batch = [], None
                aborts = self._aborts
                room = self.max_batch - (len(batch.rows) if batch else 0)
                if self._updating or room <= 0 or (batch is not None and not batch.mergeable):
                    new = []
                else:
                    new, self._pending = self._pending[:room], self._pending[room:]
                self._running.extend(new)
                if batch is None and not new:
                    return
            if new:
                try:
                    fresh = self._prefill(new)
                except Exception as e:  # e.g. a token id outside the vocabulary: only these requests fail
                    self._fail(loop, new, e)
                    fresh = None
                if fresh is not None and batch is None:
                    batch = fresh
                elif fresh is not None:
                    batch.add(fresh)
                if batch is None:
                    continue
            tokens, log_probs = sample_rows(
                batch.logits, [r.req.params for r in batch.rows], [r.generator for r in batch.rows]
            )
            keep = []
            for j, (row, token, logp) in enumerate(zip(batch.rows, tokens.tolist(), log_probs.tolist())):
                req = row.req
                req.tokens.append(token)
                if req.logprobs:
                    req.log_probs.append(logp)
                if token in row.stop_ids and not req.params.ignore_eos:
                    self._finish(loop, req, STOP)
                elif len(req.tokens) >= req.params.response_length:
                    self._finish(loop, req, LENGTH)
                else:
                    keep.append(j)
            if not keep:
                batch = None
                continue
            if len(keep) < len(batch.rows):
                tokens = tokens[torch.tensor(keep, device=tokens.device)]
                batch.keep(keep)
            batch.mask = torch.cat([batch.mask, batch.mask.new_ones(len(batch.rows), 1)], dim=1)
            batch.logits = (
                self.module(
                    input_ids=tokens[:, None],
                    attention_mask=batch.mask,
                    position_ids=batch.positions,
                    past_key_values=batch.cache,
                    use_cache=True,
                )
                .logits[:, -1, :]
                .float()
            )
            batch.positions = batch.positions + 1

    def _prefill(self, requests: list[_Request]) -> _Batch:
        """The prompts of ``requests``, left-padded into one forward pass: a batch of their own.

        Requests with the same prompt (a GRPO group's n samples arrive together) share one row of the
        forward pass; its KV cache and last logits are then copied to each of them (16 prompts x 8
        samples: 16 rows prefilled instead of 128)."""
        from transformers import DynamicCache

        row_of: dict[tuple[int, ...], int] = {}
        source = [row_of.setdefault(tuple(r.prompt_ids), len(row_of)) for r in requests]
        prompts = list(row_of)  # distinct prompts, in order of first appearance
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_token_id, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)  # (B, P), as transformers' generate builds them
        cache = DynamicCache()
        logits = (
            self.module(
                input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache, use_cache=True
            )
            .logits[:, -1, :]
            .float()
        )  # (B, V)
        if len(prompts) < len(requests):  # one row per request again (copies: rows diverge from here)
            index = torch.tensor(source, device=self.device)
            cache.batch_select_indices(index)
            logits, mask, positions = logits[index], mask[index], positions[index]
        rows = [
            _Row(
                r,
                torch.Generator(device=self.device).manual_seed(request_seed(self.seed, r.request_id)),
                set(r.params.stop_token_ids if r.params.stop_token_ids is not None else self.eos_token_ids),
            )
            for r in requests
        ]
        return _Batch(rows, cache, mask, positions[:, -1:] + 1, logits)

    def _fail(self, loop: asyncio.AbstractEventLoop, requests: list[_Request], error: Exception) -> None:
        with self._lock:
            self._running = [r for r in self._running if all(r is not bad for bad in requests)]
        for req in requests:
            loop.call_soon_threadsafe(_fail, req, error)

    def _finish(self, loop: asyncio.AbstractEventLoop, req: _Request, stop: str) -> None:
        with self._lock:
            self._running.remove(req)
        loop.call_soon_threadsafe(_resolve, req, stop)

    # ------------------------------------------------------------------------------ weights / memory
    async def score(self, sequences: list[list[int]], topk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._score, sequences, topk)

    @torch.no_grad()
    def _score(self, sequences: list[list[int]], topk: int, chunk: int = 16) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Right-padded forwards of ``chunk`` sequences at a time (executor thread)."""
        out = []
        for start in range(0, len(sequences), chunk):
            rows = sequences[start : start + chunk]
            ids = torch.zeros(len(rows), max(map(len, rows)), dtype=torch.long, device=self.device)
            mask = torch.zeros_like(ids)
            for i, row in enumerate(rows):
                ids[i, : len(row)] = torch.tensor(row, device=self.device)
                mask[i, : len(row)] = 1
            logits = self.module(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1]
            log_probs = logits.float().log_softmax(-1)
            if topk > 0:
                values, top = log_probs.topk(topk, dim=-1)
            else:
                top = ids[:, 1:, None]
                values = log_probs.gather(-1, top)
            out += [(top[i, : len(r) - 1].cpu(), values[i, : len(r) - 1].cpu()) for i, r in enumerate(rows)]
        return out

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        with self._lock:  # the decode loop admits nothing until finish_weight_update
            self._updating = True
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._weights.load, list(named_tensors))

    async def finish_weight_update(self) -> None:
        self._weights.finish()
        with self._lock:
            self._updating = False
        self._drive_if_idle()  # requests that arrived during the update

    async def sleep(self, level: int = 1) -> None:
        if self.free_cache:  # the weights wait in host memory while the trainer has the GPU
            await asyncio.get_running_loop().run_in_executor(self._executor, self.module.to, "cpu")
            torch.cuda.empty_cache()

    async def wake_up(self, tags: list[str] | None = None) -> None:
        if self.free_cache:
            await asyncio.get_running_loop().run_in_executor(self._executor, self.module.to, self.device)

    async def shutdown(self) -> None:
        await self.abort_all()
        self._executor.shutdown(wait=False)
        restore_attention(self.module, self._attention_before)
        self._attention_before = None


def _fail(req: _Request, error: BaseException) -> None:
    if not req.future.done():
        req.future.set_exception(error)


def _resolve(req: _Request, stop: str) -> None:
    """Give ``req`` its result (on the event loop); a request already answered is left alone."""
    if not req.future.done():
        req.future.set_result(TokenOutput(req.tokens, req.log_probs if req.logprobs else None, stop))
