"""SCG: selective CUDA graphs. Per recording of a partition, run it as a graph only where that pays.

The candidates (Choice): no graph (eager: the compiled partition's kernels launched one by one), the
graph with its inputs copied into placeholders (graph), and, with PI on, the graph reading them in place
(graph_pi). The decision is made once per recording, right after it: predict() from the calibrated
costs (grace.calibrate) where one candidate wins by more than CLEAR, else measure() the candidates on
the call's own inputs, in turn, every run starting from the call's state (a Snapshot). A partition with
collectives is decided by all the ranks of its group together (slowest_rank): decided apart, a rank
that times its candidates would wait in a collective its peers never join. docs/scg.md has the model,
its calibration and the measurements behind the constants.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections import Counter
from typing import Callable

import torch
import torch.distributed as dist

from grace import calibrate
from grace.recording import Recording, current_device, may_write, nbytes
from grace.snapshot import Snapshot


class Choice(enum.StrEnum):
    GRAPH = "graph"  # the graph, its non-static inputs copied into placeholders
    GRAPH_PI = "graph_pi"  # the graph reading them in place (PI)
    EAGER = "eager"  # no graph: the partition's kernels launched one by one

CLEAR = 0.3  # predicted relative margin beyond which no timing is done
ROUNDS = 3  # timings of each candidate, in turn; the fastest counts
TIE = 0.05  # a candidate within this of a round's fastest is as fast in that round
MARGIN = 0.01  # within TIE, a candidate slower than another in every round by more than this is told apart
CANDIDATES = tuple(Choice)


@dataclasses.dataclass(frozen=True)
class Costs:
    """What the model knows without timing the partition."""
    kernels: int  # kernel nodes in the captured graph
    launch_us: float  # host cost of one kernel launch
    replay_us: float  # host cost of one bare graph replay
    copy_bytes: int  # bytes copied into placeholders per replay, without PI
    copy_bytes_per_us: float  # device copy bandwidth
    copies: int  # tensors copied per replay (one launch for all of them, _foreach_copy_), without PI
    patched_nodes: int = 0  # kernel nodes PI re-points when the inputs move (each a driver call); 0: no PI
    gpu_us: float = 0.0  # GPU time of the graph's kernels, back to back (0: unknown)
    pi_copy_bytes: int = 0  # bytes still copied per replay with PI (inputs it cannot serve)
    pi_copies: int = 0  # tensors still copied per replay with PI


EAGER_LAUNCH_FACTOR = 2.7  # an Inductor kernel run without a graph costs the host this many calibrated
                           # launches (Triton's launcher, the partition's allocations); docs/scg.md
PATCH_US = 2.0  # host cost of re-pointing one kernel node (one cuGraphExecKernelNodeSetParams), counted
                # as if the inputs moved every call


@dataclasses.dataclass
class Decision:
    choice: Choice
    predicted_us: dict[str, float]  # per candidate, per call
    measured_us: dict[str, float] | None = None  # per candidate (its fastest round), when the prediction was not clear
    rounds_us: dict[str, list[float]] | None = None  # per candidate, every round
    costs: Costs | None = None
    error: str | None = None  # why SCG could not decide (the graph is then kept)

    def __post_init__(self):
        self.choice = Choice(self.choice)

    @property
    def predicted_choice(self) -> str | None:
        return min(self.predicted_us, key=self.predicted_us.get) if self.predicted_us else None

    @property
    def tied(self) -> bool:
        """Whether the timing could not tell the fastest candidates apart (the model then chose)."""
        return self.rounds_us is not None and len(
            contenders(self.rounds_us, self.predicted_us, host_us(self.costs) if self.costs else {})) > 1

    @property
    def agreed(self) -> bool | None:
        """Whether the prediction picked what the measurement did (None: nothing measured or predicted,
        or a tie)."""
        if self.measured_us is None or not self.predicted_us or self.tied:
            return None
        return self.predicted_choice == self.choice

    def as_dict(self) -> dict:
        return {"choice": str(self.choice), "predicted_us": self.predicted_us, "measured_us": self.measured_us,
                "rounds_us": self.rounds_us, "agreed": self.agreed, "tied": self.tied,
                "costs": dataclasses.asdict(self.costs) if self.costs else None, "error": self.error}


def host_us(c: Costs) -> dict[str, float]:
    """The host's work per call of each candidate: without a graph it launches every kernel (as
    Inductor's generated code does: EAGER_LAUNCH_FACTOR calibrated launches each); with one it replays,
    launches the copies (one launch for all) and, with PI, re-points its nodes."""
    def graph(copies: int, patched: int) -> float:
        return c.replay_us + (c.launch_us if copies else 0.0) + patched * PATCH_US

    host = {Choice.GRAPH: graph(c.copies, 0), Choice.EAGER: c.kernels * c.launch_us * EAGER_LAUNCH_FACTOR}
    if c.patched_nodes:
        host[Choice.GRAPH_PI] = graph(c.pi_copies, c.patched_nodes)
    return host


def predict(c: Costs) -> dict[str, float]:
    """Time per call of each candidate: the host's work (host_us) or the GPU's, whichever is longer (the
    host queues launches ahead of the GPU). With a graph the GPU copies the bytes (at the device's copy
    bandwidth) before the graph's kernels run."""
    gpu = {Choice.GRAPH: c.gpu_us + (c.copy_bytes / c.copy_bytes_per_us if c.copies else 0.0),
           Choice.EAGER: c.gpu_us,
           Choice.GRAPH_PI: c.gpu_us + (c.pi_copy_bytes / c.copy_bytes_per_us if c.pi_copies else 0.0)}
    return {name: max(host, gpu[name]) for name, host in host_us(c).items()}


def clear(predicted: dict[str, float]) -> str | None:
    """The candidate that beats the next best by more than CLEAR of that one's time, if one does."""
    fast, second = sorted(predicted, key=predicted.get)[:2]
    return fast if predicted[second] > 0 and 1 - predicted[fast] / predicted[second] > CLEAR else None


Timer = Callable[[str, Callable[[], object]], float]  # (candidate, run once) -> us per call


def measure(runs: dict[str, Callable[[], object]], timer: Timer, restore: Callable[[], None]) -> dict[str, list[float]]:
    """Time each candidate with `timer` ROUNDS times, in turn, restoring the state the partition mutates
    after each timing: every round's time per candidate."""
    names = list(runs)
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(ROUNDS):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(timer(name, runs[name]))
            restore()
    return times


Times = dict[str, list[float]]  # per candidate, one or more times


def slowest_rank(group) -> Callable[[Times], Times]:
    """Each time the slowest of the group's ranks has for it (one all-reduce; every rank must call it
    with the same candidates and as many times each)."""
    def across(times: Times) -> Times:
        names = sorted(times)
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend(group) == "nccl" else None
        t = torch.tensor([times[n] for n in names], dtype=torch.float64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
        return dict(zip(names, t.tolist()))
    return across


def decide(costs: Costs | None, runs: dict[str, Callable[[], object]], timer: Timer, snapshot: Snapshot,
           across: Callable[[Times], Times] | None = None) -> Decision:
    """The decision for one recording; without costs (no node counts) it is measured. `across`: where
    ranks decide together, what makes each number the slowest rank's (slowest_rank); the candidates are
    then those every rank has, so that each rank times the same runs."""
    predicted = predict(costs) if costs is not None else {}
    if across is not None:  # first the candidates every rank has (PI's may be off on one), then the numbers
        absent = across({n: [float(n not in runs)] for n in CANDIDATES})
        runs = {n: runs[n] for n in CANDIDATES if not absent[n][0]}
        slowest = across({n: [predicted.get(n, math.inf)] for n in runs})
        predicted = {n: t for n, (t,) in slowest.items() if t < math.inf}
    choice = clear(predicted) if len(predicted) > 1 else None
    if choice is not None:
        return Decision(choice, predicted, None, None, costs)
    rounds = measure(runs, timer, snapshot.restore)
    if across is not None:
        rounds = across(rounds)
    fastest = {name: min(times) for name, times in rounds.items()}
    return Decision(choose(rounds, predicted, host_us(costs) if costs is not None else {}), predicted,
                    fastest, rounds, costs)


def most_wins(rounds: dict[str, list[float]]) -> list[str]:
    """The candidates as fast as the fastest (within TIE) in the most rounds (more than one: the timing
    cannot tell them apart)."""
    n = len(next(iter(rounds.values())))
    wins = Counter(name for r in range(n) for name in rounds
                   if rounds[name][r] <= (1 + TIE) * min(times[r] for times in rounds.values()))
    return [name for name in rounds if wins[name] == max(wins.values())]


def beats(a: str, b: str, rounds: dict[str, list[float]], predicted: dict[str, float],
          host: dict[str, float]) -> bool:
    """Whether the timing tells `a` faster than `b` although they tie within TIE: `a`'s slowest round
    beats `b`'s fastest by more than MARGIN, the model predicts `a` faster too, and the time `a` saves
    exceeds the host work it adds (in a host-bound program the host's time is what counts)."""
    saved = min(rounds[b]) - max(rounds[a])
    return (saved > MARGIN * min(rounds[b]) and predicted.get(a, math.inf) < predicted.get(b, math.inf)
            and saved > host.get(a, math.inf) - host.get(b, 0.0))


def contenders(rounds: dict[str, list[float]], predicted: dict[str, float], host: dict[str, float]) -> list[str]:
    """The candidates fastest in the most rounds that no other of them beats (more than one: a tie)."""
    tied = most_wins(rounds)
    return [b for b in tied if not any(beats(a, b, rounds, predicted, host) for a in tied if a != b)]


def choose(rounds: dict[str, list[float]], predicted: dict[str, float], host: dict[str, float]) -> str:
    """The candidate fastest in the most rounds (contenders); among those tied, the model's favourites
    (within TIE of the best prediction), and of those the one that leaves the host the most time
    (host_us), then the one with the fastest round. Timed back to back, a partition that keeps the GPU
    busy ties whatever the host does, and the model favours no graph by a sliver (no copies); in a
    host-bound program the host's time is what the graph saves."""
    tied = contenders(rounds, predicted, host)
    best = min((predicted[name] for name in tied if name in predicted), default=math.inf)
    near = [name for name in tied if predicted.get(name, math.inf) <= (1 + TIE) * best] or tied
    return min(near, key=lambda name: (host.get(name, math.inf), predicted.get(name, math.inf), min(rounds[name])))


def cuda_timer(candidate: str, run: Callable[[], object]) -> float:
    """One untimed run (a fresh graph's first replay uploads it), then 5 back to back."""
    run()
    return calibrate.per_call_us(run, 5, torch.device("cuda", torch.cuda.current_device()))


timer = cuda_timer  # what candidates are timed with; tests put a fake here


def _costs(recording: Recording, device: torch.device, args: list, snapshot: Snapshot) -> Costs | None:
    if recording.nodes is None or device.type != "cuda":
        return None  # nothing to predict from: measure

    def before() -> None:  # each replay from this call's state (placeholders never garbage: indices read as such)
        snapshot.restore()
        if recording.copied:
            recording.copy_inputs(args)

    gpu_us = calibrate.device_us(recording.replay_graph, before=before)  # the graph's kernels alone
    snapshot.restore()
    return Costs(recording.nodes["kernel"], calibrate.launch_us(device), calibrate.replay_us(device),
                 nbytes(recording.fills), calibrate.copy_bytes_per_us(device), len(recording.fills),
                 recording.patched_nodes, gpu_us, recording.copy_bytes, len(recording.still_copied))


def select(recording: Recording, fn: Callable, args: list, group=None) -> Decision:
    """The decision for a new recording of partition `fn`, on this call's inputs; the recording is left
    replaying as chosen (PI on or off), and every input as the call gave it. `group`: the process group
    whose ranks decide together."""
    device = next((a.device for a in args if isinstance(a, torch.Tensor)), None) or current_device()
    # Every run starts from this call's state: a run that wrote an input (an intermediate Inductor
    # computes into in place, a cache) must not hand the next one state the call never sees.
    snapshot = Snapshot(may_write(args, recording.writable))

    def graph(pi: bool) -> Callable[[], object]:
        def run():
            snapshot.restore()
            recording.set_pi(pi)
            return recording.replay(list(args))
        return run

    def eager():
        snapshot.restore()
        return fn(list(args))

    runs = {Choice.GRAPH: graph(False), Choice.EAGER: eager}
    if recording.pi is not None:
        runs[Choice.GRAPH_PI] = graph(True)
    try:
        decision = decide(_costs(recording, device, args, snapshot), runs, timer, snapshot,
                          slowest_rank(group) if group is not None else None)
    finally:
        snapshot.restore()
    # Without a PI candidate there was no copying to weigh against re-pointing: PI stays on for the later
    # recordings of these sizes that inherit this one's setting and copy an input (one that moved)
    recording.set_pi(decision.choice == Choice.GRAPH_PI or Choice.GRAPH_PI not in runs)
    return decision
