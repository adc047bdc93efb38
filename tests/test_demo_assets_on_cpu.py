"""Tests of the built-in demo assets (recipe/one_step_off_async/demo): tokenizer, data, reward,
warm-started model, and the build-once cache. The checks of the build read the session's build (the
``demo_assets`` fixture: built once into the cache, about a minute on one core); everything else is cheap.

    pytest tests/test_demo_assets_on_cpu.py
"""

import asyncio
import dataclasses
import io
import json
import shutil
import string
import sys
import threading
import time
from pathlib import Path

import datasets
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
from omegaconf import OmegaConf
from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig, Qwen2ForCausalLM
from verl.trainer.ppo.reward import get_custom_reward_fn
from verl.utils import hf_tokenizer
from verl.utils.dataset.rl_dataset import RLHFDataset
from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

from recipe.one_step_off_async.demo import assets as assets_module
from recipe.one_step_off_async.demo import long_tail, tool_task
from recipe.one_step_off_async.demo.assets import ASSETS_VERSION, CACHE_DIR_ENV, asset_dir, ensure_assets
from recipe.one_step_off_async.demo.evaluate import accuracy, generate_responses
from recipe.one_step_off_async.demo.model import init_model
from recipe.one_step_off_async.demo.reward import compute_score, reward_function_path
from recipe.one_step_off_async.demo.task import (
    DATA_SOURCE,
    GRADED_DATA_SOURCE,
    LONG_DATA_SOURCE,
    LONG_MAX_PROMPT_LENGTH,
    LONG_MAX_RESPONSE_LENGTH,
    LONG_NUM_LETTERS,
    MAX_PROMPT_LENGTH,
    MAX_RESPONSE_LENGTH,
    NUM_LETTERS,
    NUM_TRAIN,
    NUM_VAL,
    PROMPT_PREFIX,
    ROW_SCHEMA,
    split_problems,
    write_splits,
)
from recipe.one_step_off_async.demo.tokenizer import build_tokenizer, encode_chat_prompt
from recipe.one_step_off_async.demo.warm_start import reproducible_torch, warm_start

# The warm-started model's val accuracy must leave room to improve and give GRPO a signal.
# Measured for seeds 0/1/2: greedy 0.30/0.33/0.29, sampled at temperature 1 0.27/0.27/0.23.
GREEDY_BAND = (0.2, 0.45)
SAMPLED_BAND = (0.1, 0.45)

USER_TURN = [{"role": "user", "content": "sort dbeca"}]


@pytest.fixture(scope="module")
def built(demo_assets):
    """The session's build (``conftest.demo_assets``, seed 0, under the default cache dir): (cache_dir, DemoAssets)."""
    return Path(demo_assets.root).parent, demo_assets


@pytest.fixture(scope="module")
def assets(built):
    return built[1]


@pytest.fixture
def isolated_hf_datasets_cache(tmp_path, monkeypatch):
    """RLHFDataset reads parquet through `datasets`, which caches under ~/.cache unless told otherwise."""
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", str(tmp_path / "hf-datasets"))


# --- tokenizer -----------------------------------------------------------------------------------


def test_tokenizer_round_trips_any_text_one_token_per_ascii_character():
    tokenizer = build_tokenizer()
    text = "sort dbeca\n\n  x\t12+34= 'll 's " + string.printable + " wörld ✓"
    assert tokenizer.decode(tokenizer.encode(text)) == text
    assert len(tokenizer.encode(string.printable)) == len(string.printable)


def test_chat_template_renders_chatml_with_and_without_generation_prompt():
    tokenizer = build_tokenizer()
    conversation = [*USER_TURN, {"role": "assistant", "content": "abcde"}]
    assert (
        tokenizer.apply_chat_template(conversation, tokenize=False)
        == "<|im_start|>user\nsort dbeca<|im_end|>\n<|im_start|>assistant\nabcde<|im_end|>\n"
    )
    assert (
        tokenizer.apply_chat_template(USER_TURN, add_generation_prompt=True, tokenize=False)
        == "<|im_start|>user\nsort dbeca<|im_end|>\n<|im_start|>assistant\n"
    )
    tokens = tokenizer.convert_ids_to_tokens(encode_chat_prompt(tokenizer, USER_TURN))
    assert tokens[:3] == ["<|im_start|>", "user", "Ċ"]  # role names and "\n" are single tokens
    assert tokens[-5:] == ["<|im_end|>", "Ċ", "<|im_start|>", "assistant", "Ċ"]
    assert len(tokens) == MAX_PROMPT_LENGTH


def test_saved_tokenizer_loads_unchanged_through_transformers_and_verl(assets):
    built_here = build_tokenizer()
    for loaded in (AutoTokenizer.from_pretrained(assets.model_dir), hf_tokenizer(assets.model_dir)):
        assert type(loaded) is type(built_here)
        assert (loaded.eos_token, loaded.pad_token) == ("<|im_end|>", "<|endoftext|>")
        assert (loaded.eos_token_id, loaded.pad_token_id) == (built_here.eos_token_id, built_here.pad_token_id)
        assert loaded.get_vocab() == built_here.get_vocab()
        assert encode_chat_prompt(loaded, USER_TURN) == encode_chat_prompt(built_here, USER_TURN)
        assert loaded.decode(loaded.encode("a b\nc")) == "a b\nc"


def test_verl_qwen_continuous_token_builder_renders_the_same_prompt(assets):
    tokenizer = hf_tokenizer(assets.model_dir)
    builder = create_continuous_token_builder(tokenizer, hf_model_type="qwen2")
    assert builder.build_initial_tokens(USER_TURN) == encode_chat_prompt(tokenizer, USER_TURN)


# --- model ---------------------------------------------------------------------------------------


def test_model_loads_as_tiny_fp32_qwen2_with_generation_config(assets):
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir)
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    assert isinstance(model, Qwen2ForCausalLM)
    assert model.dtype == torch.float32
    assert not model.config.tie_word_embeddings
    assert model.config.vocab_size == len(tokenizer)
    assert sum(p.numel() for p in model.parameters()) < 1_000_000
    generation_config = GenerationConfig.from_pretrained(assets.model_dir)
    assert (generation_config.eos_token_id, generation_config.pad_token_id) == (
        tokenizer.eos_token_id,
        tokenizer.pad_token_id,
    )


def test_warm_start_is_reproducible_and_seeded():
    tokenizer = build_tokenizer()
    problems = split_problems(0)["train"]

    def weights(seed: int) -> dict[str, torch.Tensor]:
        with reproducible_torch():
            model = init_model(tokenizer, seed)
            warm_start(model, tokenizer, problems, seed, steps=3)
        return model.state_dict()

    first, again, other_seed = weights(0), weights(0), weights(1)
    assert all(torch.equal(first[name], again[name]) for name in first)
    assert not torch.equal(first["lm_head.weight"], other_seed["lm_head.weight"])


def test_reproducible_torch_restores_global_settings():
    threads, deterministic = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    with reproducible_torch():
        assert torch.get_num_threads() == 1
    assert (torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()) == (threads, deterministic)


# --- data ----------------------------------------------------------------------------------------


def test_parquet_rows_follow_verl_rl_format(assets):
    tables = {split: pq.read_table(path) for split, path in (("train", assets.train_file), ("val", assets.val_file))}
    assert {split: table.num_rows for split, table in tables.items()} == {"train": NUM_TRAIN, "val": NUM_VAL}
    letters = {}
    for split, table in tables.items():
        assert table.schema.remove_metadata() == ROW_SCHEMA
        rows = table.to_pylist()
        for index, row in enumerate(rows):
            assert row["data_source"] == DATA_SOURCE
            [message] = row["prompt"]
            assert message["role"] == "user" and message["content"].startswith(PROMPT_PREFIX)
            letters_to_sort = message["content"].removeprefix(PROMPT_PREFIX)
            assert row["reward_model"] == {"style": "rule", "ground_truth": "".join(sorted(letters_to_sort))}
            assert row["extra_info"] == {"index": index, "split": split}
        letters[split] = {row["prompt"][0]["content"] for row in rows}
        assert len(letters[split]) == len(rows)
    assert not letters["train"] & letters["val"]


def test_graded_task_asks_the_same_problems_under_its_own_data_source(assets):
    exact, graded = (pq.read_table(path).to_pylist() for path in (assets.val_file, assets.graded_val_file))
    assert [row["data_source"] for row in graded] == [GRADED_DATA_SOURCE] * NUM_VAL
    assert [{**row, "data_source": DATA_SOURCE} for row in graded] == exact
    assert pq.read_table(assets.graded_train_file).num_rows == NUM_TRAIN


def test_long_sort_task_asks_eight_letters_graded_within_its_profiles_lengths(assets):
    """The rows of ``one_step_off_ppo_cpu_sort_long``: 8 letters, partial credit, every prompt exactly the profile's
    data.max_prompt_length tokens and every answer (with eos) within its data.max_response_length."""
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    profile = OmegaConf.load(Path(assets_module.__file__).parents[1] / "config" / "one_step_off_ppo_cpu_sort_long.yaml")
    assert (profile.data.max_prompt_length, profile.data.max_response_length) == (
        LONG_MAX_PROMPT_LENGTH,
        LONG_MAX_RESPONSE_LENGTH,
    )
    for path, rows in ((assets.sort_long_train_file, NUM_TRAIN), (assets.sort_long_val_file, NUM_VAL)):
        table = pq.read_table(path).to_pylist()
        assert len(table) == rows
        for row in table:
            letters = row["prompt"][0]["content"].removeprefix(PROMPT_PREFIX)
            assert row["data_source"] == LONG_DATA_SOURCE and len(letters) == LONG_NUM_LETTERS
            assert row["reward_model"]["ground_truth"] == "".join(sorted(letters))
            assert len(encode_chat_prompt(tokenizer, row["prompt"])) == LONG_MAX_PROMPT_LENGTH
    assert compute_score(LONG_DATA_SOURCE, "aabcdeff", "aabcdeff") == 1.0
    assert compute_score(LONG_DATA_SOURCE, "abcdef", "aabcdeff") == pytest.approx(1 / 8)  # repeats dropped


def test_every_prompt_and_answer_fits_the_documented_lengths(assets):
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    for path in (assets.train_file, assets.val_file):
        for row in pq.read_table(path).to_pylist():
            assert len(encode_chat_prompt(tokenizer, row["prompt"])) == MAX_PROMPT_LENGTH
            answer = row["reward_model"]["ground_truth"]
            assert len(tokenizer.encode(answer)) + 1 <= MAX_RESPONSE_LENGTH  # + eos


def test_rlhf_dataset_loads_every_row_within_max_prompt_length(assets, isolated_hf_datasets_cache):
    tokenizer = hf_tokenizer(assets.model_dir)

    def load(max_prompt_length: int) -> RLHFDataset:
        config = OmegaConf.create({"max_prompt_length": max_prompt_length, "filter_overlong_prompts": True})
        return RLHFDataset(assets.val_file, tokenizer, config)

    dataset = load(assets.max_prompt_length)
    assert len(dataset) == NUM_VAL
    first = dataset[0]
    assert first["raw_prompt"] == first["prompt"] and first["index"] == 0
    assert len(load(assets.max_prompt_length - 1)) == 0  # every prompt is exactly max_prompt_length


def test_same_seed_writes_identical_files_and_another_seed_differs(tmp_path):
    def write(name: str, seed: int) -> dict[str, bytes]:
        out_dir = tmp_path / name
        out_dir.mkdir()
        build_tokenizer().save_pretrained(out_dir)
        write_splits(split_problems(seed), out_dir)
        return {path.name: path.read_bytes() for path in sorted(out_dir.iterdir())}

    first, again, other_seed = write("a", 0), write("b", 0), write("c", 1)
    assert {"train.parquet", "val.parquet", "tokenizer.json"} <= set(first)
    assert first == again
    assert other_seed["train.parquet"] != first["train.parquet"]
    assert other_seed["val.parquet"] != first["val.parquet"]


# --- reward --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("aabbc", 1.0),
        ("  aabbc\n", 1.0),
        ("abc", 0.0),  # the warm start's flaw: repeats dropped
        ("aabbcc", 0.0),
        ("", 0.0),
        ("<|im_end|>aabbc", 0.0),
        ("\x00\ufffd✓" * 100, 0.0),
    ],
)
def test_reward_scores_exact_sorted_letters_and_never_raises_on_garbage(response, score):
    assert compute_score(DATA_SOURCE, response, "aabbc") == score


@pytest.mark.parametrize(
    ("response", "score"),
    [
        ("aabbc", 1.0),
        ("  aabbc\n", 1.0),
        ("aabcb", 0.6),  # the last two letters swapped
        ("abc", 0.2),  # repeats dropped: only the first letter is in its place
        ("aabbcc", 5 / 6),  # an extra letter costs a position
        ("aab", 0.6),
        ("", 0.0),
        ("<|im_end|>aabbc", 0.0),
        ("\x00\ufffd✓" * 100, 0.0),
    ],
)
def test_graded_reward_gives_credit_per_position_and_never_raises_on_garbage(response, score):
    assert compute_score(GRADED_DATA_SOURCE, response, "aabbc") == pytest.approx(score)


def test_reward_rejects_rows_of_another_dataset():
    with pytest.raises(ValueError, match="openai/gsm8k"):
        compute_score("openai/gsm8k", "42", "42")


def test_reward_loads_through_verl_custom_reward_function():
    config = OmegaConf.create(
        {"reward": {"custom_reward_function": {"path": reward_function_path(), "name": "compute_score"}}}
    )
    reward_fn = get_custom_reward_fn(config)
    kwargs = {"data_source": DATA_SOURCE, "ground_truth": "abcde", "extra_info": {"index": 0, "split": "val"}}
    assert reward_fn(solution_str="abcde", **kwargs) == 1.0
    assert reward_fn(solution_str="edcba", **kwargs) == 0.0


def test_verl_overrides_name_keys_of_verls_ppo_trainer_config(assets):
    import verl.trainer.config

    config_dir = verl.trainer.config.__path__[0]
    ppo_config = OmegaConf.load(f"{config_dir}/_generated_ppo_trainer.yaml")
    OmegaConf.set_struct(ppo_config, True)  # an override of a key verl does not have raises
    merged = OmegaConf.merge(ppo_config, OmegaConf.from_dotlist(assets.verl_overrides()))
    assert merged.reward.custom_reward_function.path == reward_function_path()
    assert merged.actor_rollout_ref.model.path == assets.model_dir
    assert merged.data.max_prompt_length == MAX_PROMPT_LENGTH


# --- warm-started model --------------------------------------------------------------------------


def test_warm_started_model_accuracy_is_in_band(assets):
    greedy = accuracy(assets.model_dir, assets.val_file)
    sampled = accuracy(assets.model_dir, assets.val_file, temperature=1.0, seed=0)
    assert GREEDY_BAND[0] <= greedy <= GREEDY_BAND[1]
    assert SAMPLED_BAND[0] <= sampled <= SAMPLED_BAND[1]
    assert (assets.val_greedy_accuracy, assets.val_sampled_accuracy) == (greedy, sampled)


def test_warm_started_model_mostly_drops_repeats_like_its_teacher(assets):
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir).eval()
    rows = [
        row
        for row in pq.read_table(assets.val_file).to_pylist()
        if len(set(row["reward_model"]["ground_truth"])) < NUM_LETTERS
    ]
    responses = generate_responses(model, tokenizer, [row["prompt"] for row in rows], temperature=0.0, seed=0)
    deduplicated = ["".join(sorted(set(row["reward_model"]["ground_truth"]))) for row in rows]
    assert sum(map(str.__eq__, responses, deduplicated)) >= 0.5 * len(rows)


def test_batched_generation_with_left_padding_matches_one_by_one(assets):
    tokenizer = AutoTokenizer.from_pretrained(assets.model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.model_dir).eval()
    prompts = [USER_TURN, [{"role": "user", "content": "sort ab"}], [{"role": "user", "content": "sort jihgfedcba"}]]
    batched = generate_responses(model, tokenizer, prompts, temperature=0.0, seed=0)
    assert batched == [generate_responses(model, tokenizer, [p], temperature=0.0, seed=0)[0] for p in prompts]


# --- build-once cache ----------------------------------------------------------------------------


def test_cached_build_is_reused_without_rebuilding(built, monkeypatch):
    cache_dir, first = built
    monkeypatch.setattr(assets_module, "_build", _must_not_build)
    assert ensure_assets(cache_dir, seed=0) == first


def test_build_lives_under_the_cache_dir_with_its_manifest(built):
    cache_dir, first = built
    root = cache_dir / f"assets-{ASSETS_VERSION}-seed0"
    assert first.root == str(root)
    assert {first.model_dir, first.train_file, first.val_file} == {
        str(root / n) for n in ("model", "train.parquet", "val.parquet")
    }
    manifest = json.loads((root / "manifest.json").read_text())
    assert (manifest["version"], manifest["seed"], manifest["val_greedy_accuracy"]) == (
        ASSETS_VERSION,
        0,
        first.val_greedy_accuracy,
    )


def test_directory_without_manifest_is_not_taken_as_complete(tmp_path, monkeypatch):
    root = asset_dir(tmp_path, 0)
    (root / "model").mkdir(parents=True)
    (root / "train.parquet").write_bytes(b"half")
    monkeypatch.setattr(assets_module, "_build", _must_not_build)
    with pytest.raises(RuntimeError, match="not a complete demo asset build"):
        ensure_assets(tmp_path, seed=0)


def test_manifest_of_another_build_is_rejected(built, tmp_path):
    _, first = built
    shutil.copytree(first.root, asset_dir(tmp_path, 7))
    with pytest.raises(RuntimeError, match=f"expected {ASSETS_VERSION} seed 7"):
        ensure_assets(tmp_path, seed=7)


def test_crashed_build_leaves_no_asset_directory(tmp_path, monkeypatch):
    def crash(*args, **kwargs):
        raise RuntimeError("warm start crashed")

    monkeypatch.setattr(assets_module, "warm_start", crash)
    with pytest.raises(RuntimeError, match="warm start crashed"):
        ensure_assets(tmp_path, seed=0)
    assert [path.name for path in tmp_path.iterdir()] == [f"assets-{ASSETS_VERSION}-seed0.lock"]


def test_concurrent_callers_build_once_and_share(built, tmp_path, monkeypatch):
    _, reference = built
    build_calls = []
    release_build = threading.Event()

    def copy_reference_build(out_dir, seed):
        build_calls.append(seed)
        release_build.wait(timeout=5)  # hold the lock while the other caller arrives
        shutil.copytree(reference.root, out_dir, dirs_exist_ok=True)

    monkeypatch.setattr(assets_module, "_build", copy_reference_build)
    results = [None, None]

    def call(slot):
        results[slot] = ensure_assets(tmp_path, seed=0)

    threads = [threading.Thread(target=call, args=(slot,)) for slot in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # let the second caller reach the lock while the first one builds
    release_build.set()
    for thread in threads:
        thread.join(timeout=30)
    assert build_calls == [0]
    assert results[0] == results[1] is not None
    assert results[0].root == str(asset_dir(tmp_path, 0))


def test_cache_dir_defaults_to_env_var_then_home(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_DIR_ENV, str(tmp_path / "from-env"))
    assert asset_dir(None, 3) == tmp_path / "from-env" / f"assets-{ASSETS_VERSION}-seed3"
    monkeypatch.delenv(CACHE_DIR_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert asset_dir(None, 3) == tmp_path / "home" / ".cache" / "one_step_off_async" / f"assets-{ASSETS_VERSION}-seed3"


def test_cli_prints_paths_and_verl_overrides(built, monkeypatch, capsys):
    cache_dir, first = built
    monkeypatch.setattr(sys, "argv", ["assets", "--cache-dir", str(cache_dir), "--seed", "0"])
    monkeypatch.setattr(assets_module, "_build", _must_not_build)
    assets_module.main()
    out = capsys.readouterr().out
    printed, overrides = out.split("verl overrides:")
    assert json.loads(printed) == dataclasses.asdict(first)
    assert all(override in overrides for override in first.verl_overrides())


def _must_not_build(out_dir, seed):
    raise AssertionError("ensure_assets rebuilt assets that were already in the cache")


# --- the long-tail task -------------------------------------------------------------------------------


def test_long_tail_budgets_are_long_tailed_reproducible_and_fit_the_model():
    budgets = np.array(long_tail.response_budgets(4096, seed=0))
    assert long_tail.response_budgets(4096, seed=0) == budgets.tolist()
    median, p99 = np.median(budgets), np.percentile(budgets, 99)
    assert median == long_tail.LONG_TAIL.median and p99 / median >= 8
    assert budgets.min() >= long_tail.MIN_BUDGET and budgets.max() <= long_tail.MAX_RESPONSE_LENGTH
    assert build_tokenizer().model_max_length >= long_tail.MAX_PROMPT_LENGTH + long_tail.MAX_RESPONSE_LENGTH


def test_long_tail_rows_load_through_verl_naming_their_agent_loop(assets, isolated_hf_datasets_cache):
    tokenizer = hf_tokenizer(assets.model_dir)
    config = OmegaConf.create({"max_prompt_length": long_tail.MAX_PROMPT_LENGTH, "filter_overlong_prompts": True})
    dataset = RLHFDataset(assets.long_tail_val_file, tokenizer, config)
    assert len(dataset) == long_tail.NUM_VAL
    row = dataset[0]
    assert row["agent_name"] == long_tail.AGENT_LOOP_NAME
    assert row["raw_prompt"][0]["content"].startswith(long_tail.PROMPT_PREFIX)
    assert row["extra_info"]["response_budget"] >= long_tail.MIN_BUDGET
    registered = OmegaConf.load(assets.long_tail_agent_loop_config)
    assert registered[0].name == long_tail.AGENT_LOOP_NAME
    assert registered[0]._target_.endswith("long_tail_agent_loop.BudgetedAgentLoop")


@pytest.mark.parametrize(
    ("response", "score"), [("aaaa", 1.0), ("aabb", 0.5), ("", 0.0), ("aaaaaaaa", 1.0), ("<|im_end|>ab", 0.25)]
)
def test_long_tail_reward_is_the_share_of_the_budget_written_as_the_letter(response, score):
    extra_info = {"index": 0, "split": "val", "response_budget": 4}
    assert compute_score(long_tail.DATA_SOURCE, response, "a", extra_info) == score


def test_long_tail_agent_loop_generates_exactly_the_budget_and_returns_it(monkeypatch):
    from verl.experimental.agent_loop.agent_loop import AgentLoopOutput
    from verl.experimental.agent_loop.single_turn_agent_loop import SingleTurnAgentLoop

    from recipe.one_step_off_async.demo.long_tail_agent_loop import BudgetedAgentLoop

    seen = {}

    async def run(self, sampling_params, **kwargs):
        seen.update(sampling_params)
        return AgentLoopOutput(prompt_ids=[1], response_ids=[2], response_mask=[1], num_turns=2, metrics={})

    monkeypatch.setattr(SingleTurnAgentLoop, "run", run)
    loop = BudgetedAgentLoop.__new__(BudgetedAgentLoop)
    output = asyncio.run(loop.run({"temperature": 1.0}, extra_info={"index": 0, "response_budget": 37, "split": "val"}))
    assert seen == {"temperature": 1.0, "max_tokens": 37, "ignore_eos": True}
    assert output.extra_fields["extras"] == {long_tail.SAMPLE_BUDGET_KEY: 37}
    # A heavy-tail training row: the budget drawn for the sample, sent to the engine and handed to the reward.
    (row,) = long_tail.to_rows(1, "train", seed=0, shape=long_tail.HEAVY_TAIL)
    output = asyncio.run(loop.run({"temperature": 1.0}, extra_info=row["extra_info"]))
    assert output.extra_fields["extras"] == {long_tail.SAMPLE_BUDGET_KEY: seen["max_tokens"]}
    assert (
        compute_score(long_tail.DATA_SOURCE, "a" * seen["max_tokens"], "a", row["extra_info"] | output.extra_fields)
        == 1.0
    )


# --- the heavy-tail task (the generation-bound profile) ------------------------------------------------


def heavy_tail_sample_budgets(samples_per_row: int) -> np.ndarray:
    rows = long_tail.to_rows(long_tail.NUM_TRAIN, "train", seed=0, shape=long_tail.HEAVY_TAIL)
    budgets = long_tail.SampleBudgets()
    return np.array([[budgets.draw(row["extra_info"]) for _ in range(samples_per_row)] for row in rows])


def test_heavy_tail_budgets_vary_within_groups_with_a_heavier_tail_and_a_few_percent_at_the_cap():
    budgets = heavy_tail_sample_budgets(4)
    median, p99 = np.median(budgets), np.percentile(budgets, 99)
    assert median == long_tail.HEAVY_TAIL.median and p99 / median >= 15
    assert 0.01 <= (budgets == long_tail.MAX_RESPONSE_LENGTH).mean() <= 0.05
    assert budgets.min() >= long_tail.MIN_BUDGET
    # Within a group the log-budgets spread about as much as HEAVY_TAIL.sample_sigma says (less the clipping).
    assert np.log(budgets).std(axis=1, ddof=1).mean() > 0.6 * long_tail.HEAVY_TAIL.sample_sigma


def test_heavy_tail_validation_rows_keep_their_problems_budget():
    (row,) = long_tail.to_rows(1, "val", seed=0, shape=long_tail.HEAVY_TAIL)
    assert row["extra_info"]["budget_sigma"] == long_tail.HEAVY_TAIL.sample_sigma
    budgets = long_tail.SampleBudgets()
    assert {budgets.draw(row["extra_info"]) for _ in range(20)} == {row["extra_info"]["response_budget"]}


def test_a_groups_drawn_budgets_do_not_depend_on_the_order_its_samples_arrive_in():
    rows = long_tail.to_rows(2, "train", seed=0, shape=long_tail.HEAVY_TAIL)
    in_order, interleaved = long_tail.SampleBudgets(), long_tail.SampleBudgets()
    first = [in_order.draw(row["extra_info"]) for row in rows for _ in range(4)]
    second = [interleaved.draw(row["extra_info"]) for _ in range(4) for row in rows]
    assert sorted(first[:4]) == sorted(second[0::2]) and sorted(first[4:]) == sorted(second[1::2])
    assert len(set(first[:4])) > 1  # the samples of one problem differ


def test_verls_reward_manager_scores_the_samples_drawn_budget_not_its_problems():
    """The agent loop's extra fields reach verl's reward as ``extra_info`` (naive reward manager, 0.9.1)."""
    from tensordict import TensorDict
    from verl import DataProto
    from verl.experimental.reward_loop.reward_manager.naive import NaiveRewardManager

    tokenizer = build_tokenizer()
    response = torch.tensor([tokenizer.convert_tokens_to_ids("a")] * 4)
    batch = TensorDict(
        {"responses": response[None], "attention_mask": torch.ones(1, 5, dtype=torch.long)}, batch_size=[1]
    )
    row_info = {"index": 0, "split": "train", "response_budget": 100, "budget_sigma": 1.0}
    data = DataProto(
        batch=batch,
        non_tensor_batch={
            "data_source": np.array([long_tail.DATA_SOURCE], dtype=object),
            "reward_model": np.array([{"style": "rule", "ground_truth": "a"}], dtype=object),
            "extra_info": np.array([row_info], dtype=object),
            "tool_extra_fields": np.array([{"extras": {long_tail.SAMPLE_BUDGET_KEY: 4}}], dtype=object),
        },
    )

    async def score() -> float:
        manager = NaiveRewardManager(OmegaConf.create({}), tokenizer, compute_score)
        return (await manager.run_single(data))["reward_score"]

    assert asyncio.run(score()) == 1.0  # "aaaa" against the sample's 4 tokens (the row's 100 would give 0.04)


def test_a_heavy_tail_sample_whose_drawn_budget_did_not_reach_the_reward_is_refused():
    (row,) = long_tail.to_rows(1, "train", seed=0, shape=long_tail.HEAVY_TAIL)
    with pytest.raises(ValueError, match="reward.reward_manager.name=naive"):
        compute_score(long_tail.DATA_SOURCE, "aaaa", "a", row["extra_info"])


# --- the tool-use task ---------------------------------------------------------------------------


def test_tool_use_rows_name_verls_tool_agent_loop_and_ask_the_sort_problems(assets):
    rows = pq.read_table(assets.tool_train_file).to_pylist()
    assert {row["agent_name"] for row in rows} == {"tool_agent"}
    assert {row["data_source"] for row in rows} == {tool_task.DATA_SOURCE}
    assert [row["prompt"] for row in rows] == [row["prompt"] for row in pq.read_table(assets.train_file).to_pylist()]


def test_tool_use_model_mostly_calls_the_tool_with_the_prompts_letters(assets):
    tokenizer = AutoTokenizer.from_pretrained(assets.tool_model_dir)
    model = AutoModelForCausalLM.from_pretrained(assets.tool_model_dir).eval()
    rows = pq.read_table(assets.tool_val_file).to_pylist()[:32]
    prompts = [encode_chat_prompt(tokenizer, row["prompt"]) for row in rows]
    calls = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        for prompt, row in zip(prompts, rows, strict=True):
            output = model.generate(
                torch.tensor([prompt]),
                generation_config=GenerationConfig(
                    max_new_tokens=tool_task.MAX_RESPONSE_LENGTH,
                    do_sample=True,
                    top_k=0,
                    eos_token_id=tokenizer.eos_token_id,
                    pad_token_id=tokenizer.pad_token_id,
                ),
            )
            text = tokenizer.decode(output[0, len(prompt) :], skip_special_tokens=True)
            calls += text == tool_task.tool_call(row["prompt"][0]["content"].removeprefix(PROMPT_PREFIX))
    assert calls >= 0.4 * len(rows), calls  # sampled at temperature 1; the teacher calls it in 75%


@pytest.mark.parametrize(
    ("response", "score"),
    [
        (
            '<tool_call>{"name": "sort_letters", "arguments": {"letters": "dbeca"}}</tool_call>\ntool\nabcde\nassistant\nabcde',
            1.0,
        ),
        ("abcde", 1.0),  # answered directly
        (
            '<tool_call>{"name": "sort_letters", "arguments": {"letters": "dbeca"}}</tool_call>\ntool\nabcde\nassistant\nabde',
            0.0,
        ),
        ('<tool_call>{"name": "sort_letters"', 0.0),  # a call cut off: no answer
    ],
)
def test_tool_use_reward_scores_the_final_answer(response, score):
    assert compute_score(tool_task.DATA_SOURCE, response, "abcde") == score


def test_vision_task_rows_carry_their_picture_and_the_tiny_vlm_sees_it(assets):
    """The vision task's model, tokenizer and image processor load without torchvision, and the pixels reach the
    model (its next-token probabilities move with the picture); what a launch on it needs is in the support matrix."""
    from PIL import Image
    from transformers import Qwen2_5_VLForConditionalGeneration

    from recipe.one_step_off_async.demo import vision_task

    rows = pq.read_table(assets.vision_train_file).to_pylist()
    assert len(rows) == vision_task.NUM_TRAIN and {row["reward_model"]["ground_truth"] for row in rows} == set(
        vision_task.COLOURS
    )
    tokenizer = AutoTokenizer.from_pretrained(assets.vision_model_dir)
    processor = vision_task.image_processor()
    model = Qwen2_5_VLForConditionalGeneration.from_pretrained(assets.vision_model_dir).eval()
    chat = [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": vision_task.QUESTION}]}]
    text = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    pad = "<|image_pad|>"
    ids = tokenizer(text.replace(pad, pad * vision_task.IMAGE_TOKENS), return_tensors="pt").input_ids
    assert ids.shape[1] == vision_task.MAX_PROMPT_LENGTH

    def next_token_logprobs(png: bytes) -> torch.Tensor:
        pixels = processor(images=[Image.open(io.BytesIO(png))], return_tensors="pt")
        with torch.inference_mode():
            out = model(input_ids=ids, mm_token_type_ids=(ids == tokenizer.convert_tokens_to_ids(pad)).long(), **pixels)
        return out.logits[0, -1].log_softmax(-1)

    red, blue = (
        next(row["images"][0]["bytes"] for row in rows if row["reward_model"]["ground_truth"] == c)
        for c in ("red", "blue")
    )
    assert torch.equal(next_token_logprobs(red), next_token_logprobs(red))
    assert (next_token_logprobs(red) - next_token_logprobs(blue)).abs().max() > 0.05  # 0.2 measured
    assert vision_task.score_colour(" red\n", "red") == 1.0 and vision_task.score_colour("redd", "red") == 0.0
