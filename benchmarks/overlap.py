"""Overlap benchmark: the synchronous baseline (staleness 0) against one-step-off (staleness 1) on CPU.

What: runs the real entry point, ``python -m recipe.one_step_off_async.main_ppo
--config-name=one_step_off_ppo_cpu``, once per run as a subprocess, alternating staleness 0 and 1
(s0, s1, s0, s1, ...) on the same workload, and reads each run's per-step metrics (verl's
``file`` logger). Validation is off. Steady state is steps 3..N-1: steps 1-2 fill the pipeline
and warm up, and step N has nothing left to generate. For each staleness it prints the median
over repeats of the mean steady-state step time, its split (``timing_s/gen`` of the batch the step
trained on, ``timing_s/train``, ``timing_s/sync_weights``, ``timing_s/wait_prev_gen``) and
``async/overlap_efficiency``, then the speedup: median staleness-0 step / median staleness-1 step.
Two more speedups check it: from the wall-clock time per step (one weight sync's end to the next,
which also counts the work between steps that ``timing_s/step`` leaves out), and the median of
the ratios of back-to-back runs, which drifts less when the load from other users changes.

It also shows where the CPU goes. At the start and the end of the steady state it reads the CPU
time of every process of the run (the driver, Ray's daemons, each Ray worker named by its actor
class, vLLM's engine processes) and of the whole machine, and prints the CPU seconds per step of
each process and the cores the rest of the machine used meanwhile. Two pools only overlap if the machine has a core
free for each: when the run's CPU per step divided by the cores left to it comes close to the
staleness-1 step time, the step is bounded by CPU, not by the pipeline. The report warns when
other processes took a noticeable share of the machine during the runs.

Why: overlap is the point of the recipe. With generation and training of similar cost, a
synchronous step costs gen + train + sync and a one-step-off step max(gen, train) + sync, so
the speedup approaches 2 when the two pools really run in parallel.

How (from the repository root, with the project's virtualenv active):
    python -m benchmarks overlap                               # 3 x (s0, s1), 30 steps each
    python -m benchmarks overlap --repeats 2 --steps 20
    python -m benchmarks overlap -- actor_rollout_ref.rollout.n=8      # hydra overrides for both
"""

from __future__ import annotations

import os
import shlex
import statistics
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

from benchmarks import argument_parser
from recipe.one_step_off_async import runs
from recipe.one_step_off_async.errors import RunFailed

# The workload is the CPU profile as is (16 prompts x 4 samples, one actor update per step): the demo's, the
# run a user tries first; overrides after -- change it for both stalenesses.
PROFILE = "one_step_off_ppo_cpu"
FIXED = ("trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1")
SPLIT = {
    "step": "timing_s/step",
    "gen": "timing_s/gen",
    "train": "timing_s/train",
    "sync": "timing_s/sync_weights",
    "wait": "timing_s/wait_prev_gen",
    "efficiency": "async/overlap_efficiency",
}
COLUMNS = ("step", "wall", "gen", "train", "sync", "wait", "efficiency")
VLLM_ENGINE = "VLLM::EngineCore"  # the title vLLM gives the engine-core process each server starts
ROLES = {
    "OneStepOffTaskRunner": "trainer driver",
    "WorkerDict": "FSDP actor",
    "vLLMHttpServer": "vLLM server (verl's rollout replica)",
    VLLM_ENGINE: "vLLM engine core (runs the model)",
    "AgentLoopWorker": "verl agent loop",
    "RewardLoopWorker": "verl reward loop",
    "GlobalRequestLoadBalancer": "verl request router",
}
RAY_RUNTIME = "Ray daemons and idle workers"
POLL_S = 0.2
BUSY_MACHINE_CORES = 0.2  # cores used by other processes above which the report warns


@dataclass(frozen=True)
class CpuSnapshot:
    at: float
    by_pid: dict[int, float]  # CPU seconds (user + system) of each process of the run so far
    machine: float  # busy CPU seconds of the whole machine so far


@dataclass(frozen=True)
class CpuUsage:
    """CPU spent during the steady state: by each process of the run (by name), and by the rest of the machine."""

    seconds: float
    steps: int
    by_process: dict[str, float]
    others: float

    def per_step(self, name: str) -> float:
        return self.by_process.get(name, 0.0) / self.steps

    @property
    def run_cores(self) -> float:
        return sum(self.by_process.values()) / self.seconds

    @property
    def other_cores(self) -> float:
        return self.others / self.seconds


class CpuMeter:
    """Snapshots the CPU time of a run's process tree (the driver and everything it started)."""

    def __init__(self, driver_pid: int) -> None:
        self.driver_pid = driver_pid
        self.names: dict[int, str] = {}

    def _name(self, process: psutil.Process) -> str:
        if process.pid == self.driver_pid:
            return "driver (main_ppo)"
        title = (process.cmdline() or [""])[0]
        if title.startswith("VLLM::"):
            return title  # a vLLM process below a replica's server (it names itself, like Ray's workers)
        if not title.startswith("ray::"):
            return RAY_RUNTIME  # raylet, GCS, dashboard, log monitor
        # A Ray worker is titled "ray::<ActorClass>.<method>" while it runs a method, "ray::IDLE" without an actor.
        actor = title.removeprefix("ray::").split(".")[0]
        return RAY_RUNTIME if actor in ("IDLE", "DashboardAgent", "RuntimeEnvAgent") else actor

    def snapshot(self) -> CpuSnapshot:
        by_pid = {}
        try:
            driver = psutil.Process(self.driver_pid)
            tree = [driver, *driver.children(recursive=True)]
        except psutil.NoSuchProcess:
            tree = []
        for process in tree:
            try:
                times = process.cpu_times()
                self.names[process.pid] = self._name(process)
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
            by_pid[process.pid] = times.user + times.system
        machine = psutil.cpu_times()
        # Busy time of the whole machine, including time the hypervisor gave our vCPUs to someone else.
        busy = machine.user + machine.nice + machine.system + machine.irq + machine.softirq + machine.steal
        return CpuSnapshot(time.monotonic(), by_pid, busy)

    def usage(self, start: CpuSnapshot, end: CpuSnapshot, steps: int) -> CpuUsage:
        by_process: dict[str, float] = {}
        for pid, cpu_s in end.by_pid.items():
            name = self.names[pid]
            by_process[name] = by_process.get(name, 0.0) + cpu_s - start.by_pid.get(pid, 0.0)
        others = max(0.0, end.machine - start.machine - sum(by_process.values()))
        return CpuUsage(end.at - start.at, steps, by_process, others)


@dataclass(frozen=True)
class RunResult:
    means: dict[str, float]  # COLUMNS, averaged over the steady-state steps
    cpu: CpuUsage


def overrides_of(staleness: int, steps: int, extra: list[str]) -> tuple[str, ...]:
    return (*FIXED, f"async_training.staleness={staleness}", f"trainer.total_training_steps={steps}", *extra)


def run(staleness: int, steps: int, directory: Path, overrides: list[str], timeout_s: float) -> RunResult:
    """One training run; CPU snapshots when step 2's and step N-1's metrics appear bound the steady state."""
    metrics_path = directory / runs.METRICS
    metrics_path.unlink(missing_ok=True)
    launch = runs.start(directory, *overrides_of(staleness, steps, overrides), profile=PROFILE)
    meter = CpuMeter(launch.process.pid)
    snapshots: dict[int, CpuSnapshot] = {}

    def snapshot_at_the_boundaries() -> None:
        logged = metrics_path.read_bytes().count(b"\n") if metrics_path.exists() else 0
        for boundary in (2, steps - 1):
            if logged >= boundary and boundary not in snapshots:
                snapshots[boundary] = meter.snapshot()

    label = f"staleness {staleness}"
    try:
        result = launch.wait(timeout_s, while_running=snapshot_at_the_boundaries).check(label)
    except subprocess.TimeoutExpired:
        raise RunFailed(
            f"{label} did not finish within {timeout_s:g} s:\n  {shlex.join(launch.command)}\n"
            f"see {directory / runs.OUTPUT}"
        ) from None
    metrics = result.metrics
    if sorted(metrics) != list(range(1, steps + 1)) or len(snapshots) != 2:
        raise RunFailed(f"{label} logged steps {sorted(metrics)}, expected 1..{steps}; see {directory / runs.OUTPUT}")
    steady = [metrics[step] for step in range(3, steps)]
    means = {name: statistics.fmean(m[key] for m in steady) for name, key in SPLIT.items()}
    sync_ends = [metrics[step]["timeline/sync_end"] for step in range(2, steps)]
    means["wall"] = (sync_ends[-1] - sync_ends[0]) / (len(sync_ends) - 1)
    return RunResult(means, meter.usage(snapshots[2], snapshots[steps - 1], steps=len(steady)))


def row(label: str, means: dict[str, float], run_cores: float, other_cores: float) -> str:
    cells = "".join(f"{means[column]:>7.3f}" for column in COLUMNS[:-1])
    return f"{label:<16}{cells}{means['efficiency']:>12.2f}{run_cores:>11.2f}{other_cores:>13.2f}"


def report(results: dict[int, list[RunResult]], steps: int) -> None:
    cores = len(os.sched_getaffinity(0))
    print(
        f"\nsteady state: steps 3..{steps - 1} of each run; times in seconds; run / other cores: cores used by "
        f"the run's processes / by the rest of the machine ({cores} cores)"
    )
    print(
        f"{'':<16}"
        + "".join(f"{column:>7}" for column in COLUMNS[:-1])
        + f"{'efficiency':>12}{'run cores':>11}{'other cores':>13}"
    )
    for repeat in range(len(results[0])):
        for staleness in (0, 1):
            result = results[staleness][repeat]
            print(row(f"s{staleness} run {repeat + 1}", result.means, result.cpu.run_cores, result.cpu.other_cores))
    medians = {}
    for staleness, repeats in results.items():
        medians[staleness] = {column: statistics.median(r.means[column] for r in repeats) for column in COLUMNS}
        run_cores = statistics.median(r.cpu.run_cores for r in repeats)
        other_cores = statistics.median(r.cpu.other_cores for r in repeats)
        print(row(f"s{staleness} median", medians[staleness], run_cores, other_cores))
    sync, one_off = medians[0], medians[1]

    # Back-to-back runs see similar load from the rest of the machine; their ratio drifts less.
    pairs = [s0.means["step"] / s1.means["step"] for s0, s1 in zip(results[0], results[1], strict=True)]
    print(
        f"\nspeedup (median step time s0 / s1): {sync['step'] / one_off['step']:.2f}; "
        f"from wall clock per step: {sync['wall'] / one_off['wall']:.2f}; median of the back-to-back "
        f"pairs: {statistics.median(pairs):.2f} ({', '.join(f'{pair:.2f}' for pair in pairs)})"
    )
    print(f"overlap efficiency: s0 {sync['efficiency']:.2f}, s1 {one_off['efficiency']:.2f}")
    busiest = max(r.cpu.other_cores for repeats in results.values() for r in repeats)
    if busiest > BUSY_MACHINE_CORES:
        print(
            f"warning: other processes used up to {busiest:.2f} of the {cores} cores during these runs; the two "
            "pools then compete for what is left and the speedup measures the machine's load, not the pipeline"
        )
    ideal = (sync["gen"] + sync["train"] + sync["sync"]) / (max(sync["gen"], sync["train"]) + sync["sync"])
    print(
        f"if the pools did not share cores, s0's split would allow (gen + train + sync) / (max(gen, train) + sync) "
        f"= {ideal:.2f}; overlapped, generation took {one_off['gen'] / sync['gen']:.2f}x and training "
        f"{one_off['train'] / sync['train']:.2f}x their s0 time"
    )

    # The run with the median step time stands for its staleness.
    typical = {s: sorted(repeats, key=lambda r: r.means["step"])[len(repeats) // 2] for s, repeats in results.items()}
    usage = {s: result.cpu for s, result in typical.items()}
    names = sorted(set(usage[0].by_process) | set(usage[1].by_process), key=lambda n: -usage[1].per_step(n))
    print(f"\n{'CPU seconds per step, by process (the run with the median step time)':<72}{'s0':>8}{'s1':>8}")
    for name in names:
        print(f"  {name:<28}{ROLES.get(name, ''):<42}" + "".join(f"{usage[s].per_step(name):>8.2f}" for s in (0, 1)))
    total = {s: sum(u.by_process.values()) / u.steps for s, u in usage.items()}
    floor = {s: total[s] / max(cores - usage[s].other_cores, 1e-9) for s in (0, 1)}
    for label, values in (
        ("total", total),
        ("cores used by other processes", {s: u.other_cores for s, u in usage.items()}),
        (f"CPU floor: total / ({cores} - other cores)", floor),
        ("measured step", {s: r.means["step"] for s, r in typical.items()}),
    ):
        print(f"  {label:<70}" + "".join(f"{values[s]:>8.2f}" for s in (0, 1)))


def main(argv: list[str]) -> None:
    parser = argument_parser(__name__, __doc__)
    parser.add_argument("--steps", type=int, default=30, help="training steps per run; steady state is 3..steps-1")
    parser.add_argument("--repeats", type=int, default=3, help="runs per staleness, interleaved s0, s1, s0, s1, ...")
    parser.add_argument("--out", type=Path, default=Path("outputs/bench_overlap"), help="a directory per run")
    parser.add_argument("--timeout", type=float, default=900, help="seconds a run may take")
    parser.add_argument("overrides", nargs="*", help="hydra overrides for both configurations (after --)")
    args = parser.parse_args(argv)
    if args.steps < 5:
        parser.error("--steps must be at least 5: steps 1-2 and the last one are not steady state")

    print(f"reproduce: {shlex.join(['python', '-m', 'benchmarks', 'overlap', *argv])}")
    for staleness in (0, 1):
        directory = args.out.resolve() / f"s{staleness}-<n>"
        line = runs.command(directory, overrides_of(staleness, args.steps, args.overrides), PROFILE)
        print(f"  s{staleness} runs: {shlex.join(line)}")
    results: dict[int, list[RunResult]] = {0: [], 1: []}
    for repeat in range(1, args.repeats + 1):
        for staleness in (0, 1):
            directory = args.out.resolve() / f"s{staleness}-{repeat}"
            started = time.monotonic()
            result = run(staleness, args.steps, directory, args.overrides, args.timeout)
            results[staleness].append(result)
            print(
                f"s{staleness} run {repeat}/{args.repeats}: step {result.means['step']:.3f} s "
                f"({time.monotonic() - started:.0f} s in all; {directory})",
                flush=True,
            )
    report(results, args.steps)
