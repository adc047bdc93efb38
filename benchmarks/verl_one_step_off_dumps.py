"""Loaded into every process of verl's one-step-off run by ``benchmarks/compare_verl.py``: starts the data-dump
executor verl 0.9.1's ``OneStepOffRayTrainer.fit`` never starts (with ``trainer.rollout_data_dir`` or
``trainer.validation_data_dir`` set, its first dump raises ``AttributeError: ... no attribute '_dump_executor'``),
so the comparison can read the prompts and answers of its runs. Nothing else of verl's trainer changes."""

from verl.experimental.one_step_off_policy.ray_trainer import OneStepOffRayTrainer

_verls_fit = OneStepOffRayTrainer.fit


async def _fit_with_dumps(self):
    self._init_dump_executor()
    try:
        return await _verls_fit(self)
    finally:
        self._shutdown_dump_executor()


OneStepOffRayTrainer.fit = _fit_with_dumps
