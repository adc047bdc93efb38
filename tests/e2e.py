"""Run the real entry point (``python -m recipe.one_step_off_async.main_ppo``) on CPU and read what it logged.

Each run gets its own directory (``recipe.one_step_off_async.runs`` launches it and reads it back): the
metrics (verl's ``file`` logger, one JSON line per step), the rollout dumps (``trainer.rollout_data_dir``: the
prompts trained at each step), checkpoints and the console output. ``main_until_ray`` runs the entry point's
body in the test process up to where Ray would start, for what a launch checks before it (seconds instead of
a launch).
"""

from __future__ import annotations

import json
import math
import os
import pickletools
import struct
import zipfile
from pathlib import Path
from unittest import mock

from recipe.one_step_off_async import runs
from recipe.one_step_off_async.async_config import DECOUPLED_OVERRIDES
from recipe.one_step_off_async.runs import Run

CPU_PROFILE = "one_step_off_ppo_cpu"
STEPS = 4
# Every launch of the suite (about twenty, on 2 cores, two at a time): without Ray's dashboard and the idle workers
# Ray prestarts for a first driver, which no test reads or uses, a launch costs ~10 s less CPU (of ~110 s).
LEAN_RAY = ("+ray_kwargs.ray_init.include_dashboard=false",)
LEAN_RAY_ENV = {"RAY_prestart_worker_first_driver": "0"}
# The elastic rollout pool (async_training.elastic), for the runs that use it.
ELASTIC = ("async_training.elastic.enable=true",)
# Whole batches, one weight version each: the exact per-batch contract the runs assert (async/weight_version =
# v_{k-1-s}, the dumps' versions). The profiles' default is partial rollout, whose bounds are per token: the runs
# of partial rollout set it after this (the last override wins), the convergence run keeps the default.
WHOLE_BATCHES = "async_training.partial_rollout=false"
ONE_STEP_OFF_STEPS = 8  # the shared run (conftest.one_step_off_run): also the reference of the resume chain

# Per recipe loss: extra overrides, a metric only it logs (or None), a metric it must not log (or None):
# proof that the Ray actor worker ran the recipe's loss, not verl's default PPO-clip `vanilla`.
LOSS_SIGNATURES = {
    "reinforce": ((), None, "actor/pg_clipfrac"),
    "topr": ((), "actor/topr_positive_frac", None),
    "tis_pg": ((), "actor/pg_clipfrac_lower", None),
    # The `+` key must survive verl's actor-config instantiation in the worker.
    "kimi15": (("+actor_rollout_ref.actor.policy_loss.kimi15_tau=0.5",), None, "actor/pg_clipfrac"),
}
# Which run carries which recipe loss: each loss runs end to end once.
ONE_STEP_OFF_LOSS = "topr"  # the shared run (conftest.one_step_off_run, test_e2e_main_on_cpu.py)
RESUME_LOSS = "kimi15"  # the resume chain (test_e2e_faults_on_cpu.py)
KILL_RUN_LOSS, JOIN_RUN_LOSS = "reinforce", "tis_pg"  # test_e2e_elastic_on_cpu.py
# verl's advantage estimators beyond GRPO (every other run) and GAE (test_e2e_trainer_features_on_cpu.py), one
# per run; the support matrix (docs/advance/one_step_off_async/support_matrix.md) names these runs.
RESUME_ESTIMATOR = "rloo"  # the resume chain
KILL_RUN_ESTIMATOR = "reinforce_plus_plus"  # the elastic run of staleness 0


def estimator_overrides(estimator: str) -> tuple[str, ...]:
    return (f"algorithm.adv_estimator={estimator}",)


def assert_estimator_ran(run, estimator: str) -> None:
    """The task runner prints the resolved config: the run trained with ``estimator``."""
    assert f"'adv_estimator': '{estimator}'" in run.output


def checkpoint_engine(weights_dir) -> tuple[str, ...]:
    """Overrides that move weights through files in ``weights_dir`` (the ``checkpoint`` engine)."""
    engine = "actor_rollout_ref.rollout.checkpoint_engine"
    return (f"{engine}.backend=checkpoint", f"+{engine}.engine_kwargs.checkpoint.dir={weights_dir}")


def loss_overrides(loss: str) -> tuple[str, ...]:
    return (f"actor_rollout_ref.actor.policy_loss.loss_mode={loss}", *LOSS_SIGNATURES[loss][0], *DECOUPLED_OVERRIDES)


def contract_version(step: int, staleness: int, interval: int, start: int = 0, critic_warmup: int = 0) -> int:
    """The documented contract with no validation in between: floor((k-1-s)/N)*N, at least the start; during the
    critic's warm-up (steps before ``critic_warmup``) nothing is synced."""
    version = (step - 1 - staleness) // interval * interval
    return version if version >= max(start, critic_warmup) else start


# verl's dapo reward manager around the demo's reward function (on the shared run): responses longer than 4 of
# the 6 tokens lose reward, the manager's own, visible effect.
DAPO_REWARD = (
    "reward.reward_manager.name=dapo",
    "+reward.reward_kwargs.overlong_buffer_cfg={enable:true,len:2,penalty_factor:1.0,log:true}",
    "+reward.reward_kwargs.max_resp_len=6",
)


def one_step_off_overrides() -> tuple[str, ...]:
    """The default pipeline (staleness 1, sync every step), undisturbed: the run other runs compare with."""
    return (
        "async_training.staleness=1",
        "async_training.sync_interval=1",
        f"trainer.total_training_steps={ONE_STEP_OFF_STEPS}",
        "trainer.val_before_train=false",
        "trainer.test_freq=-1",
        *loss_overrides(ONE_STEP_OFF_LOSS),
        *DAPO_REWARD,
    )


REQUIRED_METRICS = (
    "timing_s/step",
    "timing_s/wait_prev_gen",
    "timing_s/sync_weights",
    "timing_s/update_actor",
    "timing_s/gen",
    "async/staleness",
    "async/overlap_efficiency",
    "critic/score/mean",
    "actor/pg_loss",
    "rollout_corr/rollout_is_mean",  # the off-policy correction ran (verl skips it silently otherwise)
    "perf/throughput",
)


def assert_loss_ran(metrics: dict, loss: str) -> None:
    _, logged, not_logged = LOSS_SIGNATURES[loss]
    assert math.isfinite(metrics["actor/pg_loss"]), metrics["actor/pg_loss"]
    assert logged is None or logged in metrics, sorted(metrics)
    assert not_logged is None or not_logged not in metrics, sorted(metrics)


def assert_trained_with_staleness(
    run, staleness: int, interval: int, loss: str, steps: int, through_files: bool = False
) -> None:
    """Every step logged, with the required metrics, the loss's signature and the contract's weight version."""
    assert run.returncode == 0, run.output[-5000:]
    metrics = run.metrics
    assert sorted(metrics) == list(range(1, steps + 1))
    for step, values in metrics.items():
        missing = [key for key in REQUIRED_METRICS if key not in values]
        assert not missing, f"step {step} lacks {missing}"
        assert_loss_ran(values, loss)
        version = contract_version(step, staleness, interval)
        assert values["async/weight_version"] == version, f"step {step}"
        assert values["async/staleness"] == step - 1 - version
        assert values["async/synced"] == float(step % interval == 0)
        if step % interval:
            assert values["timing_s/sync_weights"] == 0.0
        elif through_files:
            assert values["checkpoint_engine/files"] >= 1  # the version went through the folder


def run_main(
    directory: Path,
    *overrides: str,
    checkpoints: Path | None = None,
    timeout_s: float = 600,
    env: dict | None = None,
    profile: str = CPU_PROFILE,
    whole_batches: bool = True,
) -> Run:
    """The entry point on ``profile`` in ``directory``, its batches dumped there; in whole batches unless
    ``overrides`` set partial rollout or ``whole_batches`` is false (the profile's default); past ``timeout_s``
    killed with every process it started (``subprocess.TimeoutExpired``)."""
    return runs.run(
        directory,
        runs.dump_rollouts(directory),
        *LEAN_RAY,
        *([WHOLE_BATCHES] if whole_batches else []),
        *overrides,
        profile=profile,
        checkpoints=checkpoints,
        timeout_s=timeout_s,
        env={**LEAN_RAY_ENV, **(env or {})},
    )


def wandb_offline(directory: Path) -> tuple[tuple[str, ...], dict]:
    """Overrides and environment that make a run also log to wandb offline, into ``directory`` (no account)."""
    return ("trainer.logger=[console,file,wandb]",), {"WANDB_MODE": "offline", "WANDB_DIR": str(directory)}


def wandb_offline_run(directory: Path) -> tuple[int | None, dict[int, dict]]:
    """The exit code the offline run in ``directory`` recorded (None: never finished) and its history by step.

    Reads wandb's transaction log (``run-*.wandb``: leveldb-log framed protobuf records, which wandb's
    Python package no longer reads itself): 32 KiB blocks of chunks, each a 7-byte header (CRC, length,
    type: 1 full, 2 first, 3 middle, 4 last) after the file's 7-byte header.
    """
    from wandb.proto import wandb_internal_pb2

    (log,) = directory.glob("wandb/offline-run-*/run-*.wandb")
    data, position, parts = log.read_bytes(), 7, []
    assert data.startswith(b":W&B"), data[:7]
    exit_code, history = None, {}
    while position + 7 <= len(data):
        if (block_left := 32 * 1024 - position % (32 * 1024)) < 7:  # a block's tail too short for a header
            position += block_left
            continue
        _, length, kind = struct.unpack("<IHB", data[position : position + 7])
        parts.append(data[position + 7 : position + 7 + length])
        position += 7 + length
        if kind not in (1, 4):
            continue
        record = wandb_internal_pb2.Record.FromString(b"".join(parts))
        parts = []
        if record.HasField("exit"):
            exit_code = record.exit.exit_code
        elif record.HasField("history"):
            row = {item.key or "/".join(item.nested_key): json.loads(item.value_json) for item in record.history.item}
            history.setdefault(int(row["_step"]), {}).update(row)
    return exit_code, history


def main_until_ray(*overrides: str, profile: str = CPU_PROFILE) -> None:
    """The entry point's body (``main_ppo.main``) in this process, on ``profile`` with ``overrides``.

    Raises what the launch would raise before Ray starts; reaching verl's ``run_ppo`` (which starts Ray)
    is an ``AssertionError``.
    """
    from hydra import compose, initialize_config_module
    from verl.trainer import main_ppo as verl_main_ppo

    from recipe.one_step_off_async import main_ppo

    with initialize_config_module(config_module="recipe.one_step_off_async.config", version_base=None):
        config = compose(config_name=profile, overrides=list(overrides))
    started_ray = AssertionError("the launch got as far as starting Ray")
    # HYDRA_FULL_ERROR=1: the launch's problems raise (LaunchProblems) instead of being printed.
    with (
        mock.patch.object(verl_main_ppo, "run_ppo", side_effect=started_ray),
        mock.patch.dict(os.environ, {"HYDRA_FULL_ERROR": "1"}),
    ):
        main_ppo.main(config)


_STRING_OPCODES = {"SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "SHORT_BINSTRING", "BINSTRING"}


def pickled_globals(folder: Path) -> dict[Path, set[str]]:
    """Every ``module:name`` that the pickles of ``folder``'s ``*.pt`` files (torch zip archives) import, by file.

    Read with ``pickletools``, never unpickled: what loading the file would import, without importing it.
    """
    found = {}
    for path in sorted(folder.rglob("*.pt")):
        with zipfile.ZipFile(path) as archive:
            members = [name for name in archive.namelist() if name.endswith(".pkl")]
            found[path] = set().union(*(_globals(archive.read(name)) for name in members))
    return found


def _globals(pickled: bytes) -> set[str]:
    # STACK_GLOBAL takes module and name from the stack: follow the strings pushed (and memoised) before it.
    imported, pushed, memo = set(), [], {}
    for opcode, arg, _ in pickletools.genops(pickled):
        if opcode.name in ("GLOBAL", "STACK_GLOBAL"):
            imported.add(arg.replace(" ", ":", 1) if opcode.name == "GLOBAL" else f"{pushed[-2]}:{pushed[-1]}")
            pushed.append(None)
        elif opcode.name in _STRING_OPCODES:
            pushed.append(arg)
        elif opcode.name == "MEMOIZE":
            memo[len(memo)] = pushed[-1]
        elif opcode.name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[arg] = pushed[-1]
        elif opcode.name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo[arg])
        elif opcode.stack_after:
            pushed.append(None)
    return imported
