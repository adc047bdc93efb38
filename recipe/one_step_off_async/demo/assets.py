"""Build-once cache of the demo assets: tokenizer, warm-started tiny Qwen2, RL parquet splits, reward.

What: ``ensure_assets(cache_dir, seed)`` returns a ``DemoAssets`` of absolute paths, building them
first if ``<cache_dir>/assets-<ASSETS_VERSION>-seed<seed>/`` does not exist yet::

    model/          tokenizer + Qwen2 weights + generation_config.json (load with from_pretrained)
    reward_model/   tokenizer + a Qwen2 sequence classifier (one label): reward.reward_model.model_path
    tool_model/     the model above, fine-tuned to call the demo's tool (tool_task.py)
    vision_model/   a tiny Qwen2.5-VL, randomly initialised, with its tokenizer and processor (vision_task.py)
    {,graded_,sort_long_,long_tail_,heavy_tail_,tool_,vision_}{train,val}.parquet   the tasks' splits in verl's RL format
    long_tail_agent_loop.yaml   registers the long-tail tasks' agent loop (long_tail.py)
    manifest.json   what was built and the warm start's val accuracy; written last

Why: the demo and the CPU tests must run offline and reproducibly: everything is generated from the seed (the
same weights on the same software stack). The build (about 45 s on one core) is renamed into place only when
complete, under an exclusive lock on ``<dir>.lock``: nothing half-built ever looks complete, and concurrent
callers build once and share. Bump ``ASSETS_VERSION`` whenever a change alters what the build writes.

How: ``python -m recipe.one_step_off_async.demo.assets [--cache-dir D] [--seed S]`` prints the paths and the
verl overrides that point a trainer at them.
"""

import argparse
import contextlib
import dataclasses
import fcntl
import json
import logging
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import OmegaConf

from recipe.one_step_off_async.demo import long_tail, tool_task, vision_task
from recipe.one_step_off_async.demo.evaluate import model_accuracy
from recipe.one_step_off_async.demo.model import init_model, init_reward_model, save_model
from recipe.one_step_off_async.demo.reward import compute_score, reward_function_path
from recipe.one_step_off_async.demo.task import (
    GRADED_DATA_SOURCE,
    LONG_DATA_SOURCE,
    LONG_NUM_LETTERS,
    MAX_PROMPT_LENGTH,
    MAX_RESPONSE_LENGTH,
    split_problems,
    to_rows,
    write_splits,
)
from recipe.one_step_off_async.demo.tokenizer import build_tokenizer
from recipe.one_step_off_async.demo.warm_start import reproducible_torch, warm_start

logger = logging.getLogger(__name__)

# v1: a tokenizer that did not survive save + reload; v2: no long-tail task; v3: no graded sort task;
# v4: no reward model; v5: no tool-use task; v6: no heavy-tail task; v7: no vision task; v8: no long sort task
ASSETS_VERSION = "v9"
CACHE_DIR_ENV = "ONE_STEP_OFF_ASSETS_DIR"
DEFAULT_CACHE_DIR = "~/.cache/one_step_off_async"
MANIFEST = "manifest.json"
MODEL_SUBDIR = "model"
REWARD_MODEL_SUBDIR = "reward_model"
TOOL_MODEL_SUBDIR = "tool_model"
VISION_MODEL_SUBDIR = "vision_model"


@dataclasses.dataclass(frozen=True)
class DemoAssets:
    """Absolute paths of one complete asset build, plus the numbers a trainer config needs."""

    root: str
    model_dir: str  # tokenizer and model; actor_rollout_ref.model.path
    reward_model_dir: str  # tokenizer and a sequence classifier; reward.reward_model.model_path
    train_file: str
    val_file: str
    reward_path: str  # file holding the reward function; reward.custom_reward_function.path
    reward_name: str  # reward.custom_reward_function.name
    max_prompt_length: int  # every prompt is exactly this many tokens, chat template included
    max_response_length: int  # longest correct answer, eos included
    seed: int
    val_greedy_accuracy: float  # of the warm-started model, measured by the build
    val_sampled_accuracy: float  # same, one sample per prompt at temperature 1
    graded_train_file: str  # the graded sort task: same problems, partial credit
    graded_val_file: str
    sort_long_train_file: str  # the long sort task: eight letters, partial credit
    sort_long_val_file: str
    long_tail_train_file: str  # the long-tail task (long_tail.py), same model and reward
    long_tail_val_file: str
    long_tail_agent_loop_config: str  # actor_rollout_ref.rollout.agent.agent_loop_config_path
    heavy_tail_train_file: str  # the heavy-tail task (long_tail.HEAVY_TAIL): budgets drawn per sample
    heavy_tail_val_file: str
    tool_model_dir: str  # the tool-use task (tool_task.py): the model fine-tuned to call the tool
    tool_train_file: str
    tool_val_file: str
    tool_function_path: str  # actor_rollout_ref.rollout.multi_turn.function_tool_path (tools.py)
    vision_model_dir: str  # the vision task (vision_task.py): a tiny Qwen2.5-VL with its processor
    vision_train_file: str
    vision_val_file: str

    def verl_overrides(self) -> list[str]:
        """Hydra overrides of verl's ppo_trainer config that select these assets."""
        return [
            f"data.train_files={self.train_file}",
            f"data.val_files={self.val_file}",
            f"data.max_prompt_length={self.max_prompt_length}",
            f"data.max_response_length={self.max_response_length}",
            f"actor_rollout_ref.model.path={self.model_dir}",
            f"reward.custom_reward_function.path={self.reward_path}",
            f"reward.custom_reward_function.name={self.reward_name}",
        ]


def register_resolver() -> None:
    """``${demo_asset:model_dir}`` (any ``DemoAssets`` field) in a config: a path of the built-in task, built on first use."""
    OmegaConf.register_new_resolver("demo_asset", lambda field: str(getattr(ensure_assets(), field)), replace=True)


class DemoAssetsCallback(Callback):
    """Named in the ``hydra.callbacks`` of the profiles that train the built-in task: Hydra runs it before the
    command, so their ``${demo_asset:...}`` paths resolve; the recipe's commands themselves never import the demo."""

    def on_job_start(self, config: Any, **kwargs: Any) -> None:  # run and multirun alike
        register_resolver()


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache: ``cache_dir``, else ``$ONE_STEP_OFF_ASSETS_DIR``, else ``~/.cache/one_step_off_async``."""
    base = cache_dir if cache_dir is not None else os.environ.get(CACHE_DIR_ENV, DEFAULT_CACHE_DIR)
    return Path(base).expanduser().resolve()


def asset_dir(cache_dir: str | os.PathLike | None, seed: int) -> Path:
    """Where ``ensure_assets`` keeps the build for ``seed`` under ``cache_dir`` (see the module docstring)."""
    return cache_root(cache_dir) / f"assets-{ASSETS_VERSION}-seed{seed}"


def is_built(cache_dir: str | os.PathLike | None = None, seed: int = 0) -> bool:
    """Whether the cache holds a build for ``seed``: builds appear there only by an atomic rename when complete."""
    return asset_dir(cache_dir, seed).exists()


def ensure_assets(cache_dir: str | os.PathLike | None = None, seed: int = 0) -> DemoAssets:
    """Return the assets for ``seed``, building them first if they are not in the cache yet."""
    root = asset_dir(cache_dir, seed)
    root.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root.with_name(root.name + ".lock")):
        if not is_built(cache_dir, seed):
            staging = Path(tempfile.mkdtemp(prefix=f".{root.name}.building-", dir=root.parent))
            try:
                _build(staging, seed)
                staging.rename(root)
            finally:  # a failed build leaves nothing (a killed one leaves its staging folder, never read)
                if staging.exists():
                    shutil.rmtree(staging)
        return _load(root, seed)


@contextlib.contextmanager
def exclusive_lock(lock_path: Path) -> Iterator[None]:
    """Held by one process at a time (an ``flock`` on ``lock_path``, released when the file is closed)."""
    with open(lock_path, "a") as lock_file:
        fcntl.flock(lock_file, fcntl.LOCK_EX)
        yield


def _build(out_dir: Path, seed: int) -> None:
    started = time.perf_counter()
    logger.info("building demo assets (seed %d) in %s", seed, out_dir)
    tokenizer = build_tokenizer()
    problems = split_problems(seed)
    data_files = [
        *write_splits(problems, out_dir).values(),
        *write_splits(problems, out_dir, GRADED_DATA_SOURCE, prefix="graded_").values(),
        *write_splits(split_problems(seed, LONG_NUM_LETTERS), out_dir, LONG_DATA_SOURCE, prefix="sort_long_").values(),
        *long_tail.write_splits(out_dir, seed).values(),
        *long_tail.write_splits(out_dir, seed, long_tail.HEAVY_TAIL).values(),
        *tool_task.write_splits(problems, out_dir).values(),
        *vision_task.write_splits(out_dir, seed).values(),
    ]
    agent_loop_config = long_tail.write_agent_loop_config(out_dir)
    val_rows = to_rows(problems["val"], "val")
    with reproducible_torch():
        model = init_model(tokenizer, seed)
        warm_start(model, tokenizer, problems["train"], seed)
        greedy = model_accuracy(model, tokenizer, val_rows)
        sampled = model_accuracy(model, tokenizer, val_rows, temperature=1.0, seed=seed)
        save_model(model, tokenizer, out_dir / MODEL_SUBDIR)
        tool_task.warm_start_tool_use(model, tokenizer, problems["train"], seed)
    save_model(model, tokenizer, out_dir / TOOL_MODEL_SUBDIR)
    save_model(init_reward_model(tokenizer, seed + 1), tokenizer, out_dir / REWARD_MODEL_SUBDIR)
    vision_task.build_model_dir(out_dir / VISION_MODEL_SUBDIR, seed)
    # A data file's field of DemoAssets is its name's stem and "_file" (train.parquet: train_file).
    files = {f"{path.stem}_file": path.name for path in data_files} | {
        "model_dir": MODEL_SUBDIR,
        "reward_model_dir": REWARD_MODEL_SUBDIR,
        "tool_model_dir": TOOL_MODEL_SUBDIR,
        "vision_model_dir": VISION_MODEL_SUBDIR,
        "long_tail_agent_loop_config": agent_loop_config.name,
    }
    manifest = {
        "version": ASSETS_VERSION,
        "seed": seed,
        "files": files,
        "val_greedy_accuracy": greedy,
        "val_sampled_accuracy": sampled,
        "build_seconds": round(time.perf_counter() - started, 1),
    }
    (out_dir / MANIFEST).write_text(json.dumps(manifest, indent=2, sort_keys=True) + "\n")
    logger.info("built demo assets: val accuracy greedy %.3f, sampled %.3f", greedy, sampled)


def _load(root: Path, seed: int) -> DemoAssets:
    manifest_path = root / MANIFEST
    if not manifest_path.is_file():
        raise RuntimeError(
            f"{root} exists but has no {MANIFEST}, so it is not a complete demo asset build "
            "(builds appear there only by an atomic rename when complete). Delete it and call ensure_assets again."
        )
    manifest = json.loads(manifest_path.read_text())
    if (manifest["version"], manifest["seed"]) != (ASSETS_VERSION, seed):
        raise RuntimeError(
            f"{manifest_path} describes version {manifest['version']} seed {manifest['seed']}, expected "
            f"{ASSETS_VERSION} seed {seed}; delete {root} and call ensure_assets again."
        )
    files = {name: root / relative for name, relative in manifest["files"].items()}
    missing = sorted(str(path) for path in files.values() if not path.exists())
    if missing:
        raise RuntimeError(f"demo asset build {root} lacks {missing}; delete {root} and call ensure_assets again.")
    return DemoAssets(
        root=str(root),
        **{name: str(path) for name, path in files.items()},
        reward_path=reward_function_path(),
        reward_name=compute_score.__name__,
        max_prompt_length=MAX_PROMPT_LENGTH,
        max_response_length=MAX_RESPONSE_LENGTH,
        seed=seed,
        val_greedy_accuracy=manifest["val_greedy_accuracy"],
        val_sampled_accuracy=manifest["val_sampled_accuracy"],
        tool_function_path=str(Path(tool_task.__file__).with_name("tools.py").resolve()),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description="Build (once) and print the one-step-off demo assets.")
    parser.add_argument("--cache-dir", help=f"cache root; default ${CACHE_DIR_ENV}, else {DEFAULT_CACHE_DIR}")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    assets = ensure_assets(args.cache_dir, args.seed)
    print(json.dumps(dataclasses.asdict(assets), indent=2))
    print("verl overrides:\n  " + " \\\n  ".join(assets.verl_overrides()))


if __name__ == "__main__":
    main()
