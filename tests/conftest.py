"""Shared fixtures. Every test here runs on CPU: the CPU platform is selected for the whole session."""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.demo.assets import is_built, register_resolver

# The Ctrl-C tests (test_e2e_faults_on_cpu.py) send SIGINT to the launches they start. A suite started in the
# background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT ignored, and so would every launch:
# give this process Python's own handler back, which its children reset to the default at exec.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# What a CPU launch gives this process and every Ray worker (platform, the recipe's plugin), set up before
# any test touches verl: the platform is resolved once per process and cached.
CPU_RUN = OmegaConf.create({"trainer": {"device": "cpu"}, "async_training": {"one_gpu": False}})
CPU_ENV = verl_plugin.activate(CPU_RUN)
# The CPU profile's ${demo_asset:...} paths, for tests that compose it with Hydra's compose API (the
# commands get the resolver from the profile's Hydra callback).
register_resolver()


ROOT = Path(__file__).resolve().parents[1]
ASSET_BUILD = pytest.StashKey[subprocess.Popen]()


def needs_demo_assets(item: pytest.Item) -> bool:
    """The test reads the built-in task's assets: through the fixture, or by launching a profile that trains it."""
    return "demo_assets" in item.fixturenames or item.get_closest_marker("e2e") is not None


# The modules that launch the entry point (marks e2e, convergence). Under xdist (``scripts/test.sh``) one
# worker runs the first three back to back from the start (they share the undisturbed run), while the other runs
# every module that launches nothing (but ``AFTER_THE_FIRST_LAUNCHES``), then the last three, also as one unit of
# work (so none of them goes to the first worker): at most two launches share the machine at a time, and the fault
# tests, whose timings are the tightest, run beside unit tests.
LAUNCHING_MODULES = (
    "test_e2e_main_on_cpu.py",  # first: the session's undisturbed run, which faults and elastic compare with
    "test_e2e_faults_on_cpu.py",
    "test_e2e_elastic_on_cpu.py",
    "test_e2e_partial_on_cpu.py",
    "test_e2e_trainer_features_on_cpu.py",
    "test_e2e_convergence_on_cpu.py",
)
BACK_TO_BACK, LATER = LAUNCHING_MODULES[:3], LAUNCHING_MODULES[3:]
# A module that launches nothing, run by the first worker after its launches: they end ~50 s before the other
# worker's (`.ci/run`'s durations, 2026-11-28), and this one takes ~30 s, which the other worker then saves.
AFTER_THE_FIRST_LAUNCHES = ("test_weight_sync_files_on_cpu.py",)
LAUNCHES, LATER_LAUNCHES = "launches", "later launches"  # the xdist scopes of BACK_TO_BACK and LATER


def pytest_collection_modifyitems(config, items):
    """e2e, convergence and network tests are slow too: ``-m "not slow"`` is the fast loop.

    In one process the modules that read the demo assets run last, so that the asset build (about a minute on
    one core, ``pytest_collection_finish``) overlaps the other modules' tests. In an xdist worker the modules
    launched back to back come first (the worker that takes them starts at once) and the other launching modules
    last (the other worker takes them when it has run the rest).
    """
    for item in items:
        if any(item.get_closest_marker(name) for name in ("e2e", "convergence", "network")):
            item.add_marker(pytest.mark.slow)
    unlisted = {item.path.name for item in items if item.path.name.startswith("test_e2e_")} - set(LAUNCHING_MODULES)
    if unlisted:
        raise pytest.UsageError(f"tests/conftest.py: add {sorted(unlisted)} to LAUNCHING_MODULES")
    asset_modules = {item.path for item in items if needs_demo_assets(item)}
    under_xdist = hasattr(config, "workerinput")

    def rank(item: pytest.Item) -> tuple[int, int]:
        name = item.path.name
        order = LAUNCHING_MODULES.index(name) if name in LAUNCHING_MODULES else len(LAUNCHING_MODULES)
        if under_xdist:
            return (0 if name in BACK_TO_BACK else 2 if name in LAUNCHING_MODULES else 1), order
        return (1 if item.path in asset_modules else 0), order

    items.sort(key=rank)  # stable: the order within each module is kept


@pytest.hookimpl(optionalhook=True)  # an xdist hook: the suite also runs without xdist
def pytest_xdist_make_scheduler(config, log):
    """``--dist loadfile`` (``scripts/test.sh``): each module in one worker; the modules launched back to back in one,
    the later launching modules in one.

    xdist's own grouping (``--dist loadgroup``) does not work with pytest 9 (it rewrites ``item._nodeid``, which
    pytest 9 no longer reads), hence a scheduler of its own.
    """
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class ModuleScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = super()._split_scope(nodeid)
            name = Path(module).name
            if name in BACK_TO_BACK + AFTER_THE_FIRST_LAUNCHES:  # in collection order: the launches first
                return LAUNCHES
            return LATER_LAUNCHES if name in LATER else module

    return ModuleScheduling(config, log)


def pytest_collection_finish(session):
    """Start building the demo assets in a process of its own if a selected test needs them and none are cached.

    The ``demo_assets`` fixture then waits for this build on the cache's lock (``ensure_assets``), or builds
    them itself if this one failed, raising the build's error in the test that needs it.
    """
    if session.config.option.collectonly or is_built():
        return
    if any(needs_demo_assets(item) for item in session.items):
        build = [sys.executable, "-m", "recipe.one_step_off_async.demo.assets"]
        session.config.stash[ASSET_BUILD] = subprocess.Popen(
            build, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )


def pytest_sessionfinish(session):
    build = session.config.stash.get(ASSET_BUILD, None)
    if build is not None and build.poll() is None:  # a session stopped before any test waited for it
        build.send_signal(signal.SIGINT)  # KeyboardInterrupt: the build removes its staging directory
        try:
            build.wait(timeout=30)
        except subprocess.TimeoutExpired:
            build.kill()
            build.wait()


@pytest.fixture(scope="session")
def cpu_ray():
    """A local Ray cluster whose workers run verl on the CPU platform (logical CPUs = device slots)."""
    import ray

    ray.init(num_cpus=16, runtime_env={"env_vars": CPU_ENV}, include_dashboard=False, log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="session")
def demo_assets():
    """The built-in tiny task (model, tokenizer, data, reward), built once into the cache dir."""
    from recipe.one_step_off_async.demo.assets import ensure_assets

    return ensure_assets()


@pytest.fixture(scope="session")
def one_step_off_run(tmp_path_factory, demo_assets):
    """One undisturbed run of the entry point (``e2e.one_step_off_overrides``), shared by the tests that check
    it and those that compare a disturbed run with it."""
    from e2e import one_step_off_overrides, run_main, wandb_offline

    directory = tmp_path_factory.mktemp("one_step_off")
    wandb_overrides, wandb_env = wandb_offline(directory)
    return run_main(directory, *one_step_off_overrides(), *wandb_overrides, env=wandb_env)
