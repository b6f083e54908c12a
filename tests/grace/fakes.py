"""Stand-ins for CUDA graphs and partitions, so that the runtime's decisions can be tested on the CPU."""

import contextlib
from unittest import mock

import torch

from grace import pi, recording, runtime
from grace.torch_adapter import Partition


def _mlp():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))


def compiled_sgd_steps_match_eager(model, twin, inputs, options, **tolerance):
    """SGD with momentum on `model`, its step compiled by grace with `options`, against eager SGD on
    `twin` (the same weights), one step per input: parameters, momentum buffers, and each parameter's
    version bumped by the compiled step."""
    opt, opt_twin = (torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9) for m in (model, twin))
    step = torch.compile(opt.step, backend="grace", options=options)
    for x in inputs:
        for m in (model, twin):
            m.zero_grad()
            m(x).square().mean().backward()
        versions = [p._version for p in model.parameters()]
        step()
        opt_twin.step()
        assert all(p._version > v for p, v in zip(model.parameters(), versions))
        for p, q in zip(model.parameters(), twin.parameters()):
            torch.testing.assert_close(p, q, **tolerance)
            torch.testing.assert_close(opt.state[p]["momentum_buffer"], opt_twin.state[q]["momentum_buffer"],
                                       **tolerance)


def _partition_fn(calls):
    """A partition in Inductor's boxed convention: y = x * w + 1, and w += 1 when asked to mutate."""

    def fn(args):
        calls.append(len(args))
        x, w = args
        args.clear()
        return (x * w + 1,)

    return fn


def _unowned(t):
    """`t`'s memory seen by address, without keeping it alive (as a CUDA graph reads its inputs)."""
    storage = t.untyped_storage()
    memory = torch._C._construct_storage_from_data_pointer(storage.data_ptr(), t.device, storage.nbytes())
    return torch.empty(0, dtype=t.dtype).set_(memory, t.storage_offset(), t.size(), t.stride())


def _on_argument(out, copies, graph_args):
    """`out` as a capture leaves it: an output in an argument's copy is that argument, or its view (a
    capture runs nothing, so what it returns of an input is the input's own memory)."""
    if not isinstance(out, torch.Tensor):
        return out
    for c, a in zip(copies, graph_args):
        if isinstance(c, torch.Tensor) and out.untyped_storage().data_ptr() == c.untyped_storage().data_ptr():
            if out is c:
                return a
            start = (a.storage_offset() - c.storage_offset()) * a.element_size()  # bytes: out may be another dtype
            offset = (start + out.storage_offset() * out.element_size()) // out.element_size()
            return torch.empty(0, dtype=out.dtype).set_(a.untyped_storage(), offset, out.size(), out.stride())
    return out


def fake_capture(fn, graph_args):
    """Like a CUDA graph: capturing has no effect (here fn runs on copies, the RNG state put back, and
    graph_args is emptied, as the partition's call empties it in a real capture);
    each replay runs on the memory of the arguments it was recorded with (by address: it keeps no
    tensor alive) and writes the same output tensors."""
    recorded = [_unowned(a) if isinstance(a, torch.Tensor) else a for a in graph_args]
    rng = torch.get_rng_state()
    copies = [a.clone() if isinstance(a, torch.Tensor) else a for a in graph_args]
    outputs = [_on_argument(o, copies, graph_args) for o in fn(list(copies))]
    torch.set_rng_state(rng)
    # what a replay writes: not an argument's memory (a written argument is written through `recorded`)
    arguments = {a.untyped_storage().data_ptr() for a in graph_args if isinstance(a, torch.Tensor)}
    # only those: the arguments an output passes through are the caller's tensors, which a CUDA graph
    # does not keep alive either
    written = [o if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in arguments else None
               for o in outputs]
    graph_args.clear()  # as a capture of Inductor's boxed call leaves the list it was given

    def replay():
        for out, fresh in zip(written, fn(list(recorded))):
            if out is not None:
                out.copy_(fresh)

    return recording.Captured(replay, outputs, {"kernel": 1}, None)


def _part(fn, static=(), mutated=(), produced=None):
    """A PartitionGraph around `fn`; `produced`: the inputs another partition made (None: unknown)."""
    stats = runtime.Stats(graph=0, backward=False, partition=0)
    produced = frozenset(produced) if produced is not None else None
    return runtime.PartitionGraph(fn, Partition(0, frozenset(static), frozenset(mutated), produced), stats), stats


def _each_somewhere_new(tensors):
    """Each tensor in turn, every one at an address of its own, the one before freed by then (as
    activations that code outside graphs makes anew each call)."""
    tensors = list(tensors)
    for i in range(len(tensors)):
        t, tensors[i] = tensors[i], None
        yield t


class _Repointable:
    """A CUDA-graph stand-in that PI can re-point: each replay runs the partition on what `reads` holds
    (the placeholders, as recorded), adding `noise` to the outputs as atomic adds would."""

    def __init__(self, fn, graph_args, noise):
        self.fn, self.reads, self.noise = fn, list(graph_args), noise
        self.outputs = fn(list(graph_args))  # as a capture: an output may be an argument itself
        # what a replay writes: not an argument passed through (no kernel writes it)
        self.own = [all(o.untyped_storage().data_ptr() != a.untyped_storage().data_ptr() for a in graph_args)
                    for o in self.outputs]
        self.order = torch.Generator().manual_seed(0)  # not the RNG state that SCG and PI put back

    def replay(self):
        for out, own, fresh in zip(self.outputs, self.own, self.fn(list(self.reads))):
            if own:
                out.copy_(fresh + self.noise * torch.randn(fresh.shape, generator=self.order))

    def raw_cuda_graph(self):
        return 0

    raw_cuda_graph_exec = raw_cuda_graph


def _repointable_part(monkeypatch, noise=0.0, repoints=True, fn=None):
    """A partition (y = x * w + 1, w static; or `fn` of x, w and more) with PI on, captured in
    _Repointable stand-ins whose PI serves x, the first input, the one its kernel reads: point() makes
    the stand-in read the live tensor at that address (unless `repoints` is off: a reader left on its
    placeholder). Returns the partition, its stats and live(x), which registers a caller's tensor by
    address."""
    graphs, live = [], {}

    def capture(fn, graph_args):
        graph = _Repointable(fn, graph_args, noise)
        graphs.append(graph)
        return recording.Captured(graph.replay, graph.outputs, {"kernel": 1}, graph)

    class Indirection:
        def __init__(self, raw_graph, raw_exec, ranges):
            self.graph, self.inputs, self.reasons, self.nodes = graphs[-1], {0} & set(ranges), {}, ["node"]
            self.untouchable: set[int] = set()
            self.placeholder = self.graph.reads[0]

        def point(self, ptrs):
            if repoints:
                self.graph.reads[0] = live.get(ptrs[0], self.placeholder)

    monkeypatch.setattr(recording, "capture", capture)
    monkeypatch.setattr(pi, "Indirection", Indirection)
    part, stats = _part(fn or _partition_fn([]), static={1})
    part.pi = True
    return part, stats, lambda x: live.setdefault(x.data_ptr(), x)


def _returns_its_inputs(args):
    """y = x * w + 1, returned with x and z as they came (a training forward's inputs saved for backward;
    no kernel reads z)."""
    x, w, z = args
    args.clear()
    return (x * w + 1, x, z[1:])


def _returns_its_input_bits(args):
    """y = x * w + 1, returned with x's bits as int32 (a view PI cannot make from the input)."""
    x, w = args
    args.clear()
    return (x * w + 1, x.view(torch.int32))


def _add_one_then_scale(args):
    """A partition that writes its second input: w += 1, then x * w."""
    x, w = args
    args.clear()
    w.add_(1)
    return (x * w,)


def _capture_on_the_arguments(fn, graph_args):
    """As a CUDA graph captures: fn runs on the very arguments (the partitions here are pure), so an output
    may be an argument or a view of one; the graph itself keeps no Python tensor, and each replay writes
    the outputs in its own memory again."""
    outputs = fn(list(graph_args))
    own = [o if all(o.untyped_storage().data_ptr() != a.untyped_storage().data_ptr() for a in graph_args) else None
           for o in outputs]
    recorded = [_unowned(a) for a in graph_args]

    def replay():
        for out, fresh in zip(own, fn(list(recorded))):
            if out is not None:
                out.copy_(fresh)

    return recording.Captured(replay, outputs, {"kernel": 1}, None)


def _first_n_doubled(args):
    """A partition with dynamic shapes takes the sizes as ints too."""
    n, x = args
    args.clear()
    return (x[:n] * 2,)


@contextlib.contextmanager
def cpu_graphs():
    """GraCE's runtime on the CPU, with fake_capture standing in for CUDA graph capture."""
    with mock.patch.object(recording, "capture", fake_capture), mock.patch.object(recording, "DEVICE_TYPE", "cpu"), \
            mock.patch.object(recording, "caller_capturing", lambda: False), \
            mock.patch.object(pi, "LIBRARY_ALIGNMENT", 64):  # what every CPU allocation has
        yield


@contextlib.contextmanager
def cpu_partitions():
    """Inductor partitions CPU code as it does CUDA code (where it splits, every node counts as on a
    GPU; its code generation is the CPU's), and GraCE's runtime captures the partitions with the CPU
    stand-in: the backend end to end, on a CPU. Caches off: code partitioned so must not be found by a
    compile without this."""
    from torch._inductor import scheduler

    split, on_gpu = scheduler.Scheduler.should_partition, scheduler.BaseSchedulerNode.is_gpu

    def should_partition(self, node):
        scheduler.BaseSchedulerNode.is_gpu = lambda n: True
        try:
            return split(self, node)
        finally:
            scheduler.BaseSchedulerNode.is_gpu = on_gpu

    torch.compiler.reset()
    with cpu_graphs(), mock.patch.object(scheduler.Scheduler, "should_partition", should_partition), \
            torch._inductor.config.patch(fx_graph_cache=False), torch._functorch.config.patch(enable_autograd_cache=False):
        yield
    torch.compiler.reset()
