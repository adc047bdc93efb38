"""RolloutPipeline on its own: epoch framing, the explicit launch-ahead, resume points, bounded waits, errors."""

from __future__ import annotations

import threading
import time

import pytest
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import RandomSampler
from verl import DataProto

from recipe.one_step_off_async.errors import PipelineTimeoutError
from recipe.one_step_off_async.trainer.pipeline import RolloutPipeline

DATASET, BATCH, EPOCHS = 10, 3, 3  # 3 batches per epoch (drop_last), 9 steps


def make_dataloader(seed: int = 7) -> StatefulDataLoader:
    generator = torch.Generator()
    generator.manual_seed(seed)
    data = list(range(DATASET))
    return StatefulDataLoader(data, batch_size=BATCH, drop_last=True, sampler=RandomSampler(data, generator=generator))


def make_pipeline(staleness: int, generate=None, launched: list[int] | None = None) -> RolloutPipeline:
    """``launched`` records the step of every generation the pipeline launches, in order."""

    def prepare(batch: torch.Tensor, step: int) -> tuple[DataProto, DataProto]:
        if launched is not None:
            launched.append(step)
        prompts = DataProto.from_dict(tensors={"ids": batch.clone()}, meta_info={"step": step})
        return prompts, prompts

    return RolloutPipeline(
        make_dataloader(), staleness, prepare=prepare, generate=generate or (lambda b: b), total_epochs=EPOCHS
    )


def consume(pipeline: RolloutPipeline, first_step: int, last_step: int, stop_after: int | None = None):
    """Mimic verl's fit loop and the trainer's step: for epoch: for item in dataloader: train, sync, save, launch
    ahead; return trained batches and resume state."""
    pipeline.start(first_step, last_step)
    trained, state = [], None
    for _epoch in range(EPOCHS):
        for item in pipeline:
            trained.append((item.step, item.epoch, item.result(timeout_s=5).output.batch["ids"].tolist()))
            pipeline.wait_idle(timeout_s=5)
            if stop_after is not None and len(trained) == stop_after:
                state = pipeline.state_dict()
                pipeline.close()
                return trained, state
            pipeline.launch_ahead()
    pipeline.close()
    return trained, state


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_items_arrive_in_data_order_one_epoch_at_a_time(staleness):
    reference = [b.tolist() for b in _epochs(make_dataloader())]
    trained, _ = consume(make_pipeline(staleness), 1, EPOCHS * 3)
    assert [t[0] for t in trained] == list(range(1, 10))
    assert [t[1] for t in trained] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [t[2] for t in trained] == reference


def _epochs(dataloader):
    for _ in range(EPOCHS):
        yield from dataloader


@pytest.mark.parametrize("staleness", [0, 1, 2])
@pytest.mark.parametrize("cut", range(1, 9))
def test_resume_trains_the_next_batch_exactly_once(staleness, cut):
    full, _ = consume(make_pipeline(staleness), 1, 9)
    head, state = consume(make_pipeline(staleness), 1, 9, stop_after=cut)
    resumed_pipeline = make_pipeline(staleness)
    resumed_pipeline.load_state_dict(state)
    tail, _ = consume(resumed_pipeline, cut + 1, 9)
    assert head + tail == full


def test_resume_after_the_last_step_continues_into_more_steps():
    full, _ = consume(make_pipeline(1), 1, 9)
    head, _ = consume(make_pipeline(1), 1, 6)
    pipeline = make_pipeline(1)
    pipeline.start(1, 6)
    for _ in range(2):
        for _item in pipeline:
            pipeline.wait_idle(timeout_s=5)
            pipeline.launch_ahead()
    state = pipeline.state_dict()  # nothing in flight: right after batch 6
    resumed = make_pipeline(1)
    resumed.load_state_dict(state)
    tail, _ = consume(resumed, 7, 9)
    assert head + tail == full


def test_no_generation_is_launched_beyond_the_last_step():
    launched = []
    consume(make_pipeline(2, launched=launched), 1, 4)
    assert launched == [1, 2, 3, 4]


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_each_launch_ahead_starts_the_batch_s_plus_1_steps_ahead(staleness):
    launched = []
    pipeline = make_pipeline(staleness, launched=launched)
    pipeline.start(1, 9)
    items = iter(pipeline)
    next(items)
    assert launched == list(range(1, staleness + 2))  # before step 1: batches 1..s+1
    pipeline.launch_ahead()
    assert launched == list(range(1, staleness + 3))
    pipeline.launch_ahead()  # idempotent until the next step takes its batch
    assert launched == list(range(1, staleness + 3))
    pipeline.close()


def test_a_step_that_does_not_launch_ahead_fails_instead_of_ending_training_early():
    pipeline = make_pipeline(0)
    pipeline.start(1, 9)
    items = iter(pipeline)
    next(items)
    with pytest.raises(RuntimeError, match="launch_ahead"):
        next(items)
    pipeline.close()


def test_generation_error_is_raised_with_its_original_exception():
    def generate(batch):
        if batch.meta_info["step"] == 2:
            raise KeyError("boom in generation 2")
        return batch

    with pytest.raises(KeyError, match="boom in generation 2"):
        consume(make_pipeline(1, generate), 1, 9)


def test_waits_are_bounded_and_say_what_they_waited_for():
    release = threading.Event()

    def generate(batch):
        release.wait(10)
        return batch

    pipeline = make_pipeline(1, generate)
    pipeline.start(1, 9)
    item = next(iter(pipeline))
    started = time.monotonic()
    with pytest.raises(PipelineTimeoutError, match="training step 1 did not finish within 0.2 s"):
        item.result(timeout_s=0.2)
    with pytest.raises(PipelineTimeoutError, match="training step 2"):
        pipeline.wait_idle(timeout_s=0.2)
    assert time.monotonic() - started < 5
    release.set()
    pipeline.close()


def test_loading_a_foreign_dataloader_state_is_a_clear_error():
    with pytest.raises(ValueError, match="not written by this recipe's RolloutPipeline"):
        make_pipeline(1).load_state_dict(make_dataloader().state_dict())
