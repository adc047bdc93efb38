"""The trainer's per-batch checks (``trainer/checks.py``) as pure functions, and verl's generation step run on
the pipeline's finished generation (``Replayed``): what verl adds to a batch still reaches the actor."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import torch
from stub_trainer import EventLog, StubRollout, StubWeightSync, build_trainer, compose_config
from verl import DataProto

from recipe.one_step_off_async.errors import OffPolicyCorrectionError, RewardError, WeightVersionError
from recipe.one_step_off_async.trainer.checks import check_correction_inputs, check_rewards, measured_weight_version
from recipe.one_step_off_async.trainer.engine_stats import EngineStatsReader
from recipe.one_step_off_async.trainer.replay import Replayed


def batch(scores=(1.0, 0.0, 0.5), versions=((3, 3), (3, 3), (3, 3)), log_probs: bool = True) -> DataProto:
    size = len(scores)
    rm_scores = torch.zeros(size, 2)
    rm_scores[:, -1] = torch.tensor(scores)
    tensors = {"rm_scores": rm_scores, **({"rollout_log_probs": torch.zeros(size, 2)} if log_probs else {})}
    first, last = (np.array([v[i] for v in versions], dtype=object) for i in (0, 1))
    sources = np.array(["sort"] * size, dtype=object)
    return DataProto.from_dict(
        tensors=tensors, non_tensors={"data_source": sources, "min_global_steps": first, "max_global_steps": last}
    )


def test_finite_rewards_pass_and_a_nan_or_inf_is_named_with_the_reward_function():
    check_rewards(5, batch(), scored_by="reward function reward.py:compute_score")
    for bad in (float("nan"), float("inf")):
        with pytest.raises(RewardError, match=r"1 of 3 samples of the batch for step 5 .*\['sort'\].*reward.py"):
            check_rewards(5, batch(scores=(1.0, bad, 0.0)), scored_by="reward function reward.py:compute_score")


def test_missing_rollout_log_probs_fail_only_when_the_correction_is_configured():
    check_correction_inputs(2, batch(log_probs=False), correction_configured=False, rollout_name="vllm")
    check_correction_inputs(2, batch(), correction_configured=True, rollout_name="vllm")
    with pytest.raises(OffPolicyCorrectionError, match="'vllm' rollout returned no rollout_log_probs .* step 2"):
        check_correction_inputs(2, batch(log_probs=False), correction_configured=True, rollout_name="vllm")


def test_the_measured_version_is_the_contracts_and_every_violation_names_the_sample():
    assert measured_weight_version(5, batch(), expected=3, rollout_name="vllm", contract="staleness 1") == 3
    with pytest.raises(WeightVersionError, match=r"\[2, 3\] \(first wrong sample: 1\), expected v3 \(staleness 1\)"):
        measured_weight_version(5, batch(versions=((3, 3), (2, 2), (3, 3))), 3, "vllm", "staleness 1")
    with pytest.raises(WeightVersionError, match="Sample 2 of the batch for step 5 .* across weight versions v3..v4"):
        measured_weight_version(5, batch(versions=((3, 3), (3, 3), (3, 4))), 3, "vllm", "staleness 1")
    with pytest.raises(WeightVersionError, match="did not report the weight version"):
        measured_weight_version(5, batch(versions=((3, 3), (None, None), (3, 3))), 3, "vllm", "staleness 1")


def test_replayed_hands_back_the_finished_generation_and_refuses_another_batch_size():
    output = batch()
    assert Replayed(output).generate_sequences(batch()) is output
    with pytest.raises(ValueError, match="verl asked for 2 samples; the pipeline generated 3"):
        Replayed(output).generate_sequences(batch(scores=(1.0, 0.0), versions=((3, 3), (3, 3))))


def test_the_actor_gets_what_verls_generation_step_adds_to_a_batch():
    """verl's own ``_fit_generate`` runs on the pipeline's output: response mask, token counts, temperature and
    the multi-modal lengths (``images_seqlens``, vision-language models) reach the update, and the replicas are
    never put to sleep."""
    log = EventLog()
    rollout = StubRollout(log)
    sync = StubWeightSync(log, rollout)
    trainer = build_trainer(compose_config("trainer.total_training_steps=2"), log, rollout, sync)
    seen = []
    update = trainer._update_actor
    trainer._update_actor = lambda b: seen.append(b) or update(b)
    trainer.fit()
    assert len(seen) == 2
    assert log.of("replica_sleep") == []  # verl's step would put the replicas to sleep while they generate ahead
    for trained in seen:
        assert trained.meta_info["images_seqlens"] == []  # text-only batch: none, but the key is verl's
        assert len(trained.meta_info["global_token_num"]) == len(trained)
        assert trained.meta_info["temperature"] == trainer.config.actor_rollout_ref.rollout.temperature
        assert "response_mask" in trained.batch.keys()


class StatsServer:
    """A vLLM server actor as ``EngineStatsReader`` sees it: ``__ray_call__.remote(f)`` gives its counters (or
    what ``answer`` returns instead: None for a server with its statistics off)."""

    def __init__(self, ray, answer=None, **counters) -> None:
        self.counters = {"steps": 0, "tokens": 0, "prefill_tokens": 0, "max_num_seqs": 4, **counters}
        self.__ray_call__ = SimpleNamespace(remote=lambda function: ray.put((answer or self.snapshot)()))

    def snapshot(self) -> dict:
        return dict(self.counters)

    def advance(self, steps: int, rows: int) -> None:
        self.counters["steps"] += steps
        self.counters["tokens"] += rows  # one token per running sequence and engine step


def test_engine_stats_are_per_step_differences_summed_over_the_servers_that_report_them(cpu_ray):
    first, second = StatsServer(cpu_ray), StatsServer(cpu_ray, max_num_seqs=8)
    # The last one reports nothing (a vLLM server with its statistics off), the one before is not an actor.
    silent = StatsServer(cpu_ray, answer=lambda: None)
    servers = [first, second, object(), silent]
    reader = EngineStatsReader(lambda: servers)
    first.advance(steps=10, rows=20)
    second.advance(steps=10, rows=40)
    metrics = reader.metrics()
    assert metrics["rollout/slot_occupancy"] == pytest.approx(60 / (10 * 4 + 10 * 8))
    assert metrics["rollout/tokens"] == 60
    first.advance(steps=5, rows=20)
    servers.remove(second)  # a replica left the pool
    metrics = reader.metrics()
    assert metrics["rollout/slot_occupancy"] == 1.0 and metrics["rollout/tokens"] == 20
    assert reader.metrics()["rollout/slot_steps"] == 0  # nothing happened since


def test_a_vllm_servers_counters_come_from_its_engines_prometheus_statistics():
    """``vllm_engine_counters`` on the samples vLLM's stat logger keeps (names and kinds as in vLLM 0.27's
    ``vllm/v1/metrics/loggers.py``, tripwired in test_platforms_verl_compat_on_cpu.py): 3 engine steps of 2, 4
    and 4 running requests, 10 prompt tokens of which 4 came from the prefix cache."""
    from prometheus_client import CollectorRegistry, Counter, Histogram

    from recipe.one_step_off_async.trainer.engine_stats import vllm_engine_counters

    server = SimpleNamespace(config=SimpleNamespace(max_num_seqs=8))
    registry = CollectorRegistry()
    assert vllm_engine_counters(server, registry) is None  # statistics off: nothing to report
    labels = ("model_name", "engine")
    steps = Histogram("vllm:iteration_tokens_total", "tokens per step", labels, registry=registry)
    generated = Counter("vllm:generation_tokens", "generated", labels, registry=registry)
    prompt = Counter("vllm:prompt_tokens", "prompt", labels, registry=registry)
    cached = Counter("vllm:prompt_tokens_cached", "cached", labels, registry=registry)
    engine = ("demo", "0")
    for rows, prefill in ((2, 6), (4, 0), (4, 0)):
        steps.labels(*engine).observe(rows + prefill)
        generated.labels(*engine).inc(rows)
    prompt.labels(*engine).inc(10)
    cached.labels(*engine).inc(4)
    counters = vllm_engine_counters(server, registry)
    assert counters == {"steps": 3, "tokens": 10, "prefill_tokens": 6, "max_num_seqs": 8}
