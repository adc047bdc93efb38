"""Shared fixtures. Every test here runs on CPU: the CPU platform is selected for the whole session."""

from __future__ import annotations

import pytest

from recipe.one_step_off_async import cpu

# Before any test touches verl: the platform is resolved once per process and cached.
CPU_ENV = cpu.activate()


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
