"""Resume-folder resolution and checkpoint verification: every broken checkpoint is a named error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from recipe.one_step_off_async.errors import CheckpointError
from recipe.one_step_off_async.trainer.resume import resume_folder, verify_checkpoint, verify_resume_checkpoint

MODEL_CONFIG = {"model_type": "qwen2", "vocab_size": 275, "hidden_size": 128, "num_hidden_layers": 2}


def trainer_config(root: Path, mode: str = "auto", path: str | None = None):
    return OmegaConf.create({"resume_mode": mode, "resume_from_path": path, "default_local_dir": str(root)})


def write_checkpoint(root: Path, step: int = 4, world_size: int = 1, model_config: dict | None = None) -> Path:
    folder = root / f"global_step_{step}"
    actor = folder / "actor"
    (actor / "huggingface").mkdir(parents=True)
    for kind in ("model", "optim", "extra_state"):
        for rank in range(world_size):
            torch.save({"w": torch.ones(3)}, actor / f"{kind}_world_size_{world_size}_rank_{rank}.pt")
    (actor / "huggingface" / "config.json").write_text(json.dumps(model_config or MODEL_CONFIG))
    torch.save({"epoch": 0, "dataloader": {}}, folder / "data.pt")
    (root / "latest_checkpointed_iteration.txt").write_text(str(step))
    return folder


@pytest.fixture
def model_dir(tmp_path) -> Path:
    path = tmp_path / "model"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({**MODEL_CONFIG, "torch_dtype": "float32"}))
    return path


def test_no_tracker_means_from_scratch_and_disable_ignores_checkpoints(tmp_path):
    assert resume_folder(trainer_config(tmp_path)) is None
    write_checkpoint(tmp_path)
    assert resume_folder(trainer_config(tmp_path, mode="disable")) is None


def test_tracker_selects_the_latest_folder(tmp_path, model_dir):
    folder = write_checkpoint(tmp_path)
    assert resume_folder(trainer_config(tmp_path)) == folder
    verify_checkpoint(folder, str(model_dir), actor_world_size=1)


def test_tracker_pointing_at_a_missing_folder_is_an_error_not_a_fresh_start(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("7")
    with pytest.raises(CheckpointError, match="points at step 7 but .*global_step_7 does not exist"):
        resume_folder(trainer_config(tmp_path))


def test_garbled_tracker_is_an_error(tmp_path):
    (tmp_path / "latest_checkpointed_iteration.txt").write_text("\x00\x00")
    with pytest.raises(CheckpointError, match="should hold the last saved step"):
        resume_folder(trainer_config(tmp_path))


def test_resume_path_must_be_an_existing_step_folder(tmp_path):
    with pytest.raises(CheckpointError, match="is not an existing global_step_<N> folder"):
        resume_folder(trainer_config(tmp_path, mode="resume_path", path=str(tmp_path / "global_step_3")))


@pytest.mark.parametrize(
    "victim", ["data.pt", "actor/model_world_size_1_rank_0.pt", "actor/optim_world_size_1_rank_0.pt"]
)
def test_truncated_file_is_named(tmp_path, model_dir, victim):
    folder = write_checkpoint(tmp_path)
    path = folder / victim
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match=f"Checkpoint file {path} is truncated or corrupt"):
        verify_checkpoint(folder, str(model_dir), actor_world_size=1)


def test_missing_shard_or_data_position_is_named(tmp_path, model_dir):
    folder = write_checkpoint(tmp_path)
    (folder / "actor" / "extra_state_world_size_1_rank_0.pt").unlink()
    with pytest.raises(CheckpointError, match="has no extra_state_world_size_\\*_rank_\\*.pt file"):
        verify_checkpoint(folder, str(model_dir), actor_world_size=1)
    (folder / "data.pt").unlink()
    with pytest.raises(CheckpointError, match="data.pt missing"):
        verify_checkpoint(folder, str(model_dir), actor_world_size=1)


def test_checkpoint_of_another_model_shape_is_named(tmp_path, model_dir):
    folder = write_checkpoint(tmp_path, model_config={**MODEL_CONFIG, "hidden_size": 64})
    with pytest.raises(
        CheckpointError, match="config.json was written for a different model .*hidden_size: checkpoint 64 vs model 128"
    ):
        verify_checkpoint(folder, str(model_dir), actor_world_size=1)


def test_checkpoint_of_another_actor_layout_is_named(tmp_path, model_dir):
    folder = write_checkpoint(tmp_path, world_size=2)
    with pytest.raises(CheckpointError, match="written by \\[2\\] actor ranks but this run has 1"):
        verify_checkpoint(folder, str(model_dir), actor_world_size=1)


@pytest.mark.parametrize(("kind", "rank"), [("model", 0), ("optim", 2), ("extra_state", 3)])
def test_a_ranks_missing_shard_is_named_before_ray(tmp_path, model_dir, kind, rank):
    """The world size matches, but one rank's file is missing (a node saved to a folder the others do not share)."""
    folder = write_checkpoint(tmp_path, world_size=4)
    name = f"{kind}_world_size_4_rank_{rank}.pt"
    (folder / "actor" / name).unlink()
    config = OmegaConf.create(
        {
            "trainer": {**trainer_config(tmp_path), "nnodes": 1, "n_gpus_per_node": 4},
            "actor_rollout_ref": {"model": {"path": str(model_dir)}},
        }
    )
    with pytest.raises(CheckpointError) as caught:
        verify_resume_checkpoint(config)
    assert str(caught.value).startswith(f"Checkpoint {folder / 'actor'} lacks actor rank {rank}'s shard {name}:")
    assert "every rank 0..3 writes its model, optim and extra_state files" in str(caught.value)
