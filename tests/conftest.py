"""Shared fixtures. Every test here runs on CPU: the CPU platform is selected for the whole session."""

from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from recipe.one_step_off_async import verl_plugin
from recipe.one_step_off_async.demo.assets import register_resolver

# What a CPU launch gives this process and every Ray worker (platform, the recipe's plugin), set up before
# any test touches verl: the platform is resolved once per process and cached.
CPU_RUN = OmegaConf.create({"trainer": {"device": "cpu"}, "async_training": {"one_gpu": False}})
CPU_ENV = verl_plugin.activate(CPU_RUN)
# The CPU profile's ${demo_asset:...} paths, for tests that compose it with Hydra's compose API (the
# commands get the resolver from the profile's Hydra callback).
register_resolver()


def pytest_collection_modifyitems(items):
    """e2e, convergence and network tests are slow too: ``-m "not slow"`` is the fast loop."""
    for item in items:
        if any(item.get_closest_marker(name) for name in ("e2e", "convergence", "network")):
            item.add_marker(pytest.mark.slow)


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
