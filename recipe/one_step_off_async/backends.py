"""The backends a config selects by their registered names, in one table.

Each rollout backend (``actor_rollout_ref.rollout.name``, ``reward.reward_model.rollout.name``) and each
checkpoint engine (``rollout.checkpoint_engine.backend``) with what it can run with and what it imports.

Why: the launch's checks (``async_config``) refuse a combination that cannot run and the preflight
(``preflight``) checks that what the config selects is installed: both read this table, so a backend is added
in one place. It imports nothing of the recipe.
"""

from __future__ import annotations

from dataclasses import dataclass

VLLM = "vllm"
SGLANG = "sglang"


@dataclass(frozen=True)
class RolloutBackend:
    """A rollout backend verl can serve replicas of."""

    name: str
    checkpoint_engines: tuple[str, ...]  # the checkpoint engines that can feed it the actor's weights
    devices: tuple[str, ...]  # the trainer.device values it runs on
    modules: tuple[str, ...]  # what it imports beyond the base install (preflight.REQUIREMENTS keys)
    # Its abort returns the tokens generated so far, which partial rollout continues from (vLLM: verl's
    # vLLMHttpServer.abort_all_requests, which pauses the engine and parks new requests until resume).
    resumes_aborted: bool = False


@dataclass(frozen=True)
class CheckpointEngine:
    """A weight-sync engine registered with verl's CheckpointEngineRegistry."""

    name: str
    modules: tuple[str, ...]  # what it imports beyond the base install (preflight.REQUIREMENTS keys)
    # It follows a change of the rollout pool's membership from one sync to the next (the elastic pool).
    follows_membership: bool = False
    # Its sync runs through verl's CheckpointEngineManager.update_weights, which aborts the running requests,
    # loads the weights and resumes generation: what partial rollout needs from a sync.
    aborts_and_resumes: bool = False
    cuda_only: bool = False  # it moves tensors through CUDA (cupy's NCCL): never on trainer.device=cpu


# nccl: verl's CUDA broadcast, consumed by vLLM/SGLang server adapters. gloo (CPU) and checkpoint (files): the
# recipe's engines (weight_sync/), run with vLLM (its CPU build on CPU), not yet with SGLang.
ROLLOUT_BACKENDS: dict[str, RolloutBackend] = {
    backend.name: backend
    for backend in (
        RolloutBackend(
            VLLM,
            ("nccl", "nixl", "mooncake", "kimi", "checkpoint", "gloo"),
            ("cpu", "cuda"),
            ("vllm",),
            resumes_aborted=True,
        ),
        RolloutBackend(SGLANG, ("nccl", "nixl", "mooncake", "kimi"), ("cuda",), ("sglang",)),
    )
}

# gloo and checkpoint follow the pool's membership (tested on CPU); nccl does with rebuild_group (a new group
# every sync; not run on GPUs yet), which async_config's checks ask for.
CHECKPOINT_ENGINES: dict[str, CheckpointEngine] = {
    engine.name: engine
    for engine in (
        CheckpointEngine("gloo", ("torch.distributed",), follows_membership=True, aborts_and_resumes=True),
        # Its files are written and read with safetensors, which verl installs.
        CheckpointEngine("checkpoint", (), follows_membership=True, aborts_and_resumes=True),
        CheckpointEngine("nccl", ("cupy.cuda.nccl",), follows_membership=True, aborts_and_resumes=True, cuda_only=True),
        CheckpointEngine("nixl", ("nixl", "cupy.cuda.nccl"), cuda_only=True),
        CheckpointEngine("mooncake", ("mooncake.engine",)),
        CheckpointEngine("kimi", ("checkpoint_engine",)),
        CheckpointEngine("naive", ()),
    )
}


def rollout_backends_on(device: str) -> tuple[str, ...]:
    """The rollout backends that run on ``trainer.device=device`` (a device no backend names counts as cuda)."""
    if not any(device in backend.devices for backend in ROLLOUT_BACKENDS.values()):
        device = "cuda"
    return tuple(name for name, backend in ROLLOUT_BACKENDS.items() if device in backend.devices)
