"""Convergence on the built-in task: one-step-off learns, and keeps most of what the synchronous baseline learns.

What: the real entry point on the CPU profile (sort 5 letters, the warm-started tiny Qwen2) at staleness 1 for
STEPS steps. The metric is the greedy validation accuracy on the 128 held-out prompts
(``val-core/one_step_off_async/sort_letters/acc/mean@1``), at step 0 and every 10 steps; "final" is the mean of
the last two validations (steps 30 and 40), which damps the step-to-step jitter of a 128-prompt evaluation.
Asserted: the gain from step 0 to final is at least half the synchronous baseline's measured mean gain.

Measured (seed = data.seed = rollout.seed = 0..9, staleness 1 and 0 of a seed side by side, at steps 30 and 40
of 60-step runs, which train as 40-step runs do up to there: the learning rate is constant; step 0 is 0.297 in
every run: same weights, greedy):

    seed            0      1      2      3      4      5      6      7      8      9
    s1 final    0.453  0.453  0.480  0.465  0.469  0.410  0.449  0.426  0.426  0.410
    s1 gain    +0.156 +0.156 +0.184 +0.168 +0.172 +0.113 +0.152 +0.129 +0.129 +0.113
    s0 final    0.438  0.457  0.473  0.465  0.461  0.445  0.426  0.477  0.422  0.438
    s0 gain    +0.141 +0.160 +0.176 +0.168 +0.164 +0.148 +0.129 +0.180 +0.125 +0.141

s0 gain: mean 0.153 (SYNC_GAIN), sd 0.019. s1 gain: mean 0.147, sd 0.025, smallest 0.113; s1 - s0: mean -0.006,
sd 0.024. Four runs at seed 0 (the test's) gained +0.156, +0.160, +0.145, +0.149: sampling is not reproducible
(below), so the seed fixes the data order and the spread of one seed is what a rerun sees. The floor,
GAIN_FLOOR = SYNC_GAIN / 2 = 0.077, is 11 sd of seed 0's own spread below its mean and 2.8 sd of staleness 1's
spread over seeds; the test fails when staleness 1 keeps less than half the synchronous learning per step, where
the earlier live side-by-side (a staleness-0 run beside it, difference at most 0.08) failed too. The baseline is
the ten seeds' mean, not a second launch: one staleness-0 run is as noisy as the run it would be compared with
(re-measure it, this module's run at staleness 0 and 1 over the ten seeds, when the task, model or learning rate
changes; ``python -m benchmarks learning --grid staleness-parity`` gives comparable figures on its own validation
schedule). The graded task's parity (``one_step_off_ppo_cpu_graded``) is measured by that benchmark, outside the
suite.

Negative controls, staleness 1, validated every 10 of 60 steps: with ``actor.optim.lr=0``, and with weight sync
broken (the rollout receives every sync and reports its version but keeps the start-up weights), the validation
reward stays at 0.297 at every step: gain 0. Validation generates on the rollout replicas, so this test also
checks that the weights arrive.

What makes runs differ: ``data.seed`` changes which prompts each step trains on. Sampling is not reproducible
even with the same seeds: the ``hf`` replica draws from one generator in the order requests reach its batch,
which the async agent loop does not fix (two runs with identical seeds reach 0.367 and 0.398 at step 10), so a
seed picks a data order, not a fixed outcome. ``actor.data_loader_seed`` has no effect here: ``actor.shuffle``
is false and one mini-batch covers the whole batch.

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
SYNC_GAIN = 0.153  # staleness 0's mean gain over ten seeds, measured (see the docstring)
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
    )
    assert run.returncode == 0, run.output[-5000:]
    return run


def test_one_step_off_keeps_at_least_half_the_synchronous_learning(one_step_off_convergence_run):
    run = one_step_off_convergence_run
    curve = run.validation(ACCURACY)
    assert sorted(curve) == list(range(0, STEPS + 1, TEST_FREQ)), curve
    gain = final_accuracy(run) - curve[0]
    assert gain >= GAIN_FLOOR, (
        f"staleness 1 gained {gain:+.3f} validation accuracy (step 0 {curve[0]:.3f}, final at steps {FINAL_STEPS}); "
        f"it needs {GAIN_FLOOR:+.3f}, half the synchronous baseline's measured mean gain {SYNC_GAIN:+.3f}; curve "
        f"{curve}. A flat curve means the actor does not update or the rollout never receives the new weights."
    )
