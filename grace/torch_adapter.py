"""Every torch-private name GraCE uses, in one place: a torch upgrade touches only this file (the
harness has its own, experiments/instrument.py).

Written against torch 2.11 (the GPU machine) and checked on the CI's torch 2.14.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import re
import sys
from collections.abc import Iterator

import torch
import torch._inductor.config as _inductor_config
import torch._inductor.output_code as _output_code
import torch._inductor.utils as _inductor_utils
from torch._inductor.compile_fx import compile_fx, compile_fx_inner  # noqa: F401  (re-exported)
# the restart Dynamo takes from a backend (a scalar to specialize, then trace again); it wraps the others
from torch._dynamo.exc import TensorifyScalarRestartAnalysis as DynamoRestart  # noqa: F401  (re-exported)
from torch._inductor.custom_graph_pass import CustomGraphPass as _CustomGraphPass
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten  # noqa: F401  (re-exported)

TRACED_TENSOR = torch._refs.tensor  # what Dynamo traces torch.tensor of symbolic scalars as


@contextlib.contextmanager
def partitioned() -> Iterator[None]:
    """Within the block, Inductor splits each graph into CUDA-graph partitions (CPU ops, device copies
    and unsafe ops stay outside, as under reduce-overhead) without wrapping them in graph trees: an
    identity wrapper registered through the unstable `set_customized_partition_wrappers` hook (2.9+;
    what vLLM uses) turns partitioning on, and the caller wraps the partitions afterwards."""
    previous = _inductor_utils._unstable_customized_partition_wrapper.wrapper
    _inductor_utils.set_customized_partition_wrappers(lambda fn, metadata: fn)
    try:
        yield
    finally:
        _inductor_utils.set_customized_partition_wrappers(previous)


class _CacheKey(_CustomGraphPass):
    """A no-op post-grad pass whose uuid keeps GraCE's partitioned compiles apart from unpartitioned
    ones in Inductor's FX-graph cache (whether partitioning was on is not part of the cache key). A
    pass the user had installed still runs first."""

    def __init__(self, user_pass):
        self.user_pass = user_pass

    def __call__(self, graph) -> None:
        if self.user_pass is not None:
            self.user_pass(graph)

    def uuid(self):
        user = self.user_pass.uuid() if self.user_pass is not None and hasattr(self.user_pass, "uuid") else None
        return ("grace-partitioned-1", user)


def partition_config_patches() -> dict:
    """Inductor config for a compile whose partitions GraCE wraps: no graph trees, own cache key."""
    return {"triton.cudagraphs": False,
            "post_grad_custom_post_pass": _CacheKey(_inductor_config.post_grad_custom_post_pass)}


@dataclasses.dataclass(frozen=True)
class Partition:
    index: int
    static: frozenset[int]  # partition inputs that are parameters or buffers (static graph inputs)
    mutated: frozenset[int]  # partition inputs that the graph mutates in place
    produced: frozenset[int] | None = None  # inputs another partition made (intermediates); None: unknown
    # outputs that reach the caller as graph outputs the user sees (a training forward's: AOTAutograd's
    # autograd function hands them on; not the activations saved for backward); None: unknown
    returned: frozenset[int] | None = frozenset()

    def spread(self, items: list[int | None]) -> Partition:
        """This partition with its inputs flattened: input i a list or tuple of items[i] leaves, in
        their place, or itself (None). A leaf counts as produced and mutated where its list does, and
        never as static (a parameter is a graph input of its own)."""
        width = [1 if n is None else n for n in items]
        start = [sum(width[:i]) for i in range(len(width))]

        def leaves(inputs: frozenset[int]) -> frozenset[int]:
            return frozenset(start[i] + k for i in inputs if i < len(width) for k in range(width[i]))

        return dataclasses.replace(
            self, static=frozenset(start[i] for i in self.static if i < len(items) and items[i] is None),
            mutated=leaves(self.mutated), produced=None if self.produced is None else leaves(self.produced))

    def writable(self, inputs: int) -> frozenset[int]:
        """The inputs one run may write: those it mutates, and the intermediates, which Inductor may
        compute into in place (where not known, every input that is not static). A graph input it does
        not report as mutated it never writes."""
        maybe = self.produced if self.produced is not None else frozenset(range(inputs)) - self.static
        return self.mutated | maybe


def user_visible_outputs(gm: torch.fx.GraphModule) -> frozenset[int] | None:
    """The graph outputs that Inductor marked as the user's (a training forward's model outputs, as
    AOTAutograd lays them out), or None where it did not say."""
    idxs = gm.graph.find_nodes(op="output")[0].meta.get("user_visible_output_idxs")
    return frozenset(idxs) if idxs else None


def _as_list(graph_outputs) -> list[int]:
    """A partition output's graph outputs: torch 2.14 maps each to a list, 2.11 to one index or None."""
    if graph_outputs is None:
        return []
    return list(graph_outputs) if isinstance(graph_outputs, (list, tuple)) else [graph_outputs]


def partitions(compiled, static_input_idxs, user_visible: frozenset[int] | None = frozenset()) -> list[Partition] | None:
    """The partitions of a CompiledFxGraph, which of their inputs are static or mutated, and which of
    their outputs are among the graph outputs `user_visible` (None: not known); None if the compiled
    graph has no partition runner (e.g. nothing to run on the GPU)."""
    if getattr(compiled, "recursively_apply_fns", None) is None or not getattr(compiled, "partition_maps", None):
        return None
    static, mutated = set(static_input_idxs or ()), set(compiled.mutated_input_idxs)
    out = []
    for pm in compiled.partition_maps:
        mapping, to_graph = pm.input_index_mapping, getattr(pm, "output_index_mapping", None)
        returned = None if user_visible is None or to_graph is None else frozenset(
            j for j, graph_outputs in enumerate(to_graph) if user_visible.intersection(_as_list(graph_outputs)))
        out.append(Partition(pm.id, frozenset(i for i, g in enumerate(mapping) if g is not None and g in static),
                             frozenset(i for i, g in enumerate(mapping) if g is not None and g in mutated),
                             frozenset(i for i, g in enumerate(mapping) if g is None), returned))
    return out


def beyond_one_partition(compiled) -> str | None:
    """What the compiled graph's call does beyond running one partition on graph inputs (None: nothing):
    another partition, an input made outside it, an input mutated outside it. Outputs made outside it,
    or made views of, show in what the call returns (grace.lean)."""
    maps = compiled.partition_maps
    if len(maps) != 1:
        return f"{len(maps)} CUDA-graph partitions"
    used = set(maps[0].input_index_mapping)
    if None in used:
        return "a partition input is computed outside the partition"
    if set(compiled.mutated_input_idxs) - used:
        return "an input is mutated outside the partition"
    return None


def realigned_inputs(compiled) -> frozenset[int]:
    """The inputs of the compiled graph's first partition that Inductor copies to an aligned address
    when they come misaligned (its inputs_to_check, as partition inputs)."""
    checked = set(compiled.inputs_to_check)
    return frozenset(i for i, g in enumerate(compiled.partition_maps[0].input_index_mapping) if g in checked)


def partition_inputs(compiled) -> tuple[int | None, ...]:
    """The compiled graph's input that each input of its one partition is (beyond_one_partition: each
    tensor input is one): its tensors, then its sizes, which Inductor's generated call passes on from
    its own int inputs (`s77 = arg0_1`). None for a size the call binds otherwise, or where the call
    does not read as expected."""
    tensors = list(compiled.partition_maps[0].input_index_mapping)
    code = getattr(compiled, "source_code", None) or ""
    code = code[code.find("def call(self, args):"):]  # the call's body: up to the next unindented line
    end = re.compile(r"^\S", re.M).search(code, code.find("\n") + 1)
    code = code[:end.start() if end else len(code)]
    unpack = re.search(r"^ *([\w, ]*) = args$", code, re.M)
    passed = re.search(r"^ *partition0_args = \[([\w, ]*)\]$", code, re.M)
    if not unpack or not passed:
        return (*tensors,)
    inputs = [n for n in map(str.strip, unpack.group(1).split(",")) if n]
    bound = dict(re.findall(r"^ *(\w+) = (\w+)$", code, re.M))
    sizes = [n for n in map(str.strip, passed.group(1).split(",")) if n][len(tensors):]
    return (*tensors, *(inputs.index(bound[s]) if bound.get(s) in inputs else None for s in sizes))


def graph_outputs(gm: torch.fx.GraphModule) -> int:
    return len(gm.graph.find_nodes(op="output")[0].args[0])


def lifted(gm: torch.fx.GraphModule) -> tuple[torch.Tensor, ...]:
    """The tensors AOTAutograd passes the compiled graph ahead of Dynamo's arguments on every call (the
    graph module's parameters, then its buffers: a compiled optimizer step's parameters and state)."""
    return (*(p for _, p in gm.named_parameters(remove_duplicate=False)),
            *(b for _, b in gm.named_buffers(remove_duplicate=False)))


def current_device() -> int:
    return torch._C._cuda_getDevice()


def autocast_enabled() -> bool:
    return torch._C._is_any_autocast_enabled()


def wrap_partitions(compiled, wrappers) -> None:
    """Replace partition i of `compiled` by wrappers[i](partition_fn)."""
    compiled.recursively_apply_fns(wrappers)


def is_compiled_graph(compiled) -> bool:
    """Whether Inductor compiled the graph (a CompiledFxGraph); for a graph with nothing to compile it
    hands back a plain function, with no partitions and no post-compile steps."""
    return isinstance(compiled, _output_code.CompiledFxGraph)


def finish_post_compile(compiled, example_inputs) -> None:
    """What Inductor's post_compile skips when a customized partition wrapper is set and does otherwise
    without CUDA graphs: hand output strides to AOTAutograd, and realign inputs that the kernels assume
    16-byte aligned."""
    set_strides = getattr(_inductor_utils, "set_tracing_context_output_strides", None) or getattr(
        _output_code, "set_tracing_context_output_strides")
    set_strides(example_inputs, compiled)
    realign = _output_code.maybe_realign_inputs
    args = [_inductor_utils.BoxedBool(False), compiled, compiled.inputs_to_check]
    if len(inspect.signature(realign).parameters) >= 4:
        args.append(compiled.mutated_input_idxs)
    realign(*args)


def device_types(compiled) -> set[str]:
    return set(getattr(compiled, "device_types", ()) or ())


def gpu_spin(cycles: int) -> None:
    """A kernel that spins `cycles` GPU clock cycles, keeping the device busy while the host queues work."""
    torch.cuda._sleep(cycles)


def data_ptrs_equal(tensors: list, ptrs: list[int | None], idxs: list[int]) -> bool:
    """tensors[i].data_ptr() == ptrs[i] for each i in idxs, in one C++ call (what graph trees use);
    ptrs is as long as tensors."""
    return torch._C._tensors_data_ptrs_at_indices_equal(tensors, ptrs, idxs)


def storage_handles(tensors: list[torch.Tensor]) -> list[int]:
    """Handles of the tensors' storages, taken once: a graph's output tensors keep theirs for life."""
    return [t.untyped_storage()._cdata for t in tensors]


def storage_weak_ref(t: torch.Tensor):
    """A weak reference to `t`'s storage (as graph trees keep of their inputs): expired() once freed."""
    from torch.multiprocessing.reductions import StorageWeakRef

    return StorageWeakRef(t.untyped_storage())


def storage_objects(tensors: list[torch.Tensor]) -> list:
    """The Python objects of the tensors' storages. Torch keeps one per storage once made, and it holds a
    use of the storage for good: a caller who keeps only `y.untyped_storage()` shows in its Python
    references alone."""
    return [t.untyped_storage() for t in tensors]


def references(tensors: list[torch.Tensor], storages: list[int],
               objects: list) -> tuple[list[int], list[int], list[int], list[int]]:
    """Python references, TensorImpl references, storage references and Python references to the
    storages' objects (storage_handles, storage_objects), each a list over the tensors: if any grows, some
    other code holds the tensor, its impl (autograd's saved tensors), a view of its storage or the storage
    itself. Always call it the same way: the counts include this function's own references. (Four maps
    over C functions: a graph may have thousands of outputs, and this runs on every call.)"""
    return (list(map(sys.getrefcount, tensors)), list(map(torch.Tensor._use_count, tensors)),
            list(map(torch._C._storage_Use_Count, storages)), list(map(sys.getrefcount, objects)))


def has_internal_overlap(t: torch.Tensor) -> bool:
    """Whether some elements of `t` share memory (an expanded or overlapping strided view): no copy can be
    written into it. Where torch cannot tell (any view that is not dense, a slice say), `t` is free of
    overlap if each dim, in order of stride, steps past everything the smaller-strided dims span."""
    verdict = torch._debug_has_internal_overlap(t)  # 0: no, 1: yes, 2: too complex to tell
    if verdict != 2:
        return verdict == 1
    span = 0  # the furthest element the dims with smaller strides reach
    for size, stride in sorted(((n, abs(s)) for n, s in zip(t.shape, t.stride()) if n > 1), key=lambda d: d[1]):
        if stride <= span:
            return True
        span += (size - 1) * stride
    return False


def fake_propagate(gm, example_inputs) -> None:
    """Fill node.meta["val"] of a Dynamo graph by running it on fake tensors (in the graph's own fake
    mode when its nodes carry one), under the Python dispatcher as Dynamo traces: without it, a composite
    op given symbolic sizes (VM's F.interpolate(mask, size=(max(s, ...), 1))) asks for concrete ones and
    the graph could not be propagated, so CGCT did not run on it."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = detect_fake_mode(example_inputs)
    if mode is None:
        metas = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
        mode = detect_fake_mode(metas)
    if mode is None:
        from torch._subclasses import FakeTensorMode
        mode = FakeTensorMode(allow_non_fake_inputs=True)
    inputs = [mode.from_tensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, torch._subclasses.FakeTensor)
              else x for x in example_inputs]

    class Prop(FakeTensorProp):
        def fetch_attr(self, target):
            # the module's own tensors faked too: a compiled optimizer step's graph holds the parameters
            # and their state as attributes, which Dynamo's mode refuses, or would update for real
            value = super().fetch_attr(target)
            if isinstance(value, torch.Tensor) and not isinstance(value, torch._subclasses.FakeTensor):
                return mode.from_tensor(value, static_shapes=True)
            return value

    with enable_python_dispatcher():
        Prop(gm, mode).propagate_dont_convert_inputs(*inputs)


def register_backend(fn, name: str) -> None:
    """Make `torch.compile(backend=name)` find `fn` once this module is imported. Without the import,
    Dynamo finds it through the package's `torch_dynamo_backends` entry point, and registers it itself
    after loading it: then (an entry point known and not yet loaded) this leaves it to Dynamo."""
    from torch._dynamo.backends import registry

    if name not in registry._COMPILER_FNS and registry._BACKENDS.get(name) is None:
        registry.register_backend(fn, name=name)


def aot_config():
    """AOTAutograd's settings while GraCE compiles.

    Its cache would hand back a compiled graph without calling the inner compiler, so GraCE's partition
    wrappers would never be installed: off.

    Donated buffers would let a backward graph write over saved activations it has read (Inductor reuses
    their memory, torch/_inductor/ir.py DonatedBuffer), so that running it twice on the same inputs
    computes garbage the second time. Stock graph trees run it once per step; GraCE runs a partition again
    within one call (PI's check, SCG's timings), so these are off (docs/runtime.md)."""
    import torch._functorch.config as functorch_config

    return functorch_config.patch(enable_autograd_cache=False, donated_buffer=False)


def collective_group(gm: torch.fx.GraphModule):
    """The process group whose ranks must run `gm`'s collectives (functional collectives, as Inductor
    sees them: torch.ops._c10d_functional) in step: the one group they use, the default group where they
    use several, None where there are none."""
    names = set()
    for node in gm.graph.nodes:
        if not (isinstance(node.target, torch._ops.OpOverload) and node.target.namespace == "_c10d_functional"):
            continue
        where = [i for i, a in enumerate(node.target._schema.arguments) if a.name == "group_name"]
        if where:
            i = where[0]
            names.add(node.args[i] if i < len(node.args) else node.kwargs["group_name"])
    if not names:
        return None
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    return _resolve_process_group(names.pop()) if len(names) == 1 else dist.group.WORLD
