"""Bad training data is handled at dataset build, with the recipe's config: documented, never silent."""

from __future__ import annotations

import pandas as pd
from verl.trainer.ppo.utils import create_rl_dataset
from verl.utils import hf_tokenizer
from verl_actor import cpu_config


def test_prompts_longer_than_max_prompt_length_are_dropped_not_truncated(tmp_path, demo_assets):
    rows = pd.read_parquet(demo_assets.train_file).iloc[:6].copy()
    long_prompt = [{"role": "user", "content": "sort " + "abcdefghij" * 5}]  # far past max_prompt_length
    rows.loc[rows.index[:2], "prompt"] = pd.Series([long_prompt, long_prompt], index=rows.index[:2])
    path = tmp_path / "with_long_prompts.parquet"
    rows.to_parquet(path)

    config = cpu_config(demo_assets.model_dir)
    assert config.data.filter_overlong_prompts  # the recipe's default: verl's agent loop would truncate
    dataset = create_rl_dataset([str(path)], config.data, hf_tokenizer(demo_assets.model_dir), None, is_train=True)

    assert len(dataset) == 4
    kept = {dataset[i]["raw_prompt"][0]["content"] for i in range(len(dataset))}
    assert kept == {p[0]["content"] for p in rows["prompt"].iloc[2:]}
