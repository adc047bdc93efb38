"""The Ray cluster a launch runs on: one it starts, or a running one it joins (``ray start`` on every node, then the
launch on the head). Joining, ``prepare_ray_init`` drops the keys Ray refuses there (the cluster's size) with a notice
each, and sends the nodes through Ray's runtime env what they do not inherit from the driver: its verl, vLLM and
collective-library variables, and the recipe's code (``py_modules``). ``node_local_problem`` names the shared folders
on storage one node sees, once the cluster spans several hosts.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import psutil
from omegaconf import DictConfig, OmegaConf, open_dict
from ray._private.runtime_env.constants import RAY_JOB_CONFIG_JSON_ENV_VAR

from recipe.one_step_off_async.schema import Problems

RAY_INIT = "ray_kwargs.ray_init"
# What ray.init refuses when it joins a running cluster (ray/_private/worker.py: "... must not be provided").
SIZING_KEYS = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config", "_node_name")
ACCEPTED_WHEN_EMPTY = ("_system_config",)
FORWARDED_PREFIXES = ("VERL_", "VLLM_", "NCCL_", "GLOO_")  # verl's, vLLM's and the collective libraries' variables
# Not sent: what each node sets for itself (network interfaces and devices, addresses, ports), and secrets (the config
# holding the runtime env is printed and tracked).
NODE_OWN_SUFFIXES = ("_IFNAME", "_HCA", "_TOPO_FILE", "_HOST_IP", "_MASTER_IP", "_PORT")
SECRETS = "KEY|TOKEN|SECRET|PASSWORD"


RECIPE_PACKAGE = Path(__file__).resolve().parents[1]  # the top-level ``recipe`` package
NODE_LOCAL_FILESYSTEMS = ("tmpfs", "ramfs")
# The folders every node of the run reads or writes: a value of None or a missing key is skipped.
CHECKPOINT_ENGINE_DIR = "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.checkpoint.dir"
SHARED_FOLDERS = ("data.train_files", "data.val_files", "trainer.default_local_dir", CHECKPOINT_ENGINE_DIR)


def running_cluster(config: DictConfig) -> str | None:
    """The running cluster ``ray.init`` will join, by Ray's own rule (the ``address``, else ``RAY_ADDRESS``, else what
    ``ray start`` left here), or None when it starts one; ``ConnectionError`` for ``address=auto`` and none to join."""
    from ray._private.services import canonicalize_bootstrap_address

    ray_init = OmegaConf.select(config, RAY_INIT) or {}
    return canonicalize_bootstrap_address(ray_init.get("address"), ray_init.get("_temp_dir"))


def prepare_ray_init(config: DictConfig) -> Problems:
    """Fit ``ray_kwargs.ray_init`` to the cluster the launch will run on (in place); print a notice per dropped key."""
    try:
        address = running_cluster(config)
    except (ConnectionError, ValueError) as error:
        return Problems(
            [
                f"{RAY_INIT}.address={OmegaConf.select(config, f'{RAY_INIT}.address')!r} (or RAY_ADDRESS="
                f"{os.environ.get('RAY_ADDRESS')!r}): {error}. Start the cluster first (`ray start --head` on this "
                "node), name it (RAY_ADDRESS=<head ip>:6379), or unset both to start one with the launch."
            ]
        )
    if address is None:
        return Problems()  # the workers of a cluster the launch starts inherit its environment and see its code
    if OmegaConf.select(config, "async_training.one_gpu", default=False) is True:
        why = "shares one GPU through logical GPUs only a Ray cluster the launch starts has"
        unset = f"Unset RAY_ADDRESS and {RAY_INIT}.address (or stop the `ray start` cluster here)"
        return Problems([f"async_training.one_gpu=true {why}, but it would join the cluster at {address}. {unset}."])
    with open_dict(config):
        ray_init = OmegaConf.select(config, RAY_INIT)
        runtime_env = ray_init.runtime_env
        if RAY_JOB_CONFIG_JSON_ENV_VAR not in os.environ:  # under `ray job submit`, the job's runtime env applies
            sent = {k: v for k, v in os.environ.items() if k.startswith(FORWARDED_PREFIXES)}
            sent = {k: v for k, v in sent.items() if not k.endswith(NODE_OWN_SUFFIXES) and not re.search(SECRETS, k)}
            runtime_env.env_vars = {**sent, **(runtime_env.get("env_vars") or {})}
            modules = list(runtime_env.get("py_modules") or [])
            if not runtime_env.get("working_dir") and str(RECIPE_PACKAGE) not in modules:
                runtime_env.py_modules = [*modules, str(RECIPE_PACKAGE)]
        for key in SIZING_KEYS:
            value = ray_init.get(key)
            if value is not None and (value or key not in ACCEPTED_WHEN_EMPTY):
                shown = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
                flag = key.strip("_").replace("_", "-")
                print(
                    f"[launch] {RAY_INIT}.{key}={shown} dropped: the launch joins the running Ray cluster at "
                    f"{address}, whose nodes declare their own (ray start --{flag}).",
                    file=sys.stderr,
                    flush=True,
                )
                ray_init[key] = None
    return Problems()


def filesystem_type(path: str | os.PathLike) -> str:
    """The type of the filesystem ``path`` (or its nearest existing parent) is on: ``ext4``, ``nfs``, ``tmpfs``..."""
    resolved = Path(path).resolve()
    mounts = {Path(part.mountpoint): part.fstype for part in psutil.disk_partitions(all=True)}
    best = max((mount for mount in mounts if resolved.is_relative_to(mount)), key=lambda m: len(m.parts), default=None)
    return mounts.get(best, "")


def node_local_paths(config: DictConfig) -> list[str]:
    """The folders of ``SHARED_FOLDERS`` on a filesystem only this node sees, as ``key=path (type)``."""
    found = []
    for key in SHARED_FOLDERS:
        value = OmegaConf.select(config, key, default=None)
        for path in value if isinstance(value, list | tuple) or OmegaConf.is_list(value) else [value]:
            local = isinstance(path, str) and "://" not in path  # a URI (gs://, hdfs://) is no folder of a node
            if local and (kind := filesystem_type(path)) in NODE_LOCAL_FILESYSTEMS:
                found.append(f"{key}={path} ({kind})")
    engine = OmegaConf.select(config, "actor_rollout_ref.rollout.checkpoint_engine", default={}) or {}
    if engine.get("backend") == "checkpoint" and OmegaConf.select(config, CHECKPOINT_ENGINE_DIR, default=None) is None:
        found.append(f"{CHECKPOINT_ENGINE_DIR} unset (a fresh folder under /dev/shm)")
    return found


def node_local_problem(config: DictConfig, hosts: set[str]) -> str | None:
    """Why the run cannot span ``hosts`` (the cluster's node addresses) with its folders where they are, or None."""
    if not (found := node_local_paths(config) if len(hosts) > 1 else []):
        return None
    return (
        f"The Ray cluster spans {len(hosts)} hosts ({', '.join(sorted(hosts))}), but these folders are on storage only "
        f"one node sees: {'; '.join(found)}. Point them at a filesystem every node mounts (NFS, Lustre, a cloud "
        "bucket mounted with FUSE) and relaunch."
    )
