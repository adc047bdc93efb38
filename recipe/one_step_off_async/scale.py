"""Add or remove rollout replicas of a running elastic job, or show its pool.

    python -m recipe.one_step_off_async.scale (--add N | --remove N | --status)
        [--address A] [--experiment NAME] [--wait S]

Run it on a node of the job's Ray cluster; a job that started Ray itself prints the ``--address`` to use at
start-up (``[elastic] ... --address``). It talks to the job's ``RolloutPoolController`` (``elastic/controller.py``),
which exists when the job runs with ``async_training.elastic.enable=true``; the trainer applies the request at its
next step boundary (``elastic/pool.py``). With ``--wait`` it exits 0 once the request is done, 1 once it was
refused, only partly carried out (fewer free resources than replicas asked for) or failed, or when the seconds
ran out; without it, it returns once the request is queued.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import threading
import time

import ray

from recipe.one_step_off_async.elastic.controller import NAMESPACE, find_controller


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m recipe.one_step_off_async.scale", description=__doc__.split("\n")[0]
    )
    action = parser.add_mutually_exclusive_group(required=True)
    action.add_argument("--add", type=int, metavar="N", help="start N more rollout replicas")
    action.add_argument("--remove", type=int, metavar="N", help="remove the N most recently added serving replicas")
    action.add_argument("--status", action="store_true", help="print the pool's replicas and the requests so far")
    parser.add_argument("--experiment", help="trainer.experiment_name of the job (if several elastic jobs run)")
    parser.add_argument("--address", default="auto", help="Ray cluster address (default: the local node's cluster)")
    parser.add_argument("--wait", type=float, default=0.0, metavar="S", help="wait up to S seconds for the outcome")
    parser.add_argument(
        "--connect-timeout", type=float, default=30.0, metavar="S", help="give up joining the cluster after S seconds"
    )
    args = parser.parse_args(argv)
    for name in ("add", "remove"):
        count = getattr(args, name)
        if count is not None and count < 1:
            parser.error(f"--{name} takes a number of replicas >= 1, got {count}")
    return args


def _connect(address: str, timeout_s: float) -> str | None:
    """Join the job's Ray cluster as a driver; None, or why it could not within ``timeout_s``."""
    # A cluster that ray.init() started (the job's, when it runs without `ray start`) requires Ray's token,
    # which Ray sends on its own only for address "auto": apply Ray's rule for "auto" (use the local
    # token if there is one and RAY_AUTH_MODE is unset) to the address the job printed too.
    from ray._private.authentication.authentication_token_setup import maybe_enable_token_auth_if_token_available

    logging.getLogger(maybe_enable_token_auth_if_token_available.__module__).setLevel(logging.ERROR)
    maybe_enable_token_auth_if_token_available(warn_if_disabled=False)
    outcome = [f"no answer within {timeout_s:g} s (the job ended, or a wrong address or auth token)"]

    def connect() -> None:
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
            outcome[0] = None
        except Exception as error:
            outcome[0] = f"{type(error).__name__}: {error}"

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s)  # Ray retries an unreachable or refusing cluster for minutes
    return outcome[0]


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    problem = _connect(args.address, args.connect_timeout)
    if problem is not None:
        print(
            f"Could not join the Ray cluster at {args.address!r}: {problem}. Run this on a node of the job's "
            "cluster, with the --address the job printed at start-up ('[elastic] ... --address').",
            file=sys.stderr,
        )
        sys.stderr.flush()
        os._exit(2)  # a connection attempt may still hold a non-daemon Ray thread
    try:
        experiment, controller = find_controller(args.experiment)
    except LookupError as error:
        print(error, file=sys.stderr)
        return 2
    if args.status:
        print(json.dumps({"experiment": experiment, **ray.get(controller.status.remote())}, indent=2, default=str))
        return 0
    try:
        request_id = ray.get(controller.request.remote(add=args.add or 0, remove=args.remove or 0))
        outcome = ray.get(controller.outcome.remote(request_id))
        deadline = time.monotonic() + args.wait
        while outcome["state"] in ("queued", "in progress") and time.monotonic() < deadline:
            time.sleep(1.0)
            outcome = ray.get(controller.outcome.remote(request_id))
    except ray.exceptions.RayActorError:
        print(f"{experiment}: the job ended before the request was carried out.", file=sys.stderr)
        return 1
    print(f"{experiment}: request {request_id} {outcome['state']}: {outcome['detail']}")
    return 1 if args.wait and outcome["state"] != "done" else 0


if __name__ == "__main__":
    sys.exit(main())
