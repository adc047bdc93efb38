"""When the actor's weights move to the rollout, and the weight versions each batch must then carry.

``SyncSchedule`` says which steps push weights: every ``sync_interval`` steps once the actor trains, and every step that
validates or saves a checkpoint (validation at step k evaluates v_k; a checkpoint at step k leaves the rollout at v_k,
so a run resumed from it continues with the versions of the uninterrupted run); its conditions are verl's
(``tests/test_platforms_verl_compat_on_cpu.py`` notices when they change). During the critic's warm-up
(``trainer.critic_warmup`` = W) the actor's weights are still v_0's: as in verl's ``_fit_update_weights``, steps before
W push nothing (but a validation or checkpoint step), and the batches launched then carry the last version synced.

``VersionContract`` checks every generated batch against the schedule and reports the versions it measured.
"""

from __future__ import annotations

from collections.abc import Callable

from omegaconf import DictConfig
from verl import DataProto

from recipe.one_step_off_async.async_config import AsyncTrainingConfig
from recipe.one_step_off_async.trainer.checks import check_token_versions, measured_weight_version
from recipe.one_step_off_async.trainer.hooks import StepHooks
from recipe.one_step_off_async.trainer.pipeline import expected_weight_version


class SyncSchedule:
    """Which training steps validate, save a checkpoint and push weights to the rollout."""

    def __init__(self, trainer_config: DictConfig, sync_interval: int, total_steps: int) -> None:
        self.test_freq, self.save_freq = trainer_config.test_freq, trainer_config.save_freq
        self.critic_warmup = trainer_config.get("critic_warmup", 0)
        self.sync_interval, self.total_steps = sync_interval, total_steps

    def validates_at(self, step: int) -> bool:
        """verl's ``_fit_validate`` condition: validation runs after the sync of this step."""
        return self.test_freq > 0 and (step >= self.total_steps or step % self.test_freq == 0)

    def saves_at(self, step: int) -> bool:
        """verl's ``_fit_save_checkpoint`` condition (less its unpredictable ESI-expiry saves)."""
        return self.save_freq > 0 and (step >= self.total_steps or step % self.save_freq == 0)

    def syncs_at(self, step: int) -> bool:
        trained = step >= self.critic_warmup  # verl's _fit_update_actor: critic_warmup <= global_steps
        return (trained and step % self.sync_interval == 0) or self.validates_at(step) or self.saves_at(step)


class VersionContract(StepHooks):
    """Checks each batch's weight versions against the contract; reports them: ``async/staleness`` is v_{k-1} minus
    the oldest version that sampled a token of the batch, ``async/staleness_{min,mean,max}`` weigh every token."""

    def __init__(
        self,
        async_config: AsyncTrainingConfig,
        schedule: SyncSchedule,
        rollout_name: str,
        first_step: Callable[[], int],
    ) -> None:
        self.staleness, self.partial_rollout = async_config.staleness, async_config.partial_rollout
        self.contract = f"staleness {async_config.staleness}, sync_interval {async_config.sync_interval}"
        self.schedule, self.rollout_name, self.first_step = schedule, rollout_name, first_step

    def batch_metrics(self, step: int, output: DataProto) -> dict[str, float]:
        base, syncs_at = self.first_step() - 1, self.schedule.syncs_at
        oldest = expected_weight_version(step, self.staleness, base, syncs_at)
        if self.partial_rollout:
            newest = expected_weight_version(step, 0, base, syncs_at)  # the last version synced before step k
            metrics = check_token_versions(step, output, oldest, newest, f"partial rollout, {self.contract}")
            version = step - 1 - int(metrics["async/staleness_max"])
        else:
            version = measured_weight_version(step, output, oldest, self.rollout_name, self.contract)
            metrics = {f"async/staleness_{stat}": float(step - 1 - version) for stat in ("min", "mean", "max")}
            metrics |= dict.fromkeys(
                ("async/partial_ratio", "async/version_span_max", "async/recomputed_prefill_tokens"), 0.0
            )
        return metrics | {"async/staleness": step - 1 - version, "async/weight_version": version}
