"""A real multi-node Ray cluster on this machine, for end-to-end tests: each node its own raylet (Ray's
``cluster_utils.Cluster``, which Ray's own fault tests use), joined by a launch as a user's ``ray start`` cluster is
(``RAY_ADDRESS``).

Nodes are sized in whole CPUs, so where a launch's pools land is decided by capacity: with one CPU a node, each of
the task runner, the training pool and every rollout replica (one CPU slot each on the CPU profile) takes a node of
its own. The cluster keeps Ray's "current cluster" pointer in a temp dir of its own (``RAY_TMPDIR``), so no other
``ray.init()`` on the machine joins it, and ``shutdown`` ends every process it started, whatever happened to them.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
from ray.cluster_utils import Cluster

TESTS_DIR = Path(__file__).resolve().parent


class LocalCluster:
    """A head node and ``len(cpus) - 1`` worker nodes, node ``i`` with ``cpus[i]`` CPUs; the tests' modules are on
    every node's ``PYTHONPATH`` (the in-process faults run in the cluster's workers)."""

    def __init__(self, cpus: list[int]) -> None:
        # Short: Ray's socket paths under it must fit in 107 characters.
        self.temp_dir = tempfile.mkdtemp(prefix="rc", dir="/tmp")
        self._nodes: dict[str, object] = {}
        self._cluster: Cluster | None = None
        try:
            with self._node_environment():
                self._cluster = Cluster(
                    initialize_head=True,
                    head_node_args={"num_cpus": cpus[0], "include_dashboard": False},
                    shutdown_at_exit=True,
                )
            head = self._cluster.head_node
            self._nodes[head.node_id] = head
            self.head = head.node_id
            for count in cpus[1:]:
                self.add_node(count)
        except BaseException:
            self.shutdown()
            raise

    @property
    def address(self) -> str:
        return self._cluster.address

    @property
    def env(self) -> dict[str, str]:
        """The launch's environment: the cluster to join, as a user's ``RAY_ADDRESS``."""
        return {"RAY_ADDRESS": self.address}

    @contextlib.contextmanager
    def _node_environment(self) -> Iterator[None]:
        """Ray's pointer and sessions in this cluster's temp dir; the tests' modules on the nodes' path; none of the
        recipe's variables this test process set up (``conftest.CPU_ENV``): a launch must send its workers those."""
        launch_only = [key for key in os.environ if key.startswith("VERL_")]
        saved = {key: os.environ.get(key) for key in ("RAY_TMPDIR", "PYTHONPATH", *launch_only)}
        for key in launch_only:
            del os.environ[key]
        os.environ["RAY_TMPDIR"] = self.temp_dir
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(TESTS_DIR), saved["PYTHONPATH"]) if p)
        try:
            yield
        finally:
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value

    def add_node(self, num_cpus: int = 1) -> str:
        """Start a node (a raylet of its own) and wait until the cluster sees it; its node id."""
        with self._node_environment():
            node = self._cluster.add_node(num_cpus=num_cpus)
        self._nodes[node.node_id] = node
        return node.node_id

    def remove_node(self, node_id: str) -> None:
        """Kill every process of the node at once, as a machine that is lost."""
        node = self._nodes.pop(node_id)
        processes = _tree(node)
        with self._node_environment():
            self._cluster.remove_node(node, allow_graceful=False)
        _kill(processes)

    def node_of(self, process: psutil.Process) -> str | None:
        """The node whose raylet started ``process`` (a Ray worker, or a process below one)."""
        for ancestor in process.parents():
            for argument in ancestor.cmdline():
                if argument.startswith("--node_id="):
                    return argument.split("=", 1)[1]
        return None

    def shutdown(self) -> None:
        """Remove every node, end whatever outlived them (a worker's children), and delete the temp dir."""
        if self._cluster is not None:
            processes = [process for node in self._nodes.values() for process in _tree(node)]
            with self._node_environment():
                self._cluster.shutdown()  # also removes Ray's pointer to it, in this cluster's temp dir
            _kill(processes)
            self._cluster = None
        shutil.rmtree(self.temp_dir, ignore_errors=True)


def _tree(node) -> list[psutil.Process]:
    """Every live process of a node: its daemons and everything below them. A daemon's command line names the node's
    session folder: a pid whose daemon exited may have been reused by another run's process (pid_max is 32768 here)."""
    found = []
    for kind in node.all_processes.values():
        for info in kind:
            with contextlib.suppress(psutil.Error):
                daemon = psutil.Process(info.process.pid)
                if node.get_session_dir_path() in " ".join(daemon.cmdline()):
                    found += [daemon, *daemon.children(recursive=True)]
    return found


def _kill(processes: list[psutil.Process]) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()


def runtime_env_overrides(env: dict[str, str]) -> list[str]:
    """Overrides that give every worker of a launch ``env`` (on a running cluster, the launch's own environment
    reaches only its driver); not ``PYTHONPATH``: the nodes have the tests' modules on theirs."""
    return [f"+ray_kwargs.ray_init.runtime_env.env_vars.{k}='{v}'" for k, v in env.items() if k != "PYTHONPATH"]
