"""Add or remove rollout replicas of a running elastic job, or show its pool.

    python -m recipe.one_step_off_async.scale --add 1    [--address A] [--experiment NAME] [--wait 600]
    python -m recipe.one_step_off_async.scale --remove 1 [--address A] [--experiment NAME] [--wait 600]
    python -m recipe.one_step_off_async.scale --status   [--address A] [--experiment NAME]

Run it on a node of the job's Ray cluster. ``--address`` defaults to the cluster ``ray start``
made on this node; a job that started Ray itself prints its address at start-up
(``[elastic] ... --address``). It talks to the job's
``RolloutPoolController`` (``elastic/controller.py``), which exists when the job was started with
``async_training.elastic.enable=true``; ``--experiment`` is the job's ``trainer.experiment_name``,
needed only when several elastic jobs share the cluster. The trainer applies the request at its
next step boundary: a new replica starts in the background and serves from the first weight sync
after it is up; a removed replica takes no new requests at once and is shut down at the next sync.
With ``--wait`` the command returns when that happened (exit 0), or when it was refused, only partly
carried out (fewer free resources than replicas asked for) or failed (exit 1), or after the given
seconds (exit 1); without it, when the request is queued.
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

FINAL_STATES = ("done", "partial", "refused", "failed")


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
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            ray.init(address=address, namespace=NAMESPACE, logging_level="ERROR", log_to_driver=False)
            outcome.append(None)
        except Exception as error:
            outcome.append(f"{type(error).__name__}: {error}")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout_s)  # Ray retries an unreachable or refusing cluster for minutes
    if not outcome:
        return f"no answer within {timeout_s:g} s (the job ended, or a wrong address or auth token)"
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
        while outcome["state"] not in FINAL_STATES and time.monotonic() < deadline:
            time.sleep(1.0)
            outcome = ray.get(controller.outcome.remote(request_id))
    except ray.exceptions.RayActorError:
        print(f"{experiment}: the job ended before the request was carried out.", file=sys.stderr)
        return 1
    print(f"{experiment}: request {request_id} {outcome['state']}: {outcome['detail']}")
    if args.wait and outcome["state"] != "done":
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
