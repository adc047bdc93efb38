"""The support matrix (docs/advance/one_step_off_async/support_matrix.md) is true: tested, refused, or GPU only.

- every ``tests/<file>.py::<test>`` it names exists;
- every row says tested (naming a test), GPU only (saying whether it ran on a GPU) or refused;
- every override of a refused row is refused by the launch check, before Ray starts, naming the key;
- the estimators it marks "stub loop" run through the real trainer's step with stub workers (here).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest
from e2e import main_until_ray
from stub_trainer import EventLog, StubRollout, StubWeightSync, build_trainer, compose_config

from recipe.one_step_off_async.errors import LaunchProblems

ROOT = Path(__file__).resolve().parents[1]
STATUSES = ("tested", "GPU only", "refused")


def matrix_rows() -> list[tuple[str, str, str]]:
    text = (ROOT / "docs" / "advance" / "one_step_off_async" / "support_matrix.md").read_text()
    rows = []
    for line in text.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        if line.startswith("| ") and len(cells) == 3 and cells[0] not in ("Feature", "---"):
            rows.append(tuple(cells))
    return rows


ROWS = matrix_rows()
# A refused row's code spans made only of overrides (``key=value``, space-separated when they are refused together).
REFUSED = [
    (feature, tuple(span.split()))
    for feature, status, evidence in ROWS
    if status == "refused"
    for span in re.findall(r"`([^`]+)`", evidence)
    if all("=" in token for token in span.split())
]


def test_the_matrix_has_a_row_per_feature_with_a_known_status():
    assert len(ROWS) >= 30
    for feature, status, evidence in ROWS:
        assert status in STATUSES, feature
        if status == "tested":
            assert "::test_" in evidence or "every CPU run" in evidence, feature
        if status == "GPU only":
            assert "not run" in evidence or "ran on" in evidence, feature
        if status == "refused":
            assert any(refused == feature for refused, _ in REFUSED), f"{feature}: name the refused override"
        assert "should work" not in evidence


def test_every_test_the_matrix_names_exists():
    named = {ref for _, _, evidence in ROWS for ref in re.findall(r"`(tests/[\w/]+\.py)::(test_\w+)`", evidence)}
    assert named
    for path, test in named:
        assert re.search(rf"^def {test}\(", (ROOT / path).read_text(), re.M), f"{path}::{test}"


@pytest.mark.parametrize(("feature", "overrides"), REFUSED, ids=[" ".join(overrides) for _, overrides in REFUSED])
@pytest.mark.usefixtures("demo_assets")  # the reward model's row composes its path
def test_every_refused_override_is_refused_before_ray_naming_the_key(feature, overrides):
    with pytest.raises(LaunchProblems) as caught:
        main_until_ray(*overrides)
    # The refusal is the problem that starts with one of the row's keys (each problem names its key first).
    keys = [override.lstrip("+").split("=")[0] for override in overrides]
    assert any(problem.startswith(f"{key}=") for problem in caught.value.problems for key in keys), (
        caught.value.problems
    )


STUB_LOOP_ESTIMATORS = [
    "reinforce_plus_plus_baseline",
    "opo",
    "grpo_passk",
    "gpg",
    "rloo_vectorized",
    "grpo_vectorized",
]


def test_the_stub_loop_estimators_are_the_matrix_row():
    [row] = [
        evidence for feature, _, evidence in ROWS if "test_verls_outcome_estimators_run_through_the_step" in evidence
    ]
    [feature] = [feature for feature, _, evidence in ROWS if evidence == row]
    assert re.findall(r"`(\w+)`", feature) == STUB_LOOP_ESTIMATORS


@pytest.mark.parametrize("estimator", STUB_LOOP_ESTIMATORS)
def test_verls_outcome_estimators_run_through_the_step(estimator):
    """verl's advantage computation on the pipeline's batches (stale samples, the rollout's log-probs)."""
    log = EventLog()
    rollout = StubRollout(log)
    config = compose_config("trainer.total_training_steps=3", f"algorithm.adv_estimator={estimator}")
    trainer = build_trainer(config, log, rollout, StubWeightSync(log, rollout))
    trained = []
    update = trainer._update_actor
    trainer._update_actor = lambda batch: trained.append(batch) or update(batch)
    trainer.fit()
    assert len(trained) == 3
    for batch in trained:
        advantages = batch.batch["advantages"][batch.batch["response_mask"].bool()]
        assert all(math.isfinite(value) for value in advantages.tolist())
        assert advantages.abs().sum() > 0  # the stub's rewards differ within a group
