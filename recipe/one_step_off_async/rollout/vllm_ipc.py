"""verl's vLLM replica with its weight-transfer socket scoped to one Ray cluster.

verl 0.9.1 hands each bucket of a sync from a replica's ``CheckpointEngineWorker`` to the vLLM engine over a ZMQ
socket at ``ipc:///tmp/rl-colocate-zmq-{job id}-replica-{r}-rank-{k}.sock``: the sender builds the path in
``vllm_rollout.py`` (``ServerAdapter.__init__``), the engine from ``VERL_RAY_JOB_ID``, which ``vLLMHttpServer.__init__``
sets (``vllm_async_server.py``) and ``_get_zmq_handle`` reads (``utils.py``). A job id is unique within a cluster
only: the first job of every cluster is ``01000000``. So two runs on one host (two launches, CI's two test workers,
a benchmark grid, several jobs on a shared node) use the same path, and the sender of one removes and rebinds the
path under the other's engine: that run's sync stalls until some other run syncs, then loads the other run's
weights without an error, or fails its weight sync after ``timeout_s`` (measured on CPU with three runs at once:
syncs of 10-175 s, one failure at 300 s, and the weights of another run's model in a staleness-0 run). NCCL syncs
take the same path (CUDA IPC handles instead of shared memory).

Both ends here add the node's Ray id (``{job id}-{node id[:12]}``): random for every cluster, the same in every
process of a node, and a replica rank's sender and engine are on one node. The classes keep verl's names (process
titles, logs and tools name the actors by them) and are registered in verl's registries by the recipe's plugin
(``verl_plugin.py``): the rollout class by ``get_rollout_class("vllm", "async")``, the replica by
``RolloutReplicaRegistry``. ``tests/test_platforms_verl_compat_on_cpu.py`` fails when verl changes how it builds
the path.
"""

from __future__ import annotations

import os

import ray
from verl.workers.rollout.vllm_rollout import vllm_async_server, vllm_rollout

JOB_ID_ENV = "VERL_RAY_JOB_ID"  # what verl's engine side builds the path from


def cluster_scope() -> str:
    """This process's job id and its node's Ray id: one value per (job, cluster node), never shared by two clusters."""
    context = ray.get_runtime_context()
    return f"{context.get_job_id()}-{context.get_node_id()[:12]}"


def scoped_handle(handle: str, job_id: str, scope: str) -> str:
    """verl's socket address with its job id replaced by ``scope``; raises if the address does not name the job id."""
    unscoped = f"-zmq-{job_id}-replica-"
    if unscoped not in handle:
        raise ValueError(f"verl's weight-transfer address {handle!r} does not hold {unscoped!r}: verl changed it")
    return handle.replace(unscoped, f"-zmq-{scope}-replica-", 1)


class ServerAdapter(vllm_rollout.ServerAdapter):
    """The sender: verl's, with the cluster-scoped address."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.zmq_handle = scoped_handle(self.zmq_handle, ray.get_runtime_context().get_job_id(), cluster_scope())


class vLLMHttpServer(vllm_async_server.vLLMHttpServer):  # noqa: N801  (verl's name: the actor's process title)
    """The engine side: verl's server, whose engine (started later, by ``launch_server``) inherits the scope."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        os.environ[JOB_ID_ENV] = cluster_scope()


class vLLMReplica(vllm_async_server.vLLMReplica):  # noqa: N801
    """verl's vLLM replica, starting the server above."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.server_class = ray.remote(vLLMHttpServer)
