"""Partial rollout's client (``rollout/partial.py``) against stub servers, and why verl's correction is exact for it.

The stub server answers as verl's vLLM server does around a weight sync: a request running when the
sync aborts it returns ``stop_reason="aborted"`` with the tokens sampled so far and the version that
sampled them; the resubmission is parked until generation resumes, then runs on the new version.
"""

from __future__ import annotations

import asyncio
import math
from types import SimpleNamespace

import numpy as np
import pytest
import ray
import torch
from verl import DataProto
from verl.trainer.ppo.rollout_corr_helper import compute_rollout_correction_and_rejection_mask
from verl.workers.rollout.replica import TokenOutput

from recipe.one_step_off_async.rollout.partial import RECOMPUTED_PREFILL, VERSION_RUNS, PartialRolloutClient, add_run
from recipe.one_step_off_async.trainer.checks import check_token_versions
from recipe.one_step_off_async.trainer.clients import ElasticPartialRolloutClient

RESPONSE_LENGTH = 8


class Remote:
    """``handle.method.remote(...)`` for an in-process object: the call is awaited as Ray's would be."""

    def __init__(self, method) -> None:
        self._method = method

    def remote(self, *args, **kwargs):
        return self._method(*args, **kwargs)


class StubServer:
    """Answers each call from a script: ``(n_tokens, version, aborted)``; records what it was asked."""

    def __init__(
        self, script: list[tuple[int, int, bool]], die_on_call: int | None = None, forever=(0, 0, True)
    ) -> None:
        self.script, self.die_on_call, self.calls, self.forever = list(script), die_on_call, [], forever
        self.generate = Remote(self._generate)

    async def _generate(self, *, request_id, prompt_ids, sampling_params, **kwargs) -> TokenOutput:
        self.calls.append({"prompt_ids": list(prompt_ids), "sampling_params": dict(sampling_params), **kwargs})
        if self.die_on_call == len(self.calls):
            raise ray.exceptions.ActorDiedError()
        n_tokens, version, aborted = self.script.pop(0) if self.script else self.forever
        start = len(prompt_ids)
        return TokenOutput(
            token_ids=list(range(start, start + n_tokens)),
            # The sampling version shows in its log-probs; an abort with no token has none (verl's vLLM server).
            log_probs=[-(version + 1) / 10] * n_tokens if n_tokens else None,
            stop_reason="aborted" if aborted else "completed",
            extra_fields={"global_steps": version},
        )


class StubBalancer:
    """The load balancer's calls the elastic client makes."""

    def __init__(self, servers: dict[str, StubServer]) -> None:
        self.servers, self.removed = servers, []
        self.remove_servers = Remote(self._remove)
        self.get_all_servers = Remote(self._all)

    async def _remove(self, addresses):
        self.removed += addresses
        for address in addresses:
            self.servers.pop(address, None)

    async def _all(self):
        return list(self.servers)


def client(cls=PartialRolloutClient, servers: dict[str, StubServer] | None = None, rollout_name="vllm", **kwargs):
    rollout = SimpleNamespace(name=rollout_name, response_length=RESPONSE_LENGTH, full_determinism=False)
    config = SimpleNamespace(actor_rollout_ref=SimpleNamespace(rollout=rollout))
    balancer = StubBalancer(servers or {})
    instance = cls(config, balancer, **kwargs)

    async def acquire(request_id, **extra):  # first server still in the pool, as a load balancer would pick
        address = next(iter(balancer.servers))
        if hasattr(instance, "_controller"):
            from recipe.one_step_off_async.elastic.client import _routed_to

            _routed_to.set(address)
        return address, balancer.servers[address]

    instance._acquire_server = acquire
    instance._release_server = lambda server_id, request_id=None: None
    return instance, balancer


def generate(instance, prompt=(1, 2, 3), priority=0, **sampling_params):
    async def main():
        return await instance.generate(
            "r0", prompt_ids=list(prompt), sampling_params=sampling_params, priority=priority
        )

    return asyncio.run(main())


@pytest.fixture
def no_fixed_sleep(monkeypatch):
    """Fails a test whose code path sleeps (verl's own partial client sleeps 1 s before each resubmission)."""
    real_sleep = asyncio.sleep

    async def sleep(delay, *args, **kwargs):
        assert delay == 0, f"slept {delay} s"
        return await real_sleep(delay, *args, **kwargs)

    monkeypatch.setattr(asyncio, "sleep", sleep)


def test_every_segment_carries_the_request_priority_to_the_server():
    """The oldest batch first, after a sync too: every resubmission keeps the request's ``priority``."""
    server = StubServer([(3, 1, True), (5, 2, False)])
    instance, _ = client(servers={"a": server}, rollout_name="vllm")
    generate(instance, priority=7, max_tokens=RESPONSE_LENGTH)
    assert [call.get("priority") for call in server.calls] == [7, 7]


def test_runs_merge_consecutive_tokens_of_one_version():
    runs: list[list[int]] = []
    for version, n_tokens in ((3, 2), (3, 1), (4, 0), (4, 5), (5, 1)):
        add_run(runs, version, n_tokens)
    assert runs == [[3, 3], [4, 5], [5, 1]]


def test_an_aborted_request_resumes_from_its_tokens_with_the_budget_lowered_and_no_sleep(no_fixed_sleep):
    # Aborted; aborted while queued (no token, log_probs None, as verl's vLLM server); done.
    server = StubServer([(2, 3, True), (0, 3, True), (3, 4, False)])
    instance, _ = client(servers={"a": server})
    output = generate(instance, priority=7, max_tokens=6, temperature=1.0, logprobs=True)

    assert [call["priority"] for call in server.calls] == [7, 7, 7]  # the batch's age reaches vLLM's scheduler
    prompts = [call["prompt_ids"] for call in server.calls]
    assert prompts == [[1, 2, 3], [1, 2, 3, 3, 4], [1, 2, 3, 3, 4]]  # prompt + tokens so far
    assert [call["sampling_params"]["max_tokens"] for call in server.calls] == [6, 4, 4]
    assert all(call["sampling_params"]["temperature"] == 1.0 for call in server.calls)
    assert output.token_ids == [3, 4, 5, 6, 7]
    assert output.log_probs == pytest.approx([-0.4, -0.4, -0.5, -0.5, -0.5])  # each token keeps its version's
    assert output.stop_reason == "completed"
    fields = output.extra_fields
    assert fields[VERSION_RUNS] == [[3, 2], [4, 3]]
    assert (fields["min_global_steps"], fields["max_global_steps"], fields["global_steps"]) == (3, 4, 4)
    assert fields[RECOMPUTED_PREFILL] == 5 + 5  # two resubmissions of the 5-token prefix


def test_a_replica_that_aborts_without_progress_is_retried_with_backoff_then_named(monkeypatch):
    slept = []

    async def sleep(delay, *args, **kwargs):
        slept.append(delay)

    monkeypatch.setattr(asyncio, "sleep", sleep)
    server = StubServer([(2, 1, True)])  # then zero-token aborts forever: a replica that never resumes
    with pytest.raises(RuntimeError, match=r"Request r0 was aborted 30 times in a row without a new token \(2 of 6"):
        generate(client(servers={"a": server})[0], max_tokens=6)
    assert len(server.calls) == 1 + 30
    assert slept[0] == pytest.approx(0.01) and slept[-1] == 1.0 and len(slept) == 28  # none after the first


def test_without_a_limit_the_budget_is_the_response_length_and_an_abort_at_the_budget_ends_by_length():
    server = StubServer([(5, 1, True), (3, 2, True)])
    instance, _ = client(servers={"a": server})
    output = generate(instance)
    assert [call["sampling_params"]["max_tokens"] for call in server.calls] == [RESPONSE_LENGTH, 3]
    assert len(output.token_ids) == RESPONSE_LENGTH and output.stop_reason == "completed"
    assert output.extra_fields[VERSION_RUNS] == [[1, 5], [2, 3]]

    server = StubServer([(1, 1, True), (2, 2, False)])
    output = generate(client(servers={"a": server})[0], max_new_tokens=5)
    assert [call["sampling_params"]["max_new_tokens"] for call in server.calls] == [5, 4]


def test_an_elastic_pool_resends_a_lost_segment_from_the_tokens_already_returned():
    dying = StubServer([(2, 3, True)], die_on_call=2)  # answers the first segment, dies under the second
    healthy = StubServer([(3, 4, True), (1, 5, False)])  # the lost segment, then one more after a sync
    reports = []
    controller = SimpleNamespace(report_lost=Remote(lambda address, reason: asyncio.sleep(0, reports.append(address))))
    instance, balancer = client(
        ElasticPartialRolloutClient, {"dying": dying, "healthy": healthy}, controller=controller
    )
    output = generate(instance, max_tokens=6)

    assert balancer.removed == ["dying"] and reports == ["dying"]
    assert healthy.calls[0]["prompt_ids"] == [1, 2, 3, 3, 4] and healthy.calls[0]["sampling_params"]["max_tokens"] == 4
    assert output.token_ids == [3, 4, 5, 6, 7, 8]
    assert output.extra_fields[VERSION_RUNS] == [[3, 2], [4, 3], [5, 1]]
    assert output.extra_fields["rollout_replica"] == "healthy"
    assert output.extra_fields["rollout_regenerated"] == 1  # counted over the segments, not the last one's 0


def two_version_batch(runs_per_sample, lengths, recomputed=(0, 0)) -> DataProto:
    width = max(lengths)
    mask = (torch.arange(width) < torch.tensor(lengths).unsqueeze(-1)).long()
    runs = np.empty(len(runs_per_sample), dtype=object)
    runs[:] = runs_per_sample
    return DataProto.from_dict(
        tensors={"response_mask": mask},
        non_tensors={VERSION_RUNS: runs, RECOMPUTED_PREFILL: np.array(recomputed, dtype=object)},
    )


def test_token_versions_are_checked_against_the_contract_and_measured_per_token():
    batch = two_version_batch([[[3, 2], [4, 3]], [[4, 4]]], lengths=[5, 4], recomputed=(6, 0))
    metrics = check_token_versions(6, batch, lowest=3, highest=5, contract="staleness 2")
    assert metrics["async/staleness_min"] == 1 and metrics["async/staleness_max"] == 2
    assert metrics["async/staleness_mean"] == pytest.approx((2 * 2 + 7 * 1) / 9)
    assert metrics["async/partial_ratio"] == 0.5 and metrics["async/version_span_max"] == 1
    assert metrics["async/recomputed_prefill_tokens"] == 6

    with pytest.raises(Exception, match=r"Sample 1 of the batch for step 6 .* v2, outside \[v3, v5\] \(staleness 2"):
        check_token_versions(6, two_version_batch([[[3, 5]], [[2, 1], [3, 3]]], [5, 4]), 3, 5, "staleness 2")
    with pytest.raises(Exception, match=r"Sample 0 .* has 5 response tokens but weight versions for 4"):
        check_token_versions(6, two_version_batch([[[3, 4]], [[4, 4]]], [5, 4]), 3, 5, "staleness 2")
    unstamped = DataProto.from_dict(tensors={"response_mask": torch.ones(1, 2)})
    with pytest.raises(Exception, match="carries no per-token weight versions"):
        check_token_versions(6, unstamped, 3, 5, "staleness 2")


def test_verls_default_correction_is_exact_for_a_sample_spanning_two_versions():
    """The default (token-level IS, threshold 2, decoupled PPO) divides each token's probability under the
    current policy by the probability under the version that sampled *that* token: the client keeps every
    token's log-prob from its own segment. So the token weights are the exact per-token ratios, and their
    product (sequence-level IS) is the exact likelihood ratio pi(y) / mu(y) of the mixed behaviour policy
    mu(y) = prod_t mu_{v(t)}(y_t | y_<t)."""
    server = StubServer([(2, 3, True), (3, 4, False)])
    output = generate(client(servers={"a": server})[0], max_tokens=5)
    behaviour = torch.tensor([output.log_probs])  # -0.4, -0.4 (v3), then -0.5 x 3 (v4)
    current = torch.tensor([[-0.3, -1.5, -0.2, -0.6, -0.5]])  # the actor's recomputed old_log_probs
    mask = torch.ones_like(current)

    weights, _, _ = compute_rollout_correction_and_rejection_mask(
        current, behaviour, mask, rollout_is="token", rollout_is_threshold=2.0
    )
    expected = [
        min(math.exp(c - b), 2.0) for c, b in zip(current[0].tolist(), [-0.4, -0.4, -0.5, -0.5, -0.5], strict=True)
    ]
    assert weights.batch["rollout_is_weights"][0].tolist() == pytest.approx(expected)

    weights, _, _ = compute_rollout_correction_and_rejection_mask(
        current, behaviour, mask, rollout_is="sequence", rollout_is_threshold=1e9
    )
    mixed_behaviour = 2 * -0.4 + 3 * -0.5
    exact_ratio = math.exp(float(current.sum()) - mixed_behaviour)
    assert weights.batch["rollout_is_weights"][0, 0].item() == pytest.approx(exact_ratio, rel=1e-5)
