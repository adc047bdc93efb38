"""Convergence on the built-in task: one-step-off learns, and keeps most of what the synchronous baseline learns.

What: the real entry point on the CPU profile (sort 5 letters, the warm-started tiny Qwen2) at staleness 1 for
STEPS steps. The metric is the greedy validation accuracy on the 128 held-out prompts
(``val-core/one_step_off_async/sort_letters/acc/mean@1``), at step 0 and every 10 steps; "final" is the mean of
the last two validations (steps 30 and 40), which damps the step-to-step jitter of a 128-prompt evaluation.
Asserted: the gain from step 0 to final is at least half the synchronous baseline's measured mean gain.

Measured on vLLM's CPU build (seed = data.seed = rollout.seed = 0..5, staleness 1 and 0 of a seed side by side,
40-step runs validated every 10 steps, as this test runs; step 0 is 0.297 in every run: same weights, greedy):

    seed            0      1      2      3      4      5
    s1 final    0.457  0.395  0.438  0.461  0.473  0.430
    s1 gain    +0.160 +0.098 +0.141 +0.164 +0.176 +0.133
    s0 final    0.449  0.422  0.438  0.438  0.465  0.453
    s0 gain    +0.152 +0.125 +0.141 +0.141 +0.168 +0.156

s0 gain: mean 0.147 (SYNC_GAIN), sd 0.015. s1 gain: mean 0.145, sd 0.028, smallest 0.098; s1 - s0: mean -0.002,
sd 0.020. Sampling is not reproducible (below), so the seed fixes the data order and a rerun of seed 0 (the
test's) varies as the seeds do. The floor, GAIN_FLOOR = SYNC_GAIN / 2 = 0.074, is 2.5 sd of staleness 1's spread
over seeds below its mean and 0.024 below its smallest gain; the test fails when staleness 1 keeps less than half the
synchronous learning per step. The baseline is the seeds' mean, not a second launch: one staleness-0 run is as
noisy as the run it would be compared with (re-measure it, this module's run at staleness 0 and 1 over the seeds,
when the engine, task, model or learning rate changes; ``python -m benchmarks learning --grid staleness-parity``
gives comparable figures on its own validation schedule). The graded task's parity
(``one_step_off_ppo_cpu_graded``) is measured by that benchmark, outside the suite.

The staleness-1 runs above are decoupled PPO (``bypass_mode=false rollout_is=token``) in whole batches; the test
runs the profiles' default, partial rollout in bypass mode, which kept 0.947 (SE 0.033) of staleness 0's gain on
this task, s1 - s0 -0.008 (SE 0.005), its gains +0.115 to +0.156 over the seeds, all above the floor (8 paired
seeds validated every 5 steps, ``python -m benchmarks learning --grid staleness-parity --tasks binary --candidates
partial_bypass --seeds 0 1 2 3 4 5 6 7``; whole batches in bypass mode kept 0.96). Staleness 0 trains alike in
every mode (the rollout's and the actor's fp32 log-probs come from the same weights, and nothing is in flight at a
sync), so SYNC_GAIN and the floor stand for the default.

Negative controls, staleness 1, validated every 10 of 60 steps: with ``actor.optim.lr=0``, and with weight sync
broken (the rollout receives every sync and reports its version but keeps the start-up weights), the validation
reward stays at 0.297 at every step: gain 0. Validation generates on the rollout replicas, so this test also
checks that the weights arrive.

What makes runs differ: ``data.seed`` changes which prompts each step trains on. Sampling is not reproducible
even with the same seeds: vLLM samples the requests in the order they reach its batch, which the async agent
loop does not fix, so a seed picks a data order, not a fixed outcome. ``actor.data_loader_seed`` has no effect
here: ``actor.shuffle`` is false and one mini-batch covers the whole batch.

How: ``pytest -m convergence tests/test_e2e_convergence_on_cpu.py`` (about 3 min on 2 cores).
"""

from __future__ import annotations

import pytest
from e2e import Run, run_main

# Under xdist (scripts/test.sh) another module's launch shares the 2 cores; the timeout only ends a hung run.
pytestmark = [pytest.mark.convergence, pytest.mark.timeout(1200)]

ACCURACY = "val-core/one_step_off_async/sort_letters/acc/mean@1"
STEPS = 40
TEST_FREQ = 10
FINAL_STEPS = (30, 40)  # "final" = mean of the validations at these steps
SEED = 0  # data.seed and rollout.seed
SYNC_GAIN = 0.147  # staleness 0's mean gain over six seeds on vLLM, measured (see the docstring)
GAIN_FLOOR = SYNC_GAIN / 2


def final_accuracy(run: Run) -> float:
    validation = run.validation(ACCURACY)
    return sum(validation[step] for step in FINAL_STEPS) / len(FINAL_STEPS)


@pytest.fixture(scope="module")
def one_step_off_convergence_run(tmp_path_factory, demo_assets) -> Run:
    run = run_main(
        tmp_path_factory.mktemp("convergence"),
        "async_training.staleness=1",
        f"trainer.total_training_steps={STEPS}",
        f"trainer.test_freq={TEST_FREQ}",
        "trainer.val_before_train=true",
        f"data.seed={SEED}",
        f"actor_rollout_ref.rollout.seed={SEED}",
        timeout_s=1000,
        whole_batches=False,  # the profiles' default: partial rollout in bypass mode
    )
    assert run.returncode == 0, run.output[-5000:]
    return run


def test_one_step_off_keeps_at_least_half_the_synchronous_learning(one_step_off_convergence_run):
    run = one_step_off_convergence_run
    curve = run.validation(ACCURACY)
    assert sorted(curve) == list(range(0, STEPS + 1, TEST_FREQ)), curve
    # The profiles' correction, verl's bypass mode: no forward pass recomputed the old log-probs.
    assert not any("timing_s/old_log_prob" in values for values in run.metrics.values())
    # The actor ran verl's bypass-mode loss (verl_seams.route_bypass_loss_to_the_actor), which logs the sampler's
    # distance from the trainer.
    trained = [values for step, values in run.metrics.items() if step >= 1]
    assert trained and all("actor/rollout_corr/k3_kl" in values for values in trained), sorted(trained[0])
    gain = final_accuracy(run) - curve[0]
    assert gain >= GAIN_FLOOR, (
        f"staleness 1 gained {gain:+.3f} validation accuracy (step 0 {curve[0]:.3f}, final at steps {FINAL_STEPS}); "
        f"it needs {GAIN_FLOOR:+.3f}, half the synchronous baseline's measured mean gain {SYNC_GAIN:+.3f}; curve "
        f"{curve}. A flat curve means the actor does not update or the rollout never receives the new weights."
    )
