"""The suite's own scheduling under pytest-xdist (``scripts/test.sh``, ``tests/conftest.py``).

One worker takes the modules launched back to back (the undisturbed run and the elastic and fault tests that compare
with it), so that run is made once; the other launching modules are one unit too, which the other worker takes after
the modules that launch nothing; each other module stays in one worker, so its module-scoped fixtures are made once. The scheduler subclasses a class of xdist's (``LoadFileScheduling._split_scope``): these tests fail when xdist
changes it.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
from conftest import (
    AFTER_THE_FIRST_LAUNCHES,
    BACK_TO_BACK,
    LATER,
    LATER_LAUNCHES,
    LAUNCHES,
    LAUNCHING_MODULES,
    pytest_xdist_make_scheduler,
)

pytest.importorskip("xdist")

TESTS = Path(__file__).resolve().parent


def scheduler(dist: str):
    config = mock.Mock()
    config.getvalue.side_effect = {"dist": dist, "tx": ["2*popen"]}.get  # as `-n 2` sets them
    return pytest_xdist_make_scheduler(config, log=None)


def test_the_launching_modules_are_two_units_of_work_and_every_other_module_its_own():
    split = scheduler("loadfile")._split_scope
    assert sorted(path.name for path in TESTS.glob("test_e2e_*.py")) == sorted(LAUNCHING_MODULES)
    assert "test_e2e_faults_on_cpu.py" in BACK_TO_BACK and set(LATER) == set(LAUNCHING_MODULES) - set(BACK_TO_BACK)
    assert {split(f"tests/{name}::test_one") for name in BACK_TO_BACK} == {LAUNCHES}
    assert {split(f"tests/{name}::test_one") for name in LATER} == {LATER_LAUNCHES}
    assert {split(f"tests/{name}::test_one") for name in AFTER_THE_FIRST_LAUNCHES} == {LAUNCHES}
    assert split("tests/test_runs_on_cpu.py::test_one") == "tests/test_runs_on_cpu.py"
    assert split("tests/test_runs_on_cpu.py::test_two") == "tests/test_runs_on_cpu.py"


def test_other_distribution_modes_keep_xdists_own_scheduler():
    assert scheduler("load") is None
    assert scheduler("loadgroup") is None
