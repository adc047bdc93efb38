"""The ``hf`` rollout server: one Ray actor per replica, serving verl's token-in-token-out protocol.

What: ``HFRolloutServer`` holds a HF-transformers causal LM and a continuous-batching
``GenerationEngine`` (``engine.py``), and answers what verl calls on a rollout server:
``generate`` (``LLMServerClient``), ``abort_all_requests`` / ``resume_generation`` and the memory
controls (``RolloutReplica``, ``CheckpointEngineManager``). It also *is* the replica's
``CheckpointEngineWorker``: the checkpoint engine (e.g. ``gloo``) receives the actor's weights in
this process and ``HFServerAdapter.update_weights`` copies them into the serving model.

Why one actor for both roles (vLLM uses two: a CheckpointEngineWorker per GPU plus the server,
linked by CUDA IPC): on CPU there is no IPC handle to pass, so a second process would have to
re-send every tensor through Ray's object store. Here the received tensors are copied straight
into the parameters, and the process that computes is the one holding the rollout pool's CPU slot.

Semantics worth knowing (same contract as verl's vLLM server):
- ``abort_all_requests`` closes the admission gate and aborts what is queued or running; those
  return ``stop_reason="aborted"`` with the tokens generated so far. Requests arriving while the
  gate is closed wait for ``resume_generation`` (or are turned away as aborted with
  ``reject_request=True``). verl's ``CheckpointEngineManager`` aborts before every weight sync.
- ``engine_stats`` returns the engine's cumulative step counters (``EngineStats``: steps, rows, tokens,
  prefill tokens, busy seconds), which the trainer turns into per-step slot occupancy and busy-time
  throughput (``trainer/engine_stats.py``).
- Every output carries ``extra_fields["global_steps"]``: the weight version all of its tokens were
  generated with (None until the first sync). ``rollout_log_probs`` are ``log_softmax(logits / T)``
  of the sampled tokens, what verl's actor computes for ``old_log_probs`` at the same temperature.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator, Iterable
from typing import Any

import ray
import torch
from omegaconf import DictConfig
from transformers import AutoModelForCausalLM, PreTrainedModel
from verl.checkpoint_engine.base import CheckpointEngineWorker
from verl.utils.config import omega_conf_to_dataclass
from verl.utils.tokenizer import normalize_token_ids
from verl.utils.torch_dtypes import PrecisionType
from verl.workers.config import HFModelConfig, RolloutConfig
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import TokenOutput
from verl.workers.rollout.utils import ensure_async_iterator, get_max_position_embeddings

from recipe.one_step_off_async.rollout.hf.engine import FinishReason, GenerationEngine, SamplingParams

# What verl's agent loops send (AgentLoopWorker.generate_sequences, FullyAsyncLLMServerClient).
SUPPORTED_SAMPLING_PARAMS = frozenset(
    {"max_tokens", "max_new_tokens", "temperature", "top_p", "top_k", "logprobs", "repetition_penalty", "ignore_eos"}
)


def resolve_max_model_len(config: RolloutConfig, hf_config: Any, key: str = "actor_rollout_ref.rollout") -> int:
    """``rollout.max_model_len`` (at ``key``), defaulting to the model's context length, as verl's vLLM server does."""
    max_position_embeddings = get_max_position_embeddings(hf_config)
    if config.max_model_len is None:
        return max_position_embeddings
    if config.max_model_len > max_position_embeddings:
        raise ValueError(
            f"{key}.max_model_len={config.max_model_len} exceeds the model's "
            f"max_position_embeddings={max_position_embeddings}; lower it or leave it unset."
        )
    return config.max_model_len


def to_sampling_params(
    request: dict[str, Any],
    *,
    prompt_length: int,
    config: RolloutConfig,
    max_model_len: int,
    stop_token_ids: frozenset[int],
) -> tuple[SamplingParams, bool]:
    """Translate verl's per-request sampling dict; return (params, whether log-probs were requested).

    ``max_tokens`` defaults and clamps exactly like verl's vLLM server (response budget, then the room
    left in ``max_model_len``). Unknown or unsupported keys raise instead of being ignored.
    """
    unknown = set(request) - SUPPORTED_SAMPLING_PARAMS
    if unknown:
        raise ValueError(
            f"the hf rollout does not support sampling params {sorted(unknown)}; "
            f"it supports {sorted(SUPPORTED_SAMPLING_PARAMS)}"
        )
    repetition_penalty = request.get("repetition_penalty", config.repetition_penalty)
    if repetition_penalty != 1.0:
        raise ValueError(
            f"the hf rollout does not implement repetition_penalty={repetition_penalty}; "
            "set actor_rollout_ref.rollout.repetition_penalty=1.0"
        )
    room = max_model_len - prompt_length
    if room < 1:
        raise ValueError(
            f"prompt of {prompt_length} tokens leaves no room to generate within max_model_len={max_model_len}; "
            "shorten the prompt (data.max_prompt_length) or raise actor_rollout_ref.rollout.max_model_len"
        )
    max_tokens = request.get("max_tokens", request.get("max_new_tokens"))
    if max_tokens is None:
        max_tokens = min(config.response_length, config.prompt_length + config.response_length - prompt_length)
    ignore_eos = request.get("ignore_eos", config.ignore_eos)
    params = SamplingParams(
        max_tokens=max(1, min(int(max_tokens), room)),
        temperature=float(request.get("temperature", 1.0)),
        top_p=float(request.get("top_p", 1.0)),
        top_k=int(request.get("top_k", -1)),
        stop_token_ids=frozenset() if ignore_eos else stop_token_ids,
    )
    return params, bool(request.get("logprobs", False))


def eos_token_ids(model_config: HFModelConfig) -> frozenset[int]:
    """The model's stop tokens: its generation config's ``eos_token_id`` (int or list) and the tokenizer's."""
    ids: set[int] = set()
    generation_config = model_config.generation_config
    if generation_config is not None and generation_config.eos_token_id is not None:
        eos = generation_config.eos_token_id
        ids.update([eos] if isinstance(eos, int) else eos)
    tokenizer = model_config.tokenizer
    if tokenizer is not None and tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    return frozenset(ids)


def load_model(model_config: HFModelConfig, dtype: str) -> PreTrainedModel:
    """The HF model the actor trains (same path and config overrides), with SDPA attention, in eval mode."""
    return AutoModelForCausalLM.from_pretrained(
        model_config.local_path,
        config=model_config.hf_config,
        dtype=PrecisionType.to_dtype(dtype),
        attn_implementation="sdpa",
        trust_remote_code=model_config.trust_remote_code,
    ).eval()


class HFServerAdapter(BaseRollout):
    """The rollout side of a weight sync: ``CheckpointEngineWorker.update_weights`` hands it the stream of
    ``(name, tensor)`` its checkpoint engine receives, and it loads them into the serving engine."""

    def __init__(
        self, config: RolloutConfig, model_config: HFModelConfig, engine: GenerationEngine, replica_rank: int
    ) -> None:
        super().__init__(config, model_config, device_mesh=None)
        self.engine = engine
        self.replica_rank = replica_rank
        self.is_leader_rank = True  # one process per replica

    async def update_weights(
        self,
        weights: Iterable[tuple[str, torch.Tensor]] | AsyncIterator[tuple[str, torch.Tensor]],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
    ) -> None:
        """Load full tensors between two engine steps; sequences still running are aborted first."""
        if wire_format != "named_tensors":
            raise ValueError(
                f"the hf rollout loads full tensors only (wire_format='named_tensors'), got {wire_format!r}; "
                "use a checkpoint engine that sends full tensors, e.g. backend=gloo"
            )
        await self.engine.update_weights(ensure_async_iterator(weights), version=global_steps)

    async def resume(self, tags: list[str]) -> None:
        """Nothing to resume: on CPU the weights and KV cache never leave memory."""

    async def release(self) -> None:
        """Nothing to release: on CPU the weights and KV cache never leave memory."""


class HFRolloutServer(CheckpointEngineWorker):
    """One ``hf`` rollout replica: checkpoint-engine worker and token-in-token-out server in one actor.

    Created by ``HFReplica`` through a verl ``RayWorkerGroup`` on the rollout pool; ``launch_server``
    starts serving.
    """

    def __init__(
        self,
        rollout_config: RolloutConfig | DictConfig,
        model_config: HFModelConfig | DictConfig,
        replica_rank: int,
    ) -> None:
        config: RolloutConfig = omega_conf_to_dataclass(rollout_config)
        model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.engine = GenerationEngine(
            load_model(model_config, config.dtype),
            max_num_seqs=config.max_num_seqs,
            max_num_batched_tokens=config.max_num_batched_tokens,
            seed=config.seed + replica_rank,
        )
        super().__init__(
            rollout_config=config,
            model_config=model_config,
            server_adapter=HFServerAdapter(config, model_config, self.engine, replica_rank),
        )
        self.max_model_len = resolve_max_model_len(config, model_config.hf_config)
        self.stop_token_ids = eos_token_ids(model_config)
        # Admission gate: closed by abort_all_requests, opened by resume_generation.
        self._admission_open = asyncio.Event()
        self._admission_open.set()
        self._reject_while_closed = False
        self._generating = 0  # generate calls submitted to the engine and not returned yet

    async def launch_server(self) -> str:
        """Start the engine loop; return this server's address (a label: there is no HTTP endpoint)."""
        self.engine.start()
        return f"hf://{ray.util.get_node_ip_address()}/{ray.get_runtime_context().get_actor_id()}"

    async def generate(
        self,
        prompt_ids: list[int],
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: list[Any] | None = None,
        video_data: list[Any] | None = None,
        audio_data: list[Any] | None = None,
        mm_processor_kwargs: dict[str, Any] | None = None,
        scheduling_priority: int = 0,
    ) -> TokenOutput:
        """Generate a response to ``prompt_ids``; ``request_id`` is unused (no prefix cache to route by).

        Queued requests start lowest ``scheduling_priority`` first: the request's ``priority``, which verl's
        client forwards to vLLM only (``llm_server.py``), so the partial-rollout client sends it by this name.
        """
        if image_data is not None or video_data is not None or audio_data is not None or mm_processor_kwargs:
            raise ValueError("the hf rollout is text-only: it cannot take image, video or audio inputs")
        prompt_ids = normalize_token_ids(prompt_ids)
        params, return_log_probs = to_sampling_params(
            sampling_params,
            prompt_length=len(prompt_ids),
            config=self.rollout_config,
            max_model_len=self.max_model_len,
            stop_token_ids=self.stop_token_ids,
        )
        while not self._admission_open.is_set():
            if self._reject_while_closed:
                return TokenOutput(
                    token_ids=[], stop_reason="aborted", extra_fields={"global_steps": self.engine.weight_version}
                )
            await self._admission_open.wait()
        # No await between the gate check and submit(): an abort cannot slip in between.
        future = self.engine.submit(prompt_ids, params, priority=scheduling_priority)
        self._generating += 1
        try:
            result = await future
        finally:
            self._generating -= 1
        return TokenOutput(
            token_ids=result.token_ids,
            log_probs=result.log_probs if return_log_probs else None,
            stop_reason="aborted" if result.finish_reason is FinishReason.ABORT else "completed",
            extra_fields={"global_steps": result.weight_version},
        )

    async def abort_all_requests(self, reject_request: bool = False) -> dict[str, Any]:
        """Close admission and abort every queued or running request (they return ``stop_reason="aborted"``).

        Args:
            reject_request: turn away requests arriving before ``resume_generation`` (as aborted)
                instead of holding them.
        """
        self._reject_while_closed = reject_request
        self._admission_open.clear()
        aborted = await self.engine.abort_all()
        # Let the aborted generate calls hand back their tokens before this returns: the replica may be
        # shut down right after (a leaving elastic replica), and a reply not sent by then would be lost.
        while self._generating:
            await asyncio.sleep(0)
        return {"aborted_count": aborted}

    async def resume_generation(self) -> None:
        """Reopen admission after ``abort_all_requests``; held requests start now."""
        self._reject_while_closed = False
        self._admission_open.set()

    async def engine_stats(self) -> dict[str, float]:
        """The engine's cumulative step counters (``EngineStats``) and its slot count, for occupancy metrics."""
        return {**dataclasses.asdict(self.engine.stats), "max_num_seqs": self.engine.max_num_seqs}

    async def wake_up(self, tags: list[str] | None = None) -> None:
        """Nothing to wake: on CPU the weights and KV cache never leave memory."""

    async def sleep(self) -> None:
        """Nothing to free: on CPU the weights and KV cache never leave memory."""

    async def release_kv_cache(self) -> None:
        """Nothing to release: the KV cache lives and dies with the running sequences."""

    async def resume_kv_cache(self) -> None:
        """Nothing to restore: the KV cache lives and dies with the running sequences."""

    async def clear_kv_cache(self) -> None:
        """Nothing to clear: there is no prefix cache, so no KV entry outlives its sequence."""

    async def start_profile(self, **kwargs: Any) -> None:
        """Profiling the hf rollout is not supported; verl's profiler steps leave it alone."""

    async def stop_profile(self) -> None:
        """Profiling the hf rollout is not supported; verl's profiler steps leave it alone."""
