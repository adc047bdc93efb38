"""Each of the recipe's policy losses trains through the real entry point at staleness 1.

What: ``python -m recipe.one_step_off_async.main_ppo --config-name=one_step_off_ppo_cpu`` with
``actor_rollout_ref.actor.policy_loss.loss_mode=<loss>``, 2 training steps, no validation. Asserted:
the run exits 0; ``actor/pg_loss`` is finite at every step; verl's rollout-correction metrics
(``rollout_corr/*``) are logged, so the off-policy correction ran alongside the loss; and a metric
only that loss reports is there (or one it does not report is absent), so the Ray actor worker
really ran our loss and not verl's default. The ``kimi15`` run also sets ``kimi15_tau`` with a ``+``
override, which must survive verl's actor-config instantiation in the worker.

How: ``python -m pytest -m slow tests/test_policy_losses_e2e_on_cpu.py`` (about 1 min per loss on 2 cores).
"""

from __future__ import annotations

import math

import pytest
from e2e import run_main

from recipe.one_step_off_async.policy_losses import LOSS_MODES

pytestmark = pytest.mark.slow

# Per loss: (extra overrides, a metric it must log or None, a metric it must not log or None).
# verl's default loss (`vanilla`, PPO-clip) logs pg_clipfrac and pg_clipfrac_lower.
SIGNATURES = {
    "topr": ((), "actor/topr_positive_frac", None),
    "tis_pg": ((), "actor/pg_clipfrac_lower", None),
    "kimi15": (("+actor_rollout_ref.actor.policy_loss.kimi15_tau=0.5",), None, "actor/pg_clipfrac"),
    "reinforce": ((), None, "actor/pg_clipfrac"),
}


def test_every_loss_has_a_signature():
    assert sorted(SIGNATURES) == sorted(LOSS_MODES)


@pytest.mark.parametrize("loss", LOSS_MODES)
def test_loss_trains_end_to_end(tmp_path, demo_assets, loss):
    extra, logged, not_logged = SIGNATURES[loss]
    run = run_main(
        tmp_path,
        f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}",
        "async_training.staleness=1",
        "trainer.total_training_steps=2",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *extra,
    )
    assert run.returncode == 0, run.output[-3000:]
    steps = run.metrics
    assert sorted(steps) == [1, 2]
    for step, metrics in steps.items():
        assert math.isfinite(metrics["actor/pg_loss"]), (step, metrics["actor/pg_loss"])
        assert any(key.startswith("rollout_corr/") for key in metrics), sorted(metrics)
        if logged:
            assert logged in metrics, sorted(metrics)
        if not_logged:
            assert not_logged not in metrics, sorted(metrics)
