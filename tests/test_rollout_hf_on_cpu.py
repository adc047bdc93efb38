"""Tests of the ``hf`` rollout backend (``recipe.one_step_off_async.rollout.hf.engine/hf_server/hf_replica``).

Fast tests drive the continuous-batching engine in-process and check every reported log-prob
against a plain full forward of the finished sequence. The ``slow`` tests run verl's own machinery
on a local Ray cluster: ``LLMServerManager`` (standalone, ``rollout.name=hf``) + ``AgentLoopManager``
for rollouts, an FSDP2 ``ActorRolloutRefWorker`` (fp32) for ``compute_log_prob`` / ``update_actor``,
and ``CheckpointEngineManager`` with the ``gloo`` checkpoint engine for weight syncs.

    pytest tests/test_hf_replica_on_cpu.py -m "not slow"   # ~3 s
    pytest tests/test_hf_replica_on_cpu.py -m slow         # ~40 s, most of it starting the Ray actors
"""

from __future__ import annotations

import asyncio
import inspect
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch
import verl
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from transformers import GenerationConfig, PreTrainedModel, Qwen2Config, Qwen2ForCausalLM
from verl.checkpoint_engine.base import CheckpointEngineWorker
from verl.workers.config import RolloutConfig
from verl.workers.rollout.replica import RolloutReplica, get_rollout_replica_class
from verl_actor import actor_group, log_probs, update_actor

from recipe.one_step_off_async.demo.tokenizer import build_tokenizer
from recipe.one_step_off_async.rollout.hf import engine as engine_module
from recipe.one_step_off_async.rollout.hf.engine import (
    FinishReason,
    GenerationEngine,
    GenerationResult,
    SamplingParams,
    sample_next_tokens,
)
from recipe.one_step_off_async.rollout.hf.replica import HFReplica, check_rollout_config
from recipe.one_step_off_async.rollout.hf.reward_server import HFRewardServer
from recipe.one_step_off_async.rollout.hf.server import HFRolloutServer, to_sampling_params

VERL_CONFIG_DIR = os.path.join(os.path.dirname(verl.__file__), "trainer", "config")
EOS = build_tokenizer().eos_token_id
PROMPT_LENGTH, RESPONSE_LENGTH = 32, 16
# The same fp32 computation up to summation order (padding, batch composition): what remains is rounding.
FP32_ROUNDING = {"rtol": 1e-5, "atol": 1e-5}
NUM_REPLICAS = 2  # standalone: one hf server per slot of the rollout pool


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    """A 2-layer Qwen2 with peaked (initializer_range=0.2) random weights: log-probs far from uniform."""
    config = Qwen2Config(
        vocab_size=len(build_tokenizer()),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        tie_word_embeddings=False,
        initializer_range=0.2,
        eos_token_id=EOS,
        pad_token_id=build_tokenizer().pad_token_id,
        bos_token_id=None,
        attn_implementation="sdpa",
    )
    torch.manual_seed(seed)
    return Qwen2ForCausalLM(config).eval()


@pytest.fixture(autouse=True, scope="module")
def _one_torch_thread():
    """One intra-op thread, as in the rollout servers (OMP_NUM_THREADS=1): on a busy machine a second
    thread makes every tiny forward wait for a free core, 100x slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def model() -> PreTrainedModel:
    """Shared by the tests that never change its weights."""
    return tiny_qwen2()


def reference_log_probs(
    model: PreTrainedModel, prompt: list[int], tokens: list[int], temperature: float
) -> torch.Tensor:
    """log_softmax(logits / T) of ``tokens`` from one unpadded forward of prompt + tokens."""
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1 : -1].float()
    scaled = logits / (temperature if temperature > 0 else 1.0)
    return torch.log_softmax(scaled, -1).gather(-1, torch.tensor(tokens).unsqueeze(-1)).squeeze(-1)


def random_prompts(n: int, seed: int, vocab: int = 100) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(5, vocab) for _ in range(rng.randint(3, 20))] for _ in range(n)]


def run_engine(model: PreTrainedModel, scenario, **engine_kwargs):
    """Run ``await scenario(engine)`` with a started engine and shut it down afterwards."""

    async def main():
        engine = GenerationEngine(
            model, **{"max_num_seqs": 64, "max_num_batched_tokens": 4096, "seed": 0, **engine_kwargs}
        )
        engine.start()
        try:
            return await scenario(engine)
        finally:
            await engine.shutdown()

    return asyncio.run(main())


async def stream_of(state_dict: dict[str, torch.Tensor]):
    """A state dict as the async (name, tensor) stream a checkpoint engine yields."""
    for item in state_dict.items():
        yield item


async def wait_until(predicate, timeout_s: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not predicate():
        if asyncio.get_running_loop().time() > deadline:
            raise TimeoutError("condition not reached")
        await asyncio.sleep(0.005)


# --- the engine, in-process ------------------------------------------------------------------------


SAMPLING_MIX = [
    SamplingParams(max_tokens=24, temperature=0.0),
    SamplingParams(max_tokens=30, temperature=1.0, top_k=5),
    SamplingParams(max_tokens=12, temperature=0.7, top_p=0.9),
    SamplingParams(max_tokens=18, temperature=1.3, top_k=20, top_p=0.8),
]


@pytest.mark.parametrize("headroom", [engine_module.KV_CACHE_HEADROOM, 1], ids=["kv-headroom", "kv-buffers-regrown"])
def test_continuous_batching_reports_the_log_probs_of_an_unpadded_forward(model, headroom, monkeypatch):
    """Requests join the running batch at different steps (left-padded caches of different lengths,
    rows leaving as they finish, KV buffers regrown as they fill); every token's log-prob still equals
    a plain forward's."""
    monkeypatch.setattr(engine_module, "KV_CACHE_HEADROOM", headroom)
    prompts = random_prompts(16, seed=1)
    params = [SAMPLING_MIX[i % len(SAMPLING_MIX)] for i in range(len(prompts))]
    peak_running = 0

    async def scenario(engine: GenerationEngine) -> list[GenerationResult]:
        nonlocal peak_running
        futures = []
        for prompt, p in zip(prompts, params, strict=True):
            futures.append(engine.submit(prompt, p))
            await asyncio.sleep(0.004)  # arrive while others are mid-generation
            peak_running = max(peak_running, engine.num_running)
        return await asyncio.gather(*futures)

    results = run_engine(model, scenario)
    assert peak_running > 1, "requests were never decoded together"
    for prompt, p, result in zip(prompts, params, results, strict=True):
        assert result.finish_reason is FinishReason.LENGTH and len(result.token_ids) == p.max_tokens
        expected = reference_log_probs(model, prompt, result.token_ids, p.temperature)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, **FP32_ROUNDING)
        if p.greedy:
            with torch.no_grad():
                logits = model(torch.tensor([prompt + result.token_ids])).logits[0, len(prompt) - 1 : -1]
            assert result.token_ids == logits.argmax(-1).tolist()


def test_greedy_generation_matches_hf_generate(model):
    prompts = random_prompts(6, seed=2)

    async def scenario(engine):
        return await asyncio.gather(*[engine.submit(p, SamplingParams(max_tokens=20, temperature=0)) for p in prompts])

    results = run_engine(model, scenario)
    for prompt, result in zip(prompts, results, strict=True):
        expected = model.generate(
            torch.tensor([prompt]), max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0
        )[0, len(prompt) :]
        assert result.token_ids == expected.tolist()


def test_queued_requests_start_lowest_priority_first_then_in_arrival_order(model):
    """Partial rollout gives each request its batch's step as priority: the oldest batch is admitted first."""
    priorities = [2, 0, 1, 0, 2]
    started: list[int] = []

    async def scenario(engine: GenerationEngine) -> None:
        futures = [
            engine.submit([5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0), priority=p) for p in priorities
        ]
        for request, future in enumerate(futures):
            future.add_done_callback(lambda _, request=request: started.append(request))
        await asyncio.gather(*futures)

    run_engine(model, scenario, max_num_seqs=1)  # one at a time: finishing order is admission order
    assert started == [1, 3, 2, 0, 4]


def test_sequences_stop_at_a_stop_token_or_max_tokens(model):
    prompt = random_prompts(1, seed=3)[0]

    async def scenario(engine):
        return await engine.submit(prompt, SamplingParams(max_tokens=20, temperature=0))

    free = run_engine(model, scenario)
    stop_token = free.token_ids[5]
    first = free.token_ids.index(stop_token)

    async def stopped(engine):
        params = SamplingParams(max_tokens=20, temperature=0, stop_token_ids=frozenset({stop_token}))
        return await engine.submit(prompt, params)

    result = run_engine(model, stopped)
    assert result.finish_reason is FinishReason.STOP
    assert result.token_ids == free.token_ids[: first + 1]  # the stop token is returned, like vLLM's EOS
    assert free.finish_reason is FinishReason.LENGTH and len(free.token_ids) == 20


def test_abort_all_returns_partial_sequences_and_queued_ones_empty(model):
    prompts = random_prompts(6, seed=4)

    async def scenario(engine: GenerationEngine):
        futures = [engine.submit(p, SamplingParams(max_tokens=400, temperature=1.0)) for p in prompts]
        await wait_until(lambda: engine.num_running == 4)
        await asyncio.sleep(0.05)
        aborted = await engine.abort_all()
        results = await asyncio.gather(*futures)
        after = await engine.submit(prompts[0], SamplingParams(max_tokens=3, temperature=0))
        return aborted, results, after

    aborted, results, after = run_engine(model, scenario, max_num_seqs=4)
    assert aborted == 6
    assert all(r.finish_reason is FinishReason.ABORT for r in results)
    running, queued = results[:4], results[4:]
    assert all(0 < len(r.token_ids) < 400 for r in running)
    assert all(r.token_ids == [] for r in queued)
    for prompt, result in zip(prompts[:4], running, strict=True):
        expected = reference_log_probs(model, prompt, result.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, **FP32_ROUNDING)
    assert after.finish_reason is FinishReason.LENGTH and len(after.token_ids) == 3


def test_engine_stats_count_rows_tokens_prefill_and_busy_time_per_step(model):
    prompts = random_prompts(3, seed=9)

    async def scenario(engine: GenerationEngine):
        results = await asyncio.gather(
            *[engine.submit(p, SamplingParams(max_tokens=n)) for p, n in zip(prompts, (2, 5, 9), strict=True)]
        )
        return engine.stats, results

    stats, results = run_engine(model, scenario, max_num_seqs=4)
    assert stats.tokens == stats.rows == sum(len(r.token_ids) for r in results) == 2 + 5 + 9
    assert stats.prefill_tokens == sum(len(p) for p in prompts)
    # Admitted together, then rows leave as they finish: 3 rows for 2 steps, 2 rows for 3, 1 row for 4.
    assert stats.steps == 9 and stats.rows / stats.steps == pytest.approx(16 / 9)
    assert stats.busy_s > 0


def test_weight_update_aborts_running_sequences_and_never_mixes_versions():
    """A weight update lands between two steps: sequences that were running stop (aborted, old
    version, every token from the old weights); queued ones then run entirely on the new weights."""
    old_model, new_model = tiny_qwen2(seed=0), tiny_qwen2(seed=1)
    prompts = random_prompts(4, seed=5)

    async def scenario(engine: GenerationEngine):
        futures = [engine.submit(p, SamplingParams(max_tokens=400, temperature=1.0)) for p in prompts]
        await wait_until(lambda: engine.num_running == 2)
        await asyncio.sleep(0.05)

        loaded = await engine.update_weights(stream_of(new_model.state_dict()), version=7)
        return loaded, await asyncio.gather(*futures)

    loaded, results = run_engine(tiny_qwen2(seed=0), scenario, max_num_seqs=2)
    assert loaded == len(new_model.state_dict())
    for prompt, result in zip(prompts[:2], results[:2], strict=True):
        assert result.finish_reason is FinishReason.ABORT and result.weight_version is None
        assert 0 < len(result.token_ids) < 400
        expected = reference_log_probs(old_model, prompt, result.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, **FP32_ROUNDING)
    for prompt, result in zip(prompts[2:], results[2:], strict=True):
        assert result.finish_reason is FinishReason.LENGTH and result.weight_version == 7
        expected = reference_log_probs(new_model, prompt, result.token_ids, 1.0)
        torch.testing.assert_close(torch.tensor(result.log_probs), expected, **FP32_ROUNDING)


def test_a_failing_step_fails_its_requests_and_the_engine_keeps_serving():
    model = tiny_qwen2()
    working_forward = model.forward

    def broken_forward(*args, **kwargs):
        raise RuntimeError("forward exploded")

    async def scenario(engine: GenerationEngine) -> GenerationResult:
        model.forward = broken_forward
        with pytest.raises(RuntimeError, match="forward exploded"):
            await engine.submit([5, 6], SamplingParams(max_tokens=3))
        model.forward = working_forward
        with pytest.raises(ValueError, match="vocabulary"):
            engine.submit([5, 10_000], SamplingParams(max_tokens=3))
        return await engine.submit([5, 6], SamplingParams(max_tokens=3))

    assert len(run_engine(model, scenario).token_ids) == 3


@pytest.mark.parametrize(
    ("weights", "error"),
    [
        (lambda sd: {**sd, "model.extra.weight": torch.zeros(1)}, "does not have"),
        (lambda sd: {k: v for k, v in sd.items() if k != "lm_head.weight"}, "unchanged"),
        (lambda sd: {**sd, "lm_head.weight": torch.zeros(3, 3)}, "shape"),
    ],
    ids=["unknown-name", "missing-parameter", "wrong-shape"],
)
def test_weight_update_rejects_weights_that_would_leave_the_model_stale(weights, error):
    model = tiny_qwen2()

    async def scenario(engine: GenerationEngine):
        def stream():
            return stream_of(weights(tiny_qwen2(seed=1).state_dict()))

        with pytest.raises(ValueError, match="must carry its version"):
            await engine.update_weights(stream(), version=None)
        with pytest.raises(ValueError, match=error):
            await engine.update_weights(stream(), version=1)
        with pytest.raises(RuntimeError, match="mixes two weight versions"):
            engine.submit([5, 6], SamplingParams(max_tokens=1))
        await engine.update_weights(stream_of(tiny_qwen2(seed=1).state_dict()), version=2)
        assert (await engine.submit([5, 6], SamplingParams(max_tokens=1))).weight_version == 2

    run_engine(model, scenario)


def test_sampler_honours_top_k_top_p_and_reports_full_distribution_log_probs():
    generator = torch.Generator().manual_seed(0)
    # Three close favourites; the other 47 tokens together still hold ~10% of the mass at T=1.
    logits = torch.randn(1, 50, generator=generator) * 0.5
    logits[0, [7, 19, 31]] = torch.tensor([5.0, 4.8, 4.6])
    top3, greedy_token = {7, 19, 31}, 7

    draws = {
        "top_k=1": SamplingParams(max_tokens=1, temperature=1.0, top_k=1),
        "tiny top_p": SamplingParams(max_tokens=1, temperature=1.0, top_p=1e-6),
        "top_k=3": SamplingParams(max_tokens=1, temperature=1.0, top_k=3),
        "top_p=0.8": SamplingParams(max_tokens=1, temperature=1.0, top_p=0.8),
        "greedy": SamplingParams(max_tokens=1, temperature=0),
    }
    for name, params in draws.items():
        tokens, log_probs = sample_next_tokens(logits.repeat(200, 1), [params] * 200, generator)
        scale = params.temperature or 1.0
        expected = torch.log_softmax(logits[0] / scale, -1)[tokens]
        torch.testing.assert_close(log_probs, expected, rtol=0, atol=1e-6)
        if name in ("top_k=3", "top_p=0.8"):
            assert set(tokens.tolist()) <= top3 and len(set(tokens.tolist())) > 1, name
        else:
            assert set(tokens.tolist()) == {greedy_token}, name


# --- what verl sends ------------------------------------------------------------------------------


def rollout_config(**overrides) -> RolloutConfig:
    return RolloutConfig(name="hf", prompt_length=PROMPT_LENGTH, response_length=RESPONSE_LENGTH, **overrides)


def test_sampling_params_follow_what_verl_sends():
    convert = {"config": rollout_config(), "max_model_len": 512, "stop_token_ids": frozenset({EOS})}
    # AgentLoopWorker.generate_sequences: training and validation (greedy) requests.
    train = {"temperature": 0.9, "top_p": 1.0, "top_k": -1, "repetition_penalty": 1.0, "logprobs": True}
    params, log_probs = to_sampling_params(train, prompt_length=10, **convert)
    assert log_probs and params == SamplingParams(
        max_tokens=RESPONSE_LENGTH, temperature=0.9, top_p=1.0, top_k=-1, stop_token_ids=frozenset({EOS})
    )
    val = {**train, "temperature": 0, "logprobs": False}
    params, log_probs = to_sampling_params(val, prompt_length=10, **convert)
    assert params.greedy and not log_probs
    # Like verl's vLLM server: the default budget shrinks with long prompts; explicit ones are clamped.
    assert to_sampling_params({}, prompt_length=40, **convert)[0].max_tokens == PROMPT_LENGTH + RESPONSE_LENGTH - 40
    assert to_sampling_params({"max_tokens": 5000}, prompt_length=500, **convert)[0].max_tokens == 12
    assert to_sampling_params({"ignore_eos": True}, prompt_length=4, **convert)[0].stop_token_ids == frozenset()


@pytest.mark.parametrize(
    ("request_params", "prompt_length", "error"),
    [
        ({"presence_penalty": 0.5}, 4, "does not support sampling params"),
        ({"repetition_penalty": 1.1}, 4, "repetition_penalty"),
        ({}, 512, "no room"),
    ],
)
def test_sampling_params_reject_what_the_hf_rollout_cannot_honour(request_params, prompt_length, error):
    with pytest.raises(ValueError, match=error):
        to_sampling_params(
            request_params,
            prompt_length=prompt_length,
            config=rollout_config(),
            max_model_len=512,
            stop_token_ids=frozenset(),
        )


def test_replica_config_must_be_one_process_per_replica():
    check_rollout_config(rollout_config(tensor_model_parallel_size=1))
    with pytest.raises(ValueError, match="tensor_model_parallel_size=1"):
        check_rollout_config(rollout_config(tensor_model_parallel_size=2))


def test_hf_is_a_registered_verl_rollout_backend():
    """What the backend relies on in verl: the replica registry, and a CheckpointEngineWorker that uses the
    server adapter it is given (so verl never resolves an adapter class for rollout.name=hf)."""
    assert get_rollout_replica_class("hf") is HFReplica
    assert issubclass(HFReplica, RolloutReplica) and issubclass(HFRolloutServer, CheckpointEngineWorker)
    assert "server_adapter" in inspect.signature(CheckpointEngineWorker.__init__).parameters


def test_the_reward_model_server_answers_vllm_classify_with_the_classifiers_logits(demo_assets):
    """The ``hf`` reward model (reward_server.py) speaks vLLM's /classify as verl's reward loop calls it."""
    from fastapi.testclient import TestClient
    from transformers import AutoModelForSequenceClassification, AutoTokenizer
    from verl.workers.config import HFModelConfig

    path = demo_assets.reward_model_dir
    server = HFRewardServer(rollout_config(dtype="float32"), HFModelConfig(path=path), replica_rank=0)
    client = TestClient(server.build_app())
    texts = ["<|im_start|>user\nsort: cab<|im_end|>\n<|im_start|>assistant\nabc<|im_end|>\n", "abc"]
    reply = client.post("/classify", json={"model": path, "input": texts[0], "use_activation": False})
    assert reply.status_code == 200, reply.text
    [scored] = reply.json()["data"]
    # The classifier's logit at the last token, exactly as transformers computes it for the text alone.
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForSequenceClassification.from_pretrained(path)
    with torch.inference_mode():
        expected = [model(**tokenizer(text, return_tensors="pt")).logits[0, 0].item() for text in texts]
    assert scored["index"] == 0 and scored["num_classes"] == 1
    assert scored["probs"] == pytest.approx([expected[0]], abs=1e-6)
    # A batch scores each text alone (no padding); vLLM's default activation for one label is a sigmoid.
    batch = client.post("/classify", json={"input": texts}).json()["data"]
    assert [item["probs"][0] for item in batch] == pytest.approx(torch.tensor(expected).sigmoid().tolist(), abs=1e-6)
    assert client.post("/classify", json={"input": "abc", "prompt": "x"}).status_code == 422
    # Another model's name is refused as vLLM refuses it (the recipe's reward loop names none).
    other = client.post("/classify", json={"model": "/models/other-rm", "input": "abc"})
    assert other.status_code == 404 and "The model `/models/other-rm` does not exist." in other.text
    too_long = client.post("/classify", json={"input": "a" * 600})
    assert too_long.status_code == 400 and "reward.reward_model.rollout.max_model_len" in too_long.text
    # Scored at the last token even when it is the pad token (vLLM's pooling; transformers would skip it).
    ending_in_pad = "abc" + tokenizer.pad_token
    ids = tokenizer(ending_in_pad, return_tensors="pt")["input_ids"]
    assert ids[0, -1] == tokenizer.pad_token_id
    with torch.inference_mode():
        last_token = model.score(model.model(input_ids=ids).last_hidden_state)[0, -1, 0].item()
    [padded] = client.post("/classify", json={"input": ending_in_pad, "use_activation": False}).json()["data"]
    assert padded["probs"] == pytest.approx([last_token], abs=1e-6) and last_token != pytest.approx(expected[1])


def test_a_checkpoint_without_a_classifier_head_is_refused_as_a_reward_model(demo_assets):
    from verl.workers.config import HFModelConfig

    with pytest.raises(ValueError, match=r"is not a sequence-classification checkpoint: it lacks \['score.weight'\]"):
        HFRewardServer(rollout_config(dtype="float32"), HFModelConfig(path=demo_assets.model_dir), replica_rank=0)


def test_a_reward_model_replica_serves_the_classifier_and_names_its_own_keys():
    replica = HFReplica(0, rollout_config(tensor_model_parallel_size=1), {}, is_reward_model=True)
    assert replica.get_ray_class_with_init_args().cls.__ray_actor_class__ is HFRewardServer
    with pytest.raises(ValueError, match="reward.reward_model.rollout.tensor_model_parallel_size=1"):
        HFReplica(0, rollout_config(tensor_model_parallel_size=2), {}, is_reward_model=True)


# --- verl's managers on a Ray cluster --------------------------------------------------------------


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    """The tiny model saved as verl loads it: weights, config, generation config and tokenizer in one dir."""
    path = tmp_path_factory.mktemp("hf_replica") / "model"
    model = tiny_qwen2()
    model.save_pretrained(path)
    GenerationConfig(eos_token_id=EOS, pad_token_id=model.config.pad_token_id).save_pretrained(path)
    build_tokenizer().save_pretrained(path)
    return path


def verl_config(model_path: Path, temperature: float) -> DictConfig:
    with initialize_config_dir(config_dir=VERL_CONFIG_DIR, version_base=None):
        return compose(
            "ppo_trainer",
            overrides=[
                f"actor_rollout_ref.model.path={model_path}",
                "+actor_rollout_ref.model.override_config.attn_implementation=sdpa",
                "actor_rollout_ref.model.use_remove_padding=false",
                # The actor computes in fp32 too: model_dtype alone keeps bf16 autocast (mixed_precision).
                "actor_rollout_ref.actor.strategy=fsdp2",
                "actor_rollout_ref.actor.fsdp_config.model_dtype=fp32",
                "+actor_rollout_ref.actor.fsdp_config.mixed_precision={param_dtype:fp32,reduce_dtype:fp32,buffer_dtype:fp32}",
                "actor_rollout_ref.actor.use_torch_compile=false",
                "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.actor.optim.lr=0.05",
                "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=2",
                "actor_rollout_ref.rollout.name=hf",
                "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                "actor_rollout_ref.rollout.nnodes=1",
                f"actor_rollout_ref.rollout.n_gpus_per_node={NUM_REPLICAS}",
                "actor_rollout_ref.rollout.dtype=float32",
                f"actor_rollout_ref.rollout.temperature={temperature}",
                "actor_rollout_ref.rollout.calculate_log_probs=true",
                "actor_rollout_ref.rollout.agent.num_workers=1",
                "actor_rollout_ref.rollout.checkpoint_engine.backend=gloo",
                "actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=recipe.one_step_off_async.weight_sync.gloo",
                "actor_rollout_ref.rollout.checkpoint_engine.update_weights_bucket_megabytes=1",
                "trainer.device=cpu",
                "trainer.n_gpus_per_node=1",
                f"data.max_prompt_length={PROMPT_LENGTH}",
                f"data.max_response_length={RESPONSE_LENGTH}",
            ],
        )


class RolloutStack:
    """verl's actor worker group, hf rollout servers, agent loop and checkpoint-engine manager."""

    TEMPERATURE = 0.7

    def __init__(self, model_path: Path) -> None:
        from verl.checkpoint_engine import CheckpointEngineManager
        from verl.experimental.agent_loop import AgentLoopManager
        from verl.utils.config import omega_conf_to_dataclass
        from verl.workers.rollout.llm_server import LLMServerManager

        self.config = verl_config(model_path, self.TEMPERATURE)
        self.actor = actor_group(self.config, ranks=1, name="hf_actor")
        self.servers = LLMServerManager.create(config=self.config)
        self.client = self.servers.get_client()
        self.agent_loop = AgentLoopManager.create(config=self.config, llm_client=self.client)
        self.checkpoints = CheckpointEngineManager(
            config=omega_conf_to_dataclass(self.config.actor_rollout_ref.rollout.checkpoint_engine),
            actor_wg=self.actor,
            replicas=self.servers.get_replicas(),
        )

    def close(self) -> None:
        """Kill this stack's actors and free its placement groups: the Ray session outlives this module,
        and other tests create replicas with the same actor names."""
        import ray

        replicas = self.servers.get_replicas()
        actors = [
            *self.actor.workers,
            *(worker for replica in replicas for worker in replica.workers),
            *self.agent_loop.agent_loop_workers,
            self.servers.global_load_balancer,
        ]
        for actor in actors:
            ray.kill(actor)
        for pool in [self.actor.resource_pool, *(replica.resource_pool for replica in replicas)]:
            for placement_group in pool.pgs:
                ray.util.remove_placement_group(placement_group)

    def rollout(self, problems: list[str], n: int):
        """The agent loop's output for each problem, ``n`` samples each (as verl's trainer repeats)."""
        from verl import DataProto

        raw_prompts = np.empty(len(problems), dtype=object)
        raw_prompts[:] = [[{"role": "user", "content": problem}] for problem in problems]
        batch = DataProto.from_dict(non_tensors={"raw_prompt": raw_prompts, "index": np.arange(len(problems))})
        return self.agent_loop.generate_sequences(batch.repeat(n, interleave=True))

    def actor_log_probs(self, rollout) -> torch.Tensor:
        """verl's ``compute_log_prob`` on the rollout, as ``RayPPOTrainer._compute_old_log_prob`` calls it."""
        return log_probs(self.actor, self._policy_batch(rollout))

    def update_actor(self, rollout) -> None:
        """One PPO step on ``rollout`` with every advantage +1: the actor's weights move."""
        update_actor(self.actor, self._policy_batch(rollout, advantages=rollout.batch["response_mask"].float()), seed=1)

    def _policy_batch(self, rollout, **extra: torch.Tensor):
        from verl import DataProto

        keys = ["prompts", "responses", "response_mask", "input_ids", "attention_mask", "position_ids"]
        return DataProto.from_dict(
            tensors={**{key: rollout.batch[key] for key in keys}, **extra},
            meta_info={"temperature": self.TEMPERATURE},
        )


@pytest.fixture(scope="module")
def stack(cpu_ray, model_dir):
    stack = RolloutStack(model_dir)
    yield stack
    stack.close()


PROBLEMS = ["1+2=", "13+7=", "5+5="]


def versions(rollout) -> set:
    return set(rollout.non_tensor_batch["global_steps"].tolist())


@pytest.mark.slow
def test_agent_loop_rollouts_through_hf_replicas_are_well_formed(stack):
    out = stack.rollout(PROBLEMS, n=2)
    batch = out.batch
    total = PROMPT_LENGTH + RESPONSE_LENGTH
    assert batch["prompts"].shape == (6, PROMPT_LENGTH) and batch["responses"].shape == (6, RESPONSE_LENGTH)
    assert batch["input_ids"].shape == batch["attention_mask"].shape == batch["position_ids"].shape == (6, total)
    assert batch["rollout_log_probs"].shape == batch["response_mask"].shape == (6, RESPONSE_LENGTH)
    response_mask = batch["response_mask"].bool()
    assert torch.equal(batch["attention_mask"][:, PROMPT_LENGTH:].bool(), response_mask)
    lengths = response_mask.sum(-1)
    assert (lengths > 0).all()
    # Right-padded responses: a contiguous prefix; each ends at EOS or at the response budget.
    assert torch.equal(response_mask, torch.arange(RESPONSE_LENGTH) < lengths.unsqueeze(-1))
    for row, length in enumerate(lengths.tolist()):
        assert length == RESPONSE_LENGTH or batch["responses"][row, length - 1] == EOS
    log_probs = batch["rollout_log_probs"]
    assert (log_probs[response_mask] < 0).all() and (log_probs[~response_mask] == 0).all()
    # The n samples of one prompt differ (temperature 0.7) but share the prompt.
    assert torch.equal(batch["prompts"][0], batch["prompts"][1])
    assert not torch.equal(batch["responses"][0], batch["responses"][1])
    assert len(versions(out)) == 1
    assert len(stack.servers.get_replicas()) == NUM_REPLICAS


@pytest.mark.slow
def test_rollout_log_probs_match_the_actors_compute_log_prob(stack):
    stack.checkpoints.update_weights(global_steps=10)
    out = stack.rollout(PROBLEMS, n=2)
    assert versions(out) == {10}
    mask = out.batch["response_mask"].bool()
    actor = stack.actor_log_probs(out)
    torch.testing.assert_close(out.batch["rollout_log_probs"][mask], actor[mask], rtol=0, atol=1e-4)


@pytest.mark.slow
def test_weight_sync_changes_the_very_next_generation(stack):
    stack.checkpoints.update_weights(global_steps=20)
    before = stack.rollout(PROBLEMS, n=2)
    stack.update_actor(before)
    stack.checkpoints.update_weights(global_steps=21)
    after = stack.rollout(PROBLEMS, n=2)

    assert versions(before) == {20} and versions(after) == {21}
    mask = after.batch["response_mask"].bool()
    # The new weights are in, all of them: the rollout's log-probs are the updated actor's.
    torch.testing.assert_close(
        after.batch["rollout_log_probs"][mask], stack.actor_log_probs(after)[mask], atol=1e-4, rtol=0
    )
    assert not torch.equal(before.batch["rollout_log_probs"], after.batch["rollout_log_probs"])


@pytest.mark.slow
def test_weight_sync_aborts_in_flight_requests(stack):
    """verl's manager aborts before syncing: in-flight requests come back aborted with the tokens
    of the old version only; the next request runs on the new version."""
    stack.checkpoints.update_weights(global_steps=30)
    servers = [replica.servers[0] for replica in stack.servers.get_replicas()]
    long_request = {"max_tokens": 480, "ignore_eos": True, "temperature": 1.0, "logprobs": True}

    async def running() -> list[int]:
        return await asyncio.gather(*[s.__ray_call__.remote(lambda self: self.engine.num_running) for s in servers])

    async def scenario():
        requests = [
            asyncio.ensure_future(stack.client.generate(f"r{i}", prompt_ids=prompt, sampling_params=long_request))
            for i, prompt in enumerate(random_prompts(4, seed=6))
        ]
        while sum(await running()) < 4:
            await asyncio.sleep(0.01)
        spread = await running()
        await asyncio.to_thread(stack.checkpoints.update_weights, 31)
        in_flight = await asyncio.gather(*requests)
        after = await stack.client.generate("next", prompt_ids=[5, 6, 7], sampling_params={"max_tokens": 4})
        return spread, in_flight, after

    spread, in_flight, after = asyncio.run(scenario())
    assert all(n > 0 for n in spread), f"the load balancer left a replica idle: {spread}"
    for output in in_flight:
        assert output.stop_reason == "aborted" and output.extra_fields["global_steps"] == 30
        assert 0 < len(output.token_ids) == len(output.log_probs) < 480
    assert after.stop_reason == "completed" and after.extra_fields["global_steps"] == 31


@pytest.mark.slow
def test_partial_rollout_client_continues_interrupted_requests_under_the_new_weights(stack):
    """The same sync with the recipe's partial-rollout client: every request continues from its tokens so far
    on v41 and ends with its full budget, each token stamped with the version that sampled it."""
    from recipe.one_step_off_async.rollout.partial import RECOMPUTED_PREFILL, VERSION_RUNS, PartialRolloutClient

    stack.checkpoints.update_weights(global_steps=40)
    client = stack.servers.get_client(PartialRolloutClient)
    servers = [replica.servers[0] for replica in stack.servers.get_replicas()]
    long_request = {"max_tokens": 480, "ignore_eos": True, "temperature": 1.0, "logprobs": True}
    prompts = random_prompts(4, seed=7)

    async def scenario():
        requests = [
            asyncio.ensure_future(client.generate(f"p{i}", prompt_ids=prompt, sampling_params=long_request))
            for i, prompt in enumerate(prompts)
        ]
        running = lambda: [s.__ray_call__.remote(lambda self: self.engine.num_running) for s in servers]  # noqa: E731
        while sum(await asyncio.gather(*running())) < 4:
            await asyncio.sleep(0.01)
        await asyncio.to_thread(stack.checkpoints.update_weights, 41)
        return await asyncio.gather(*requests)

    for prompt, output in zip(prompts, asyncio.run(scenario()), strict=True):
        runs = output.extra_fields[VERSION_RUNS]
        assert [version for version, _ in runs] == [40, 41], runs
        assert len(output.token_ids) == len(output.log_probs) == sum(n for _, n in runs) == 480
        assert output.stop_reason == "completed"
        assert output.extra_fields[RECOMPUTED_PREFILL] == len(prompt) + runs[0][1]
        assert (output.extra_fields["min_global_steps"], output.extra_fields["max_global_steps"]) == (40, 41)
