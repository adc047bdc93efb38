"""The recipe's actor worker: verl's ``ActorRolloutRefWorker``, its loss given each sample's score.

``topr`` splits samples by their score, which verl's policy-loss functions do not receive: after verl builds the
actor's loss in ``init_model``, this worker wraps it in ``losses.with_sample_scores``. Nothing else changes;
``tests/test_losses_on_cpu.py`` fails if verl stops building the loss that way.
"""

from __future__ import annotations

from verl.single_controller.base.decorator import Dispatch, register
from verl.workers.engine_workers import ActorRolloutRefWorker

from recipe.one_step_off_async.losses import with_sample_scores


class OneStepOffActorRolloutRefWorker(ActorRolloutRefWorker):
    """verl's actor/rollout/ref worker whose actor loss publishes each micro-batch's sample scores."""

    @register(dispatch_mode=Dispatch.ONE_TO_ALL)
    def init_model(self):
        super().init_model()
        if getattr(self, "loss_fn", None) is not None:
            self.loss_fn = with_sample_scores(self.loss_fn)
            self.actor.set_loss_fn(self.loss_fn)
