"""verl's own engine-based FSDP2 actor (2 ranks) on the CPU platform, inside verl's Ray worker groups."""

from __future__ import annotations

import math

import pytest
import torch
from verl_actor import actor_group, cpu_config, log_probs, rollout_batch, update_actor


@pytest.mark.slow
def test_fsdp2_actor_computes_log_probs_and_updates_on_cpu(cpu_ray, demo_assets):
    config = cpu_config(demo_assets.model_dir, "trainer.n_gpus_per_node=2")
    group = actor_group(config, ranks=2)
    assert group.world_size == 2

    generator = torch.Generator().manual_seed(0)
    sequences = [
        (
            torch.randint(10, 90, (6 + i % 3,), generator=generator).tolist(),
            torch.randint(10, 90, (5 - i % 2,), generator=generator).tolist(),
        )
        for i in range(8)
    ]
    batch = rollout_batch(sequences, pad_id=0, advantages=torch.randn(8, 5, generator=generator))

    before = log_probs(group, batch)
    mask = batch.batch["response_mask"].bool()
    assert before.shape == (8, 5)
    assert torch.all(before[mask] < 0) and torch.isfinite(before[mask]).all()
    assert torch.equal(before, log_probs(group, batch))  # deterministic without an update

    metrics = update_actor(group, batch)
    assert all(math.isfinite(float(torch.as_tensor(v).float().mean())) for v in metrics.values())

    after = log_probs(group, batch)
    assert (after[mask] - before[mask]).abs().max() > 1e-4
