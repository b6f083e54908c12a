import math

import pytest

from scripts import gpu_gaps


def _mark(ts, dur):
    return {"name": gpu_gaps.MARK, "cat": "user_annotation", "ts": ts, "dur": dur, "tid": 1}


def test_an_iteration_splits_into_lead_busy_idle_and_tail():
    events = [_mark(0, 100),
              {"cat": "kernel", "name": "copy", "ts": 10, "dur": 20},
              {"cat": "gpu_memcpy", "ts": 25, "dur": 10},  # overlaps the copy: busy 10-35
              {"cat": "kernel", "ts": 60, "dur": 30},  # a 25 us gap before it
              {"cat": "kernel", "ts": 150, "dur": 5},  # after the mark: another iteration's
              {"cat": "python_function", "name": "held_output", "ts": 36, "dur": 20},
              {"cat": "python_function", "name": "guards", "ts": 2, "dur": 6},  # inside the lead
              {"cat": "python_function", "name": "step", "ts": 5, "dur": 80}]  # not wholly inside the gap
    (it,) = gpu_gaps.iterations(events)
    assert (it["lead"], it["busy"], it["idle"], it["long idle"], it["tail"]) == (10, 55, 25, 25, 10)
    assert it["gaps"] == [(35, 60)]
    assert gpu_gaps.inside(events, it["gaps"][0]) == [(20, "held_output")]
    assert it["first"] == "copy"
    shown = gpu_gaps.report("grace", events, events)
    assert "lead 10 us" in shown and "first device activity: copy." in shown
    assert "- 10 lead: guards 6" in shown and "- 25 at +35: held_output 20" in shown


def test_the_lead_is_told_by_own_time_and_each_graph_by_its_launch_and_first_kernel():
    events = [_mark(0, 100), _mark(200, 100),
              {"cat": "kernel", "ts": 40, "dur": 20, "args": {"correlation": 7}},
              {"cat": "kernel", "ts": 62, "dur": 2, "args": {"correlation": 7}},  # the same graph's second
              {"cat": "kernel", "ts": 250, "dur": 20, "args": {"correlation": 9}},
              {"cat": "kernel", "ts": 240, "dur": 5, "args": {"correlation": 10}},  # launched after the graph
              {"cat": "kernel", "ts": 70, "dur": 1, "args": {"correlation": 8}},  # the plain launch's
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 30, "dur": 5, "args": {"correlation": 7}},
              {"cat": "cuda_runtime", "name": "cudaGraphLaunch", "ts": 234, "dur": 5, "args": {"correlation": 9}},
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 20, "dur": 2, "args": {"correlation": 8}},  # not a graph's
              {"cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": 236, "dur": 2, "args": {"correlation": 10}},
              {"cat": "python_function", "name": "step", "ts": 0, "dur": 90, "tid": 1},
              {"cat": "python_function", "name": "forward", "ts": 10, "dur": 40, "tid": 1},
              {"cat": "python_function", "name": "held_output", "ts": 12, "dur": 15, "tid": 1},
              {"cat": "cpu_op", "name": "prologue", "ts": 2, "dur": 10, "tid": 1},  # ends inside forward
              {"cat": "python_function", "name": "engine", "ts": 5, "dur": 10, "tid": 2}]  # another thread
    # lead 0-40 on the step's thread: forward 15 (10-12, 27-40), held_output 15, prologue 10 (2-12), taken
    # from step (which the forward's 30 leave nothing of its own), not from the forward that outlasts it
    assert gpu_gaps.own_time(events, (0, 40), 1) == [(15, "held_output"), (15, "forward"), (10, "prologue")]
    its = gpu_gaps.iterations(events)
    assert [i["graph launches"] for i in its] == [[30], [34]]
    assert [i["graph starts"] for i in its] == [[40], [50]]
    shown = gpu_gaps.report("grace", events, events)
    assert "CUDA graphs launched at (us from the iteration's start, medians): +32\nand their first kernels began at: +45" in shown
    assert "held_output 15; forward 15; prologue 10\n" in shown
    # each graph's launch call took 5 us; the first activities began 10 and 4 us after calls of 5 and 2 us
    assert "and their launch calls took (us): 5\n" in shown
    assert "The first device activity began 7 us after its launch call began, a call of 4 us (medians)." in shown
    assert "Kernel nodes PI re-pointed, in each iteration: 3, 0." in gpu_gaps.report("grace", events, events, [3, 0])
    # a kernel with a launch's id that began before the launch (a wrong id) tells nothing
    events[2]["args"]["correlation"] = events[3]["args"]["correlation"] = 11
    events += [{"cat": "kernel", "ts": 205, "dur": 1, "args": {"correlation": 9}}]
    starts = [i["graph starts"] for i in gpu_gaps.iterations(events)]
    assert all(math.isnan(s[0]) for s in starts)
    assert "and their first kernels began at: ?\n" in gpu_gaps.report("grace", events, events)


def test_a_workload_builds_as_a_worker_builds_it():
    task, fn = gpu_gaps.build("EOS", "eager", device="cpu")
    assert task.step(fn) is not None


def test_no_gpu_is_a_one_line_error(capsys):
    if gpu_gaps.torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert gpu_gaps.main(["EOS", "eager"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_the_kernel_nodes_pi_re_points_are_counted_per_step(monkeypatch):
    monkeypatch.setattr(gpu_gaps.pi.Indirection, "point", lambda self, ptrs: len(ptrs))
    monkeypatch.setattr(gpu_gaps.torch.cuda, "synchronize", lambda: None)

    class Task:
        steps = 0

        def step(self, fn):  # the first step re-points two graphs' nodes (2 + 1), the later ones none
            for ptrs in ([{0: 1, 1: 2}, {0: 3}] if self.steps == 0 else [{}]):
                gpu_gaps.pi.Indirection.point(object(), ptrs)
            self.steps += 1
    with gpu_gaps.counting() as (repointed, _, _):
        gpu_gaps.pi.Indirection.point(object(), {0: 1, 1: 1, 2: 1, 3: 1})  # at set-up
        assert repointed == [4]
        repointed.pop()
        events = gpu_gaps.traced(Task(), None, 3, False, repointed)
    assert repointed == [3, 0, 0]
    assert gpu_gaps.pi.Indirection.point(object(), {0: 1}) == 1  # unwrapped again
    assert sum(e.get("name") == gpu_gaps.MARK for e in events) == 3


def test_the_graphs_captured_are_counted_by_their_nodes(monkeypatch):
    captured = gpu_gaps.recording.Captured(None, [], {"kernel": 5, "memcpy": 1, "memset": 0, "other": 0}, None)
    monkeypatch.setattr(gpu_gaps.recording, "capture", lambda fn, args: captured)
    with gpu_gaps.counting() as (repointed, nodes, _):
        assert gpu_gaps.recording.capture(None, []) is captured
        gpu_gaps.recording.capture(None, []).nodes = None  # nodes the driver could not read
        gpu_gaps.recording.capture(None, [])
    assert gpu_gaps.recording.capture(None, []) is captured and len(nodes) == 3  # unwrapped again
    assert gpu_gaps.report_setup(7, nodes[:1] + [None], [0, 7]) == (
        f"Set-up and {gpu_gaps.WARMUP} warm-up steps: 2 CUDA graphs captured (kernel 5, memcpy 1; not read);"
        " PI re-pointed 7 kernel nodes (graph 2: 7).\n")
    assert "0 CUDA graphs captured (none); PI re-pointed 0 kernel nodes.\n" in gpu_gaps.report_setup(0, [], [])


def test_the_nodes_pi_re_points_are_counted_per_graph(monkeypatch):
    """Re-pointed nodes are told to the graph whose executable they are in, by its driver handle."""
    class Graph:
        def __init__(self, handle):
            self.handle = handle

        def raw_cuda_graph_exec(self):
            return self.handle

    class Indirection:  # as grace.pi.Indirection holds its graph's executable
        def __init__(self, handle):
            self.exec = handle

    graphs = iter([Graph(0xA0), Graph(0xB0)])
    monkeypatch.setattr(gpu_gaps.recording, "capture",
                        lambda fn, args: gpu_gaps.recording.Captured(None, [], {"kernel": 3}, next(graphs)))
    monkeypatch.setattr(gpu_gaps.pi.Indirection, "point", lambda self, ptrs: len(ptrs))
    with gpu_gaps.counting() as (repointed, _, per_graph):
        gpu_gaps.recording.capture(None, []), gpu_gaps.recording.capture(None, [])
        gpu_gaps.pi.Indirection.point(Indirection(0xB0), {0: 1, 1: 2})
        gpu_gaps.pi.Indirection.point(Indirection(0xA0), {0: 1})
        gpu_gaps.pi.Indirection.point(Indirection(0xB0), {0: 3})
    assert repointed == [4] and per_graph == [1, 3]


def test_each_graph_replay_is_timed_without_the_profiler(monkeypatch):
    monkeypatch.setattr(gpu_gaps.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(gpu_gaps.torch.cuda.CUDAGraph, "replay", lambda self: gpu_gaps.time.sleep(0.002))

    class Task:
        def step(self, fn):  # two graphs a step
            gpu_gaps.torch.cuda.CUDAGraph.replay(None)
            gpu_gaps.torch.cuda.CUDAGraph.replay(None)
    steps, calls = gpu_gaps.unprofiled(Task(), None, 3)
    assert len(steps) == 3 and all(s >= 4 for s in steps)
    assert [len(c) for c in calls] == [2, 2, 2] and all(2000 <= t < 20000 for c in calls for t in c)
    shown = gpu_gaps.report_unprofiled(steps, calls)
    assert shown.startswith("Without the profiler, 3 steps: ") and shown.rsplit(": ", 1)[1].count(",") == 1
    assert "replay() calls" not in gpu_gaps.report_unprofiled([1.0, 1.0], [[5.0], []])  # not the same graphs


def test_touch_sets_each_graph_once_then_uploads_and_times_both(monkeypatch):
    """--touch: every graph a step replays gets one node set to its own parameters, then one upload,
    with the step timed after each."""
    calls = []

    class Graph:
        def raw_cuda_graph(self):
            return id(self)

        def raw_cuda_graph_exec(self):
            return id(self) + 1

    a, b = Graph(), Graph()
    monkeypatch.setattr(gpu_gaps.torch.cuda, "synchronize", lambda: None)
    monkeypatch.setattr(gpu_gaps.torch.cuda, "current_stream", lambda: type("S", (), {"cuda_stream": 7})())
    monkeypatch.setattr(gpu_gaps.torch.cuda.CUDAGraph, "replay", lambda self: None)
    monkeypatch.setattr(gpu_gaps.cuda_driver, "nodes", lambda raw: [("memset", "memset"), (f"k{raw}", "kernel")])
    monkeypatch.setattr(gpu_gaps.cuda_driver, "kernel_params", lambda node: (f"p{node}", []))
    monkeypatch.setattr(gpu_gaps.cuda_driver, "exec_handle", lambda raw: raw)
    monkeypatch.setattr(gpu_gaps.cuda_driver, "set_kernel_params", lambda e, n, p: calls.append(("set", e, n, p)))
    monkeypatch.setattr(gpu_gaps.cuda_driver, "upload", lambda e, s: calls.append(("upload", e, s)))

    class Unkept(Graph):
        def raw_cuda_graph(self):
            raise RuntimeError("keep_graph=False")

    class Task:
        def step(self, fn):  # graph a twice a step, then b, then one whose nodes cannot be read
            for g in (a, a, b, Unkept()):
                gpu_gaps.torch.cuda.CUDAGraph.replay(g)
    text = gpu_gaps.touched(Task(), None)
    assert calls == [("set", id(a) + 1, f"k{id(a)}", f"pk{id(a)}"), ("set", id(b) + 1, f"k{id(b)}", f"pk{id(b)}"),
                     ("upload", id(a) + 1, 7), ("upload", id(b) + 1, 7)]
    first, then = text.splitlines()
    assert first.startswith("After one kernel node of each graph (2 kept) was set to its own parameters: Without")
    assert then.startswith("Then after cuGraphUpload of each: Without the profiler, 20 steps")
