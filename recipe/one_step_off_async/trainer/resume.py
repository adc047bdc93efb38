"""Find and verify the checkpoint a run resumes from, before any weight is loaded.

verl 0.9.1 resolves the resume folder leniently: a tracker file pointing at a missing folder means "train from
scratch", a truncated shard is a zip-reader error inside a worker that names no file, and a rank's missing shard (a
node that saved to a folder the others do not share) a missing-file error inside that rank's worker. Each costs a
cluster allocation; these checks make each a clear error up front.
"""

from __future__ import annotations

import json
import os
import re
import zipfile
from pathlib import Path

from omegaconf import DictConfig
from verl.utils.checkpoint.checkpoint_manager import get_checkpoint_tracker_filename

from recipe.one_step_off_async.errors import CheckpointError

# The fields that decide whether saved weights fit the model being trained.
ARCHITECTURE_FIELDS = (
    "model_type",
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "tie_word_embeddings",
)
SHARD = re.compile(r"^(model|optim|extra_state)_world_size_(\d+)_rank_(\d+)\.pt$")


def resume_folder(trainer: DictConfig) -> Path | None:
    """The ``global_step_N`` folder verl will resume from, or None to start from scratch."""
    if trainer.resume_mode == "disable":
        return None
    if trainer.resume_mode == "resume_path":
        folder = Path(os.path.abspath(str(trainer.resume_from_path)))
        if not re.fullmatch(r"global_step_\d+", folder.name) or not folder.is_dir():
            raise CheckpointError(
                f"trainer.resume_from_path={trainer.resume_from_path} is not an existing global_step_<N> folder."
            )
        return folder
    root = Path(os.path.abspath(str(trainer.default_local_dir)))
    tracker = Path(get_checkpoint_tracker_filename(str(root)))
    if not tracker.exists():
        return None
    text = tracker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{tracker} should hold the last saved step, found {text!r}: the file is corrupt.")
    folder = root / f"global_step_{text}"
    if not folder.is_dir():
        raise CheckpointError(
            f"{tracker} points at step {text} but {folder} does not exist. Restore the folder, point the tracker "
            "at an existing checkpoint, or set trainer.resume_mode=disable to start from scratch."
        )
    return folder


def verify_checkpoint(folder: Path, model_path: str, actor_world_size: int) -> None:
    """Raise ``CheckpointError`` if ``folder`` is incomplete, truncated, or written for another model."""
    actor = folder / "actor"
    missing = [str(path) for path in (folder / "data.pt", actor) if not path.exists()]
    if missing:
        raise CheckpointError(f"Checkpoint {folder} is incomplete: {', '.join(missing)} missing.")

    shards = [(match, path) for path in sorted(actor.iterdir()) if (match := SHARD.match(path.name))]
    for kind in ("model", "optim", "extra_state"):
        if not any(match[1] == kind for match, _ in shards):
            raise CheckpointError(f"Checkpoint {actor} has no {kind}_world_size_*_rank_*.pt file: it is incomplete.")
    saved_world_sizes = {int(match[2]) for match, _ in shards}
    if saved_world_sizes != {actor_world_size}:
        raise CheckpointError(
            f"Checkpoint {actor} was written by {sorted(saved_world_sizes)} actor ranks but this run has "
            f"{actor_world_size} (trainer.nnodes x trainer.n_gpus_per_node); resume with the same actor layout."
        )
    for rank in range(actor_world_size):
        for kind in ("model", "optim", "extra_state"):
            name = f"{kind}_world_size_{actor_world_size}_rank_{rank}.pt"
            if not (actor / name).exists():
                raise CheckpointError(
                    f"Checkpoint {actor} lacks actor rank {rank}'s shard {name}: every rank 0..{actor_world_size - 1} "
                    "writes its model, optim and extra_state files, and a node whose folder the others do not share "
                    "keeps its ranks' to itself. Copy the file from the node that wrote it (save to a folder every "
                    "node shares), or resume from an earlier global_step_<N> (trainer.resume_mode=resume_path)."
                )

    for path in [folder / "data.pt", *(path for _, path in shards)]:
        if not zipfile.is_zipfile(path):  # torch.save writes a zip; truncation loses its central directory
            raise CheckpointError(
                f"Checkpoint file {path} is truncated or corrupt. Resume from an earlier "
                "global_step_<N> (trainer.resume_mode=resume_path) or start over (trainer.resume_mode=disable)."
            )

    saved_config = actor / "huggingface" / "config.json"
    current_config = Path(model_path) / "config.json"
    if saved_config.exists() and current_config.exists():
        saved, current = json.loads(saved_config.read_text()), json.loads(current_config.read_text())
        described = ", ".join(
            f"{field}: checkpoint {saved.get(field)!r} vs model {current.get(field)!r}"
            for field in ARCHITECTURE_FIELDS
            if saved.get(field) != current.get(field)
        )
        if described:
            raise CheckpointError(
                f"Checkpoint {saved_config} was written for a different model than actor_rollout_ref.model.path="
                f"{model_path} ({described}). Resume with the model it was trained from."
            )


def verify_resume_checkpoint(config: DictConfig) -> None:
    """Before Ray starts: the checkpoint this launch would resume from (if any) is complete and fits the model."""
    trainer = config.trainer
    folder = resume_folder(trainer)
    if folder is not None:
        verify_checkpoint(folder, config.actor_rollout_ref.model.path, trainer.nnodes * trainer.n_gpus_per_node)
