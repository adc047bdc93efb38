"""Continuous-batching text generation for a HF-transformers causal LM, with exact log-probs.

What: ``GenerationEngine`` serves many concurrent ``submit()`` calls from one model. Every engine
step runs one decode forward for all running sequences (one KV cache, rows left-padded to a common
length) and one prefill forward for the requests admitted at that step (lowest ``priority`` first),
whose rows then join the running batch; finished rows leave it after the step. So admission is per
step (continuous batching), not per batch. Each sampled token comes with its log-prob under the model's full
distribution at the request's temperature, ``log_softmax(logits / T)`` in fp32 from the same
forward (greedy, ``T = 0``, reports ``T = 1``): what verl's actor computes for ``old_log_probs``
(``logits / temperature``, then ``log_softmax``). Top-k / top-p truncate the sampling only; they are
not folded into the reported log-prob, which the actor could not reproduce.

Why: verl 0.9.1 rolls out only through server replicas; on machines without accelerators the
``hf`` replica (``replica.py``) serves through this engine. One request at a time would make CPU
rollouts crawl; one ``model.generate()`` per batch would make every request wait for the slowest.

How: create it in an asyncio program, ``start()`` it, ``await engine.submit(...)`` from any number of
coroutines. Forwards run on one worker thread so the event loop keeps admitting requests and
serving control calls. ``abort_all()`` and ``update_weights()`` act between two steps: aborted
sequences return the tokens generated so far with ``FinishReason.ABORT``; a weight update aborts
the sequences still running, so no sequence ever mixes two weight versions, and every result
carries the version (``weight_version``) all of its tokens were generated with.
"""

from __future__ import annotations

import asyncio
import enum
import heapq
import itertools
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from transformers import PreTrainedModel
from transformers.cache_utils import Cache, DynamicLayer


class FinishReason(enum.Enum):
    STOP = "stop"  # sampled a stop token (it is the last returned token)
    LENGTH = "length"  # reached max_tokens
    ABORT = "abort"  # aborted by abort_all() or by a weight update


@dataclass(frozen=True)
class SamplingParams:
    """How one request samples. ``temperature == 0`` is greedy; ``top_k <= 0`` and ``top_p == 1`` are off."""

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    stop_token_ids: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0 (0 is greedy), got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass(frozen=True)
class GenerationResult:
    token_ids: list[int]
    log_probs: list[float]
    finish_reason: FinishReason
    weight_version: int | None
    """Version of the weights that generated every token (None: weights loaded at start-up, never synced)."""


@dataclass
class EngineStats:
    """Cumulative counters of the step loop; a reader takes differences between two snapshots.

    Slot occupancy over a window is ``rows / steps / max_num_seqs`` (the mean share of the engine's sequence
    slots that sampled a token per step, independent of hardware); throughput while busy is
    ``tokens / busy_s`` (time with no work to do is not counted).
    """

    steps: int = 0
    rows: int = 0  # sequences that sampled a token, summed over steps
    tokens: int = 0  # tokens sampled (one per row and step)
    prefill_tokens: int = 0  # prompt tokens prefilled (a resumed request's prefix counts again)
    busy_s: float = 0.0  # seconds spent in engine steps


@dataclass(eq=False)
class _Sequence:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future
    token_ids: list[int] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    weight_version: int | None = None
    finish_reason: FinishReason | None = None

    def append(self, token_id: int, log_prob: float) -> None:
        self.token_ids.append(token_id)
        self.log_probs.append(log_prob)
        if token_id in self.params.stop_token_ids:
            self.finish_reason = FinishReason.STOP
        elif len(self.token_ids) >= self.params.max_tokens:
            self.finish_reason = FinishReason.LENGTH

    def resolve(self, finish_reason: FinishReason) -> None:
        # A caller that was cancelled (its Ray task cancelled) no longer waits for the result.
        if not self.future.done():
            self.future.set_result(
                GenerationResult(list(self.token_ids), list(self.log_probs), finish_reason, self.weight_version)
            )


def sample_next_tokens(
    logits: torch.Tensor, params: Sequence[SamplingParams], generator: torch.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample one token per row of ``logits`` [B, V]; return (token ids [B], their log-probs [B]).

    The log-prob is ``log_softmax(logits / T)`` of the sampled token in fp32 (``T = 1`` for greedy
    rows): the model's distribution at the sampling temperature, not the top-k/top-p truncated one.
    """
    logits = logits.float()
    temperature = torch.tensor([p.temperature for p in params], dtype=torch.float32)
    greedy = temperature == 0
    scaled = logits / torch.where(greedy, torch.ones_like(temperature), temperature).unsqueeze(-1)
    log_probs = torch.log_softmax(scaled, dim=-1)

    tokens = logits.argmax(dim=-1)
    sampled_rows = (~greedy).nonzero().squeeze(-1)
    if sampled_rows.numel() > 0:
        rows = sampled_rows.tolist()
        tokens[sampled_rows] = _sample_top_k_top_p(
            scaled[sampled_rows],
            top_k=[params[i].top_k for i in rows],
            top_p=[params[i].top_p for i in rows],
            generator=generator,
        )
    return tokens, log_probs.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def _sample_top_k_top_p(
    scaled_logits: torch.Tensor, top_k: list[int], top_p: list[float], generator: torch.Generator
) -> torch.Tensor:
    """Multinomial sampling after top-k, then top-p (on the top-k renormalised probabilities), per row."""
    vocab_size = scaled_logits.shape[-1]
    k = torch.tensor([vocab_size if kk <= 0 else min(kk, vocab_size) for kk in top_k])
    p = torch.tensor(top_p, dtype=torch.float32)
    if bool((k == vocab_size).all()) and bool((p == 1).all()):
        probs = torch.softmax(scaled_logits, dim=-1)
        return torch.multinomial(probs, 1, generator=generator).squeeze(-1)

    sorted_logits, sorted_ids = scaled_logits.sort(dim=-1, descending=True)
    rank = torch.arange(vocab_size).unsqueeze(0)
    sorted_logits = sorted_logits.masked_fill(rank >= k.unsqueeze(-1), float("-inf"))
    sorted_probs = torch.softmax(sorted_logits, dim=-1)
    # Drop a token once the tokens ranked above it already reach top_p; the first one always stays.
    mass_above = sorted_probs.cumsum(dim=-1) - sorted_probs
    sorted_logits = sorted_logits.masked_fill(mass_above >= p.unsqueeze(-1), float("-inf"))
    choice = torch.multinomial(torch.softmax(sorted_logits, dim=-1), 1, generator=generator)
    return sorted_ids.gather(-1, choice).squeeze(-1)


KV_CACHE_HEADROOM = 64  # spare columns of a new KV buffer, before it doubles


class _GrowingLayer(DynamicLayer):
    """One attention layer's KV cache, written in place into a buffer with room to grow.

    transformers' ``DynamicLayer`` concatenates each step's keys and values onto the cache, a copy of
    the whole cache per decode step (about 40% of a 16-row step at 400 tokens of context); this layer
    writes them into spare columns and doubles the buffer when it is full. ``keys`` and ``values`` are
    views of the filled columns, so the model reads exactly what ``DynamicLayer`` would hold.
    """

    @classmethod
    def holding(cls, keys: torch.Tensor, values: torch.Tensor) -> _GrowingLayer:
        layer = cls()
        layer.update(keys, values)
        return layer

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        self._key_buffer = key_states.new_empty(*key_states.shape[:2], 0, key_states.shape[3])
        self._value_buffer = value_states.new_empty(*value_states.shape[:2], 0, value_states.shape[3])
        self.keys, self.values = self._key_buffer, self._value_buffer
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start = self.keys.shape[-2]
        end = start + key_states.shape[-2]
        if end > self._key_buffer.shape[-2]:
            capacity = max(2 * self._key_buffer.shape[-2], end + KV_CACHE_HEADROOM)
            self._key_buffer = _with_columns(self.keys, capacity)
            self._value_buffer = _with_columns(self.values, capacity)
        self._key_buffer[..., start:end, :] = key_states
        self._value_buffer[..., start:end, :] = value_states
        self.keys = self._key_buffer[..., :end, :]
        self.values = self._value_buffer[..., :end, :]
        return self.keys, self.values


def _with_columns(filled: torch.Tensor, capacity: int) -> torch.Tensor:
    """A [B, H, capacity, D] buffer starting with ``filled`` [B, H, L, D]."""
    buffer = filled.new_empty(*filled.shape[:2], capacity, filled.shape[3])
    buffer[..., : filled.shape[-2], :] = filled
    return buffer


def _kv_cache(layers: Sequence[tuple[torch.Tensor, torch.Tensor]] = ()) -> Cache:
    """A KV cache of ``_GrowingLayer`` s holding ``layers`` ((keys, values) per layer), or empty."""
    if not layers:
        return Cache(layer_class_to_replicate=_GrowingLayer)
    return Cache(layers=[_GrowingLayer.holding(keys, values) for keys, values in layers])


class _WaitingQueue:
    """Queued requests, admitted lowest ``priority`` first and first come, first served within one.

    vLLM's ``scheduling_policy=priority`` order: partial rollout gives each request its batch's step,
    so after a sync the oldest batch's resumed requests are admitted before a newer batch's.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[int, int, _Sequence]] = []
        self._arrivals = itertools.count()

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, seq: _Sequence, priority: int) -> None:
        heapq.heappush(self._heap, (priority, next(self._arrivals), seq))

    def peek(self) -> _Sequence:
        return self._heap[0][2]

    def pop(self) -> _Sequence:
        return heapq.heappop(self._heap)[2]

    def drain(self) -> list[_Sequence]:
        """Remove and return every queued request."""
        seqs = [seq for _, _, seq in self._heap]
        self._heap.clear()
        return seqs

    def __iter__(self) -> Iterator[_Sequence]:
        return (seq for _, _, seq in self._heap)


class _Batch:
    """Running sequences sharing one KV cache; row i of every tensor belongs to ``seqs[i]``.

    Rows are left-padded to the cache length; ``attention_mask`` marks real tokens. Position ids
    count real tokens only, exactly as verl's actor numbers them, so padding changes nothing but
    the summation order inside attention.
    """

    def __init__(self, seqs: list[_Sequence], cache: Cache, attention_mask: torch.Tensor) -> None:
        self.seqs = seqs
        self.cache = cache
        self.attention_mask = attention_mask
        # Each row's last sampled token: the input of the next decode forward.
        self.next_input_ids = torch.zeros(len(seqs), dtype=torch.long)

    @classmethod
    def prefill(cls, model: PreTrainedModel, seqs: list[_Sequence]) -> tuple[_Batch, torch.Tensor]:
        """Run the prompts of ``seqs`` as one left-padded batch; return it and its next-token logits."""
        width = max(len(s.prompt_ids) for s in seqs)
        input_ids = torch.zeros(len(seqs), width, dtype=torch.long)
        attention_mask = torch.zeros(len(seqs), width, dtype=torch.long)
        for row, seq in enumerate(seqs):
            input_ids[row, width - len(seq.prompt_ids) :] = torch.tensor(seq.prompt_ids)
            attention_mask[row, width - len(seq.prompt_ids) :] = 1
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=_kv_cache(),
            use_cache=True,
            logits_to_keep=1,
        )
        return cls(seqs, out.past_key_values, attention_mask), out.logits[:, -1]

    def decode(self, model: PreTrainedModel) -> torch.Tensor:
        """Feed every row its last sampled token; return the next-token logits [B, V]."""
        position_ids = self.attention_mask.sum(-1, keepdim=True)
        self.attention_mask = F.pad(self.attention_mask, (0, 1), value=1)
        out = model(
            input_ids=self.next_input_ids.unsqueeze(-1),
            attention_mask=self.attention_mask,
            position_ids=position_ids,
            past_key_values=self.cache,
            use_cache=True,
        )
        self.cache = out.past_key_values
        return out.logits[:, -1]

    def record(self, tokens: torch.Tensor, log_probs: torch.Tensor) -> None:
        for seq, token, log_prob in zip(self.seqs, tokens.tolist(), log_probs.tolist(), strict=True):
            seq.append(token, log_prob)
        self.next_input_ids = tokens

    def drop_finished(self) -> tuple[_Batch | None, list[_Sequence]]:
        """Return (this batch without its finished rows or None if all finished, the finished sequences)."""
        finished = [s for s in self.seqs if s.finish_reason is not None]
        if not finished:
            return self, []
        keep = [row for row, s in enumerate(self.seqs) if s.finish_reason is None]
        if not keep:
            return None, finished
        rows = torch.tensor(keep)
        mask = self.attention_mask[rows]
        # Columns that are padding in every remaining row are dead weight: cut them off.
        lead = int(mask.any(dim=0).int().argmax())
        kept = _Batch(
            [self.seqs[row] for row in keep],
            _kv_cache([(layer.keys[rows, :, lead:], layer.values[rows, :, lead:]) for layer in self.cache.layers]),
            mask[:, lead:],
        )
        kept.next_input_ids = self.next_input_ids[rows]
        return kept, finished

    def merge(self, other: _Batch) -> _Batch:
        """One batch holding the rows of both, left-padding the shorter cache."""
        length = max(self.attention_mask.shape[1], other.attention_mask.shape[1])

        def pad(t: torch.Tensor, seq_dim: int) -> torch.Tensor:
            missing = length - t.shape[seq_dim]
            return t if missing == 0 else F.pad(t, (0, 0) * (t.dim() - 1 - seq_dim) + (missing, 0))

        layers = [
            (torch.cat([pad(a.keys, 2), pad(b.keys, 2)]), torch.cat([pad(a.values, 2), pad(b.values, 2)]))
            for a, b in zip(self.cache.layers, other.cache.layers, strict=True)
        ]
        merged = _Batch(
            self.seqs + other.seqs,
            _kv_cache(layers),
            torch.cat([pad(self.attention_mask, 1), pad(other.attention_mask, 1)]),
        )
        merged.next_input_ids = torch.cat([self.next_input_ids, other.next_input_ids])
        return merged


def check_supported_model(model: PreTrainedModel) -> None:
    """Raise unless ``model`` is a decoder whose layers all attend to the full context.

    The engine left-pads one shared full-attention KV cache; sliding-window or linear-attention layers
    keep a different cache layout that this padding would corrupt.
    """
    layer_types = getattr(model.config.get_text_config(decoder=True), "layer_types", None) or []
    unsupported = sorted(set(layer_types) - {"full_attention"})
    if unsupported:
        raise ValueError(
            f"the hf rollout supports full-attention decoder layers only; {type(model).__name__} has "
            f"layer types {unsupported}. Use rollout.name=vllm for this model."
        )


class GenerationEngine:
    """Continuous batching over one HF causal LM; see the module docstring.

    Args:
        model: the causal LM, in eval mode, on CPU.
        max_num_seqs: most sequences decoded together.
        max_num_batched_tokens: most (padded) prompt tokens prefilled in one step; one prompt
            is always admitted even if longer.
        seed: seed of the sampling generator.
    """

    def __init__(self, model: PreTrainedModel, *, max_num_seqs: int, max_num_batched_tokens: int, seed: int) -> None:
        check_supported_model(model)
        if max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {max_num_seqs}")
        self.model = model
        self.vocab_size = model.get_input_embeddings().num_embeddings
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.weight_version: int | None = None
        self._generator = torch.Generator().manual_seed(seed)
        self._waiting = _WaitingQueue()
        self._batch: _Batch | None = None
        # Held for a whole step; abort_all() and update_weights() take it, so they act between steps.
        self._step_lock = asyncio.Lock()
        self._work = asyncio.Event()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf-engine")
        self._loop_task: asyncio.Task | None = None
        # Set when a weight update failed midway: the model then holds a mix of two versions.
        self._failed_update: BaseException | None = None
        self.stats = EngineStats()

    def start(self) -> None:
        """Start the step loop on the running event loop."""
        if self._loop_task is not None:
            raise RuntimeError("GenerationEngine.start() called twice")
        self._loop_task = asyncio.get_running_loop().create_task(self._run(), name="hf-engine-loop")
        self._loop_task.add_done_callback(self._fail_pending_if_crashed)

    async def shutdown(self) -> None:
        """Abort what is in flight and stop the step loop."""
        await self.abort_all()
        if self._loop_task is not None:
            self._loop_task.cancel()
            await asyncio.gather(self._loop_task, return_exceptions=True)
        self._executor.shutdown(wait=True)

    @property
    def num_running(self) -> int:
        return 0 if self._batch is None else len(self._batch.seqs)

    def submit(
        self, prompt_ids: list[int], params: SamplingParams, priority: int = 0
    ) -> asyncio.Future[GenerationResult]:
        """Queue one request; the future resolves when it finishes or is aborted.

        Queued requests are admitted lowest ``priority`` first, in arrival order within a priority.
        """
        if self._loop_task is None or self._loop_task.done():
            raise RuntimeError("the generation engine is not running: call start() in the serving event loop first")
        if not prompt_ids:
            raise ValueError("cannot generate from an empty prompt")
        if min(prompt_ids) < 0 or max(prompt_ids) >= self.vocab_size:
            raise ValueError(
                f"prompt token ids must lie in [0, {self.vocab_size}), the model's vocabulary; got "
                f"[{min(prompt_ids)}, {max(prompt_ids)}]. Do the tokenizer and the model belong together?"
            )
        if self._failed_update is not None:
            raise RuntimeError(
                "the last weight update failed midway, so the model mixes two weight versions; "
                "a successful weight sync must come first"
            ) from self._failed_update
        seq = _Sequence(list(prompt_ids), params, asyncio.get_running_loop().create_future())
        self._waiting.push(seq, priority)
        self._work.set()
        return seq.future

    async def abort_all(self) -> int:
        """Abort every queued and running request between two steps; return how many were aborted."""
        async with self._step_lock:
            aborted = self._waiting.drain() + ([] if self._batch is None else self._batch.seqs)
            self._batch = None
            for seq in aborted:
                seq.resolve(FinishReason.ABORT)
            return len(aborted)

    async def update_weights(self, weights: AsyncIterator[tuple[str, torch.Tensor]], version: int) -> int:
        """Load full named tensors into the model between two steps; return how many were loaded.

        Running sequences are aborted first (queued ones start afterwards on the new weights), so
        no sequence ever mixes weight versions. Every parameter must be covered; an unknown name
        or a parameter left out raises, since either would leave the rollout silently stale. After
        a failed update the engine refuses new requests until an update succeeds.
        """
        if version is None:
            raise ValueError(
                "a weight update must carry its version (the trainer's global_steps): every output reports "
                "the version it was generated with, and None means the start-up weights"
            )
        async with self._step_lock:
            if self._batch is not None:
                for seq in self._batch.seqs:
                    seq.resolve(FinishReason.ABORT)
                self._batch = None
            try:
                loaded = await _load_named_tensors(self.model, weights)
            except BaseException as error:
                self._failed_update = error
                for seq in self._waiting.drain():  # queued requests must not start on the mixed weights
                    if not seq.future.done():
                        seq.future.set_exception(error)
                raise
            self._failed_update = None
            self.weight_version = version
            return loaded

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            await self._work.wait()
            async with self._step_lock:
                if not self._waiting and self._batch is None:
                    self._work.clear()
                    continue
                admitted = self._admit()
                in_step = admitted + ([] if self._batch is None else self._batch.seqs)
                started = time.perf_counter()
                try:
                    finished = await loop.run_in_executor(self._executor, self._step, admitted)
                except Exception as error:
                    # Every request of the failed step gets the error; the engine stays up for the next.
                    self._batch = None
                    for seq in in_step:
                        if not seq.future.done():
                            seq.future.set_exception(error)
                    continue
                self._count_step(in_step, admitted, time.perf_counter() - started)
                for seq in finished:
                    seq.resolve(seq.finish_reason)

    def _count_step(self, in_step: list[_Sequence], admitted: list[_Sequence], seconds: float) -> None:
        self.stats.steps += 1
        self.stats.rows += len(in_step)
        self.stats.tokens += len(in_step)
        self.stats.prefill_tokens += sum(len(seq.prompt_ids) for seq in admitted)
        self.stats.busy_s += seconds

    def _fail_pending_if_crashed(self, task: asyncio.Task) -> None:
        if task.cancelled() or task.exception() is None:
            return
        error = RuntimeError("the hf generation engine loop crashed; see the cause")
        error.__cause__ = task.exception()
        pending = list(self._waiting) + ([] if self._batch is None else self._batch.seqs)
        for seq in pending:
            if not seq.future.done():
                seq.future.set_exception(error)

    def _admit(self) -> list[_Sequence]:
        admitted: list[_Sequence] = []
        width = 0
        while self._waiting and self.num_running + len(admitted) < self.max_num_seqs:
            seq = self._waiting.peek()
            if seq.future.done():  # cancelled while queued
                self._waiting.pop()
                continue
            new_width = max(width, len(seq.prompt_ids))
            if admitted and new_width * (len(admitted) + 1) > self.max_num_batched_tokens:
                break
            width = new_width
            seq.weight_version = self.weight_version
            admitted.append(self._waiting.pop())
        return admitted

    def _step(self, admitted: list[_Sequence]) -> list[_Sequence]:
        """One engine step on the worker thread: decode the running rows, prefill the admitted ones."""
        finished: list[_Sequence] = []
        with torch.inference_mode():
            if self._batch is not None:
                logits = self._batch.decode(self.model)
                self._batch.record(*sample_next_tokens(logits, [s.params for s in self._batch.seqs], self._generator))
                self._batch, done = self._batch.drop_finished()
                finished += done
            if admitted:
                new_batch, logits = _Batch.prefill(self.model, admitted)
                new_batch.record(*sample_next_tokens(logits, [s.params for s in admitted], self._generator))
                new_batch, done = new_batch.drop_finished()
                finished += done
                if new_batch is not None:
                    self._batch = new_batch if self._batch is None else self._batch.merge(new_batch)
        return finished


async def _load_named_tensors(model: PreTrainedModel, weights: AsyncIterator[tuple[str, torch.Tensor]]) -> int:
    targets = model.state_dict(keep_vars=True)
    params = {id(p): name for name, p in model.named_parameters()}  # tied weights appear once
    covered: set[int] = set()
    loaded = 0
    with torch.no_grad():
        async for name, tensor in weights:
            target = targets.get(name)
            if target is None:
                raise ValueError(
                    f"weight sync sent {name!r}, which the rollout model {type(model).__name__} does not have; "
                    "the actor and rollout must load the same architecture (actor_rollout_ref.model.path)"
                )
            if target.shape != tensor.shape:
                raise ValueError(
                    f"weight sync sent {name!r} with shape {tuple(tensor.shape)}, expected {tuple(target.shape)}"
                )
            target.copy_(tensor)
            covered.add(id(target))
            loaded += 1
    missing = sorted(name for pid, name in params.items() if pid not in covered)
    if missing:
        raise ValueError(
            f"weight sync left {len(missing)} rollout parameters unchanged (e.g. {missing[:3]}); the rollout "
            "would mix old and new weights. The actor must send every parameter."
        )
    return loaded
