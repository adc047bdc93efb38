"""The GPU launch script and its data preparation, checked on CPU so they cannot rot silently."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pandas as pd
import pytest

from recipe.one_step_off_async.data import gsm8k

ROOT = Path(__file__).resolve().parents[1]


def prepared_gsm8k(tmp_path: Path) -> Path:
    """A two-row stand-in for the prepared GSM8K files: present, so the script skips the download."""
    data = tmp_path / "gsm8k"
    data.mkdir()
    questions = pd.DataFrame({"question": ["What is 2+2?"], "answer": ["2+2=4\n#### 4"]})
    for split in gsm8k.SPLITS:
        gsm8k.to_rl_rows(questions, split).to_parquet(data / f"{split}.parquet")
    return data


@pytest.mark.parametrize("attention", ["flash_attention_2", "sdpa"])
def test_launch_script_config_passes_the_recipe_validation(tmp_path, attention):
    data = prepared_gsm8k(tmp_path)
    result = subprocess.run(
        ["bash", str(ROOT / "run_qwen2_5_3b.sh")],
        cwd=tmp_path,
        env={
            **os.environ,
            "ENTRY_MODULE": "recipe.one_step_off_async.check_config",
            "DATA_DIR": str(data),
            "ATTN": attention,
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert (
        "config OK: staleness 1; actor 1x4 cuda; rollout vllm 1x4 (tp 1); weight sync nccl; "
        "model Qwen/Qwen2.5-3B-Instruct" in result.stdout
    )
    # The preflight (informational here, no GPU stack on CI) asks for flash-attn only when it is selected.
    assert ("flash_attn (flash-attn), selected by" in result.stdout) == (attention == "flash_attention_2")


def test_launch_script_rejects_what_the_recipe_cannot_run(tmp_path):
    data = prepared_gsm8k(tmp_path)
    result = subprocess.run(
        ["bash", str(ROOT / "run_qwen2_5_3b.sh"), "actor_rollout_ref.hybrid_engine=true", "trainer.foo=1"],
        cwd=tmp_path,
        env={**os.environ, "ENTRY_MODULE": "recipe.one_step_off_async.check_config", "DATA_DIR": str(data)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    assert "  1. trainer.foo=1: Could not override 'trainer.foo'. To append to your config use +trainer.foo=1" in (
        result.stderr
    )
    assert "  2. actor_rollout_ref.hybrid_engine=True" in result.stderr


def test_check_config_away_from_the_cluster_lists_what_this_machine_lacks_and_passes(tmp_path):
    """The data files live on the cluster: the script does not try to download them, the check names them as
    not found here (with the GPU backends), checks everything else and exits 0."""
    result = subprocess.run(
        ["bash", str(ROOT / "run_qwen2_5_3b.sh")],
        cwd=tmp_path,
        env={
            **os.environ,
            "ENTRY_MODULE": "recipe.one_step_off_async.check_config",
            "DATA_DIR": str(tmp_path / "on_the_cluster"),
        },
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert not (tmp_path / "on_the_cluster").exists()
    assert "config OK: staleness 1; actor 1x4 cuda" in result.stdout
    for split in ("train_files", "val_files"):
        assert f"data.{split}: {tmp_path / 'on_the_cluster'}" in result.stdout
    assert result.stdout.count("is not found on this machine") == 2


def test_gsm8k_preparation_from_a_local_copy(tmp_path):
    source = tmp_path / "copy"
    source.mkdir()
    rows = {
        "train": [{"question": "Tom has 3 apples and buys 1,200 more. How many?", "answer": "3+1200=1203\n#### 1,203"}],
        "test": [{"question": "What is 2-5?", "answer": "2-5=-3\n#### -3"}],
    }
    for split, records in rows.items():
        pd.DataFrame(records).to_json(source / f"{split}.jsonl", orient="records", lines=True)

    written = gsm8k.prepare(tmp_path / "out", source)

    train = pd.read_parquet(written["train"])
    assert list(train.columns) == ["data_source", "prompt", "ability", "reward_model", "extra_info"]
    row = train.iloc[0]
    assert row["data_source"] == "openai/gsm8k"
    assert row["reward_model"]["ground_truth"] == "1203"
    assert row["prompt"][0]["role"] == "user" and row["prompt"][0]["content"].endswith(gsm8k.INSTRUCTION)
    assert pd.read_parquet(written["test"]).iloc[0]["reward_model"]["ground_truth"] == "-3"


def test_gsm8k_solution_without_a_final_answer_is_a_clear_error():
    with pytest.raises(ValueError, match="no '#### <number>' final answer"):
        gsm8k.final_answer("the answer is 4")


def test_gsm8k_missing_local_copy_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="No train.*under"):
        gsm8k.prepare(tmp_path / "out", tmp_path)
