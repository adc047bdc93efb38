"""Tests of what the weight-sync engines share (``recipe.one_step_off_async.weight_sync.common``).

Plain calls in this process, no group, no folder: the topology verl's manager gets from each engine
class, the rank and argument checks, draining, and the receiver's stream. A stub engine stands in
where a test needs an engine's state but none of its transport.

    pytest tests/test_weight_sync_common_on_cpu.py   # < 1 s
"""

from __future__ import annotations

import asyncio
import math

import pytest
import torch

from recipe.one_step_off_async.weight_sync.common import (
    DRAIN_RANK,
    SOURCE_RANK,
    ReceivedWeights,
    SingleSourceEngine,
    drain,
    engine_kwarg_key,
)
from recipe.one_step_off_async.weight_sync.files import FileCheckpointEngine, WeightsLocation
from recipe.one_step_off_async.weight_sync.gloo import GlooCheckpointEngine, StoreAddress


class _StubEngine(SingleSourceEngine):
    """The base with no transport: ``init_process_group`` only takes the seat."""

    backend = "stub"
    meeting_point = "meeting"
    meeting_type = str

    def prepare(self) -> str | None:
        return "here" if self.is_master else None

    def init_process_group(self, rank: int, world_size: int, meeting: str) -> None:
        self._rank, self._world_size = rank, world_size

    async def send_weights(self, weights, global_steps: int | None = None) -> dict[str, float]:
        raise NotImplementedError

    def receive_weights(self, global_steps: int | None = None) -> ReceivedWeights:
        raise NotImplementedError

    def finalize(self) -> None:
        self._rank = None


@pytest.mark.parametrize(
    ("engine", "meeting", "key"),
    [
        (GlooCheckpointEngine, StoreAddress(host="10.0.0.1", port=1234), "store_address"),
        (FileCheckpointEngine, WeightsLocation(dir="/weights", sync_id="s"), "location"),
    ],
    ids=["gloo", "checkpoint"],
)
def test_build_topology_one_source_drain_ranks_and_receivers(engine, meeting, key):
    actor, rollout = engine.build_topology(3, 2, [meeting, None, None, None, None])
    assert actor == {"rank": [0, -1, -1], "world_size": [3] * 3, key: [meeting] * 3}
    assert rollout == {"rank": [1, 2], "world_size": [3] * 2, key: [meeting] * 2}
    with pytest.raises(ValueError, match="is_master=True"):
        engine.build_topology(2, 1, [None, None, None])


def test_build_topology_of_one_actor_rank_and_the_ranks_constants():
    actor, rollout = _StubEngine.build_topology(1, 1, ["here", None])
    assert actor == {"rank": [SOURCE_RANK], "world_size": [2], "meeting": ["here"]}
    assert rollout == {"rank": [1], "world_size": [2], "meeting": ["here"]}
    assert (SOURCE_RANK, DRAIN_RANK) == (0, -1)


@pytest.mark.parametrize("engine", [GlooCheckpointEngine, FileCheckpointEngine, _StubEngine])
def test_bad_bucket_size_or_timeout_names_the_key_to_set(engine):
    with pytest.raises(ValueError, match="update_weights_bucket_megabytes >= 1"):
        engine(bucket_size=0)
    for timeout_s in (0, -1.0, math.nan):
        with pytest.raises(ValueError, match=f"engine_kwargs.{engine.backend}.timeout_s"):
            engine(bucket_size=1, timeout_s=timeout_s)


def test_engine_kwarg_key():
    assert (
        engine_kwarg_key("gloo", "timeout_s")
        == "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.gloo.timeout_s"
    )


def test_only_the_source_and_drain_ranks_send_and_only_rollout_ranks_receive():
    engine = _StubEngine(bucket_size=1)
    for check, method in ((engine._sending_rank, "send_weights"), (engine._receiving_rank, "receive_weights")):
        with pytest.raises(RuntimeError, match=f"{method} before init_process_group"):
            check()
    for rank in (SOURCE_RANK, DRAIN_RANK):
        engine.init_process_group(rank=rank, world_size=3, meeting="here")
        assert engine._sending_rank() == rank
        with pytest.raises(RuntimeError, match="only rollout workers"):
            engine._receiving_rank()
    engine.init_process_group(rank=2, world_size=3, meeting="here")
    assert engine._receiving_rank() == 2
    with pytest.raises(RuntimeError, match="rollout workers receive weights"):
        engine._sending_rank()
    engine.finalize()
    with pytest.raises(RuntimeError, match="before init_process_group"):
        engine._receiving_rank()


def test_receive_metrics_are_a_copy_of_the_last_receive():
    engine = _StubEngine(bucket_size=1)
    assert engine.receive_metrics() == {}
    engine._received = {"checkpoint_engine/recv_s": 1.5}
    metrics = engine.receive_metrics()
    metrics["checkpoint_engine/recv_s"] = 0.0
    assert engine.receive_metrics() == {"checkpoint_engine/recv_s": 1.5}


@pytest.mark.parametrize("kind", ["iterable", "async"])
def test_drain_walks_every_item(kind):
    walked = []

    def weights():
        for i in range(5):
            walked.append(i)
            yield f"w{i}", torch.zeros(1)

    async def async_weights():
        for item in weights():
            yield item

    asyncio.run(drain(weights() if kind == "iterable" else async_weights()))
    assert walked == list(range(5))


def test_received_weights_yields_the_stream_and_its_version():
    async def receive(stream: ReceivedWeights):
        stream.version = 7  # an engine sets it before the first tensor
        for i in range(3):
            yield f"w{i}", torch.full((2,), float(i))

    async def consume():
        stream = ReceivedWeights(receive)
        assert stream.version is None
        items = [(name, tensor.clone()) async for name, tensor in stream]
        return stream.version, items

    version, items = asyncio.run(consume())
    assert version == 7
    assert [name for name, _ in items] == ["w0", "w1", "w2"]
    assert all(torch.equal(tensor, torch.full((2,), float(i))) for i, (_, tensor) in enumerate(items))
