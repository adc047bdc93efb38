"""The named points of a training step at which the trainer calls its features, and the list that calls them all.

A feature (the rollout pool, the weight-version contract, the engines' statistics) is an object with these hooks.
The trainer calls one ``StepHookList``, never a feature by name, so a new feature registers itself in
``OneStepOffRayTrainer._features`` and changes nothing else in the trainer.

Per step, in order: ``batch_metrics`` once the step's generated batch is in (a hook may raise to refuse the batch);
``poll`` after the actor trained; ``before_sync`` and ``after_sync`` around the weight sync of a step that syncs;
``metrics`` and then ``publish`` at the end of the step. ``explain_failure`` when a generation or a sync failed (the
first feature that names a cause wins); ``close`` when the run ends, however it ends.
"""

from __future__ import annotations

from collections.abc import Iterable

from verl import DataProto


class StepHooks:
    """Every hook, doing nothing: a feature overrides the ones it needs."""

    def batch_metrics(self, step: int, output: DataProto) -> dict[str, float]:
        return {}

    def poll(self, step: int) -> None:
        pass

    def before_sync(self, step: int) -> None:
        pass

    def after_sync(self, step: int) -> None:
        pass

    def metrics(self) -> dict[str, float]:
        return {}

    def publish(self, step: int) -> None:
        pass

    def explain_failure(self, step: int) -> Exception | None:
        return None

    def close(self) -> None:
        pass


def _on_every_feature(hook: str, merge: bool = False):
    """The ``hook`` of ``StepHookList``: calls it on every feature in order; ``merge``: merges what they return."""

    def call(self, *args):
        results = [getattr(feature, hook)(*args) for feature in self.features]
        return {key: value for result in results for key, value in result.items()} if merge else None

    return call


class StepHookList(StepHooks):
    """Calls each hook on every feature, in registration order; metrics are merged."""

    def __init__(self, features: Iterable[StepHooks]) -> None:
        self.features = list(features)

    batch_metrics = _on_every_feature("batch_metrics", merge=True)
    metrics = _on_every_feature("metrics", merge=True)
    poll = _on_every_feature("poll")
    before_sync = _on_every_feature("before_sync")
    after_sync = _on_every_feature("after_sync")
    publish = _on_every_feature("publish")

    def explain_failure(self, step: int) -> Exception | None:
        return next((cause for feature in self.features if (cause := feature.explain_failure(step))), None)

    def close(self) -> None:
        """Close every feature, even after one failed to close; raise the first failure."""
        first_error: Exception | None = None
        for feature in self.features:
            try:
                feature.close()
            except Exception as error:  # the others still close
                first_error = first_error or error
        if first_error is not None:
            raise first_error
