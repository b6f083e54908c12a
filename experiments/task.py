"""A workload made ready to run in one mode: model and inputs in place, and the step that mode means.

eval:  one forward pass under inference mode, model and floating inputs cast to the workload's eval dtype.
train: one full step under autocast to the workload's train dtype (bfloat16 unless it says why not):
       zero grads, forward and loss (`target`: compiled as one, WithLoss), backward, optimizer step
       (optimizer_step: compiled like the model with measure.compile_optimizer), as the paper's harness
       compiles the whole iteration.
"""

from __future__ import annotations

import contextlib
import copy
from collections.abc import Iterator
from typing import Any, Callable

import torch

from experiments.workloads import Workload
from experiments.instrument import pytree
from grace.torch_adapter import has_internal_overlap


def _cast(x: Any, dtype: torch.dtype) -> Any:
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _detached_clone(tree: Any) -> Any:
    return pytree.tree_map(lambda t: t.detach().clone() if isinstance(t, torch.Tensor) else t, tree)


def _call(fn: Callable, inputs: Any) -> Any:
    return fn(**inputs) if isinstance(inputs, dict) else fn(*inputs)


class WithLoss(torch.nn.Module):
    """A training workload's forward and its loss as one module, so that a variant compiles both: left
    outside, the loss ran as eager kernels between the graphs (DCGAN's three BCE losses, say)."""

    def __init__(self, model: torch.nn.Module, loss: Callable[[Any], torch.Tensor]):
        super().__init__()
        self.model, self.loss = model, loss

    def forward(self, *args, **kwargs):
        return self.loss(self.model(*args, **kwargs))


class Task:
    def __init__(self, workload: Workload, seed: int):
        self.workload = workload
        self.mode = workload.mode
        torch.manual_seed(seed)
        model, inputs = workload.build()
        self.calls = 0
        if self.mode == "eval":
            self.compute_dtype = self.input_dtype = workload.eval_dtype
            self.model = model.eval().to(self.compute_dtype)
            self.optimizer = None
        else:
            self.compute_dtype, self.input_dtype = workload.train_dtype, None  # train: autocast casts
            self.model = model.train()
            self.optimizer = torch.optim.SGD(self.model.parameters(), lr=1e-3, momentum=0.9)
            self._make_optimizer_state()
        self.optimizer_step: Callable[[], object] | None = self.optimizer.step if self.optimizer else None
        self.target = self._target()
        self.input_sets = self._sets(inputs)  # step i takes set i mod len

    def _target(self) -> torch.nn.Module:
        """What a step calls, and what a variant compiles: the model; in train, the model and its loss."""
        return self.model if self.optimizer is None else WithLoss(self.model, self.workload.loss)

    def _make_optimizer_state(self) -> None:
        """SGD's momentum buffers, made now by a step on zero gradients: it moves no weight, and the first
        real step then computes what it would have. Made inside a compiled step instead, they would live
        in a CUDA-graph pool that the next replay overwrites (stock pt2_cg then fails)."""
        params = [p for p in self.model.parameters() if p.requires_grad]
        for p in params:
            p.grad = torch.zeros_like(p)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _sets(self, inputs: Any) -> list:
        """Inputs as built (one set, or a list with varying_inputs) as this task's steps take them: a list of
        sets, on the workload's device, floating ones in the input dtype."""
        sets = inputs if self.workload.varying_inputs else [inputs]
        return pytree.tree_map(lambda x: _cast(x.to(self.workload.device), self.input_dtype or x.dtype)
                               if isinstance(x, torch.Tensor) else x, sets)

    def fresh_inputs(self, seed: int) -> Any:
        """Inputs as built from another seed (the model built with them is dropped): other values of the
        same shapes, for a step that a replay reading its old inputs would get wrong."""
        torch.manual_seed(seed)
        _, inputs = self.workload.build()
        return inputs

    @contextlib.contextmanager
    def fed(self, inputs: Any) -> Iterator[None]:
        """Within the block, steps take `inputs` (as fresh_inputs gives them), from their first set."""
        kept, calls = self.input_sets, self.calls
        self.input_sets, self.calls = self._sets(inputs), 0
        try:
            yield
        finally:
            self.input_sets, self.calls = kept, calls

    def step(self, fn: Callable) -> Any:
        """One iteration through `fn` (the target itself, or a compiled version of it)."""
        torch.compiler.cudagraph_mark_step_begin()  # a new iteration: earlier graph outputs may be reused
        inputs = self.input_sets[self.calls % len(self.input_sets)]
        self.calls += 1
        if self.optimizer is None:
            with torch.inference_mode():
                return _call(fn, inputs)
        self.optimizer.zero_grad(set_to_none=True)
        with torch.autocast(self.workload.device.type, dtype=self.compute_dtype,
                            enabled=self.compute_dtype != torch.float32):
            loss = _call(fn, inputs)
        loss.backward()
        self.optimizer_step()
        return loss.detach()

    def _changeable(self) -> list[torch.Tensor]:
        """What steps may change: the inputs (a workload may mutate them, a KV cache say), and in train
        mode the weights, buffers and the optimizer's state. Not an expanded input (BERT's token types,
        stride 0): torch refuses to write one in place, and so would rewind()."""
        inputs = [t for t in pytree.tree_leaves(self.input_sets)
                  if isinstance(t, torch.Tensor) and not has_internal_overlap(t)]
        if self.optimizer is None:
            return inputs
        state = [t for p in self.model.parameters() for t in self.optimizer.state.get(p, {}).values()
                 if isinstance(t, torch.Tensor)]
        return inputs + list(self.model.parameters()) + list(self.model.buffers()) + state

    def keep_initial(self) -> None:
        """Remember the state as it is now (on the host), for rewind()."""
        self.initial = [t.detach().to("cpu", copy=True) for t in self._changeable()]

    def unchanged(self) -> bool:
        """Whether the state is still what keep_initial() saw, and the next step takes the same inputs:
        then that step computes what the first did (eval on one input set that no step writes)."""
        return (self.optimizer is None and len(self.input_sets) == 1
                and all(torch.equal(live.cpu(), saved) for live, saved in zip(self._changeable(), self.initial, strict=True)))

    def rewind(self) -> None:
        """Back to the state keep_initial() saw, in place (the same tensors, so that graphs captured on
        them stay valid): inputs, weights, buffers and the optimizer's state, and the first input set
        next. The numerics check then compares one step with the reference's first."""
        with torch.no_grad():
            for live, saved in zip(self._changeable(), self.initial, strict=True):
                live.copy_(saved)
        self.calls = 0

    def observe(self, fn: Callable) -> dict[str, Any]:
        """One step, and copies of what numerics compares, by part: eval the outputs; train the loss, the
        gradients that the step applied and the change of the weights, apart, so that a well-conditioned
        loss is held to its own tolerance rather than drowned in the gradients', and a lost update shows."""
        if self.optimizer is None:
            return {"outputs": _detached_clone(self.step(fn))}
        before = [p.detach().clone() for p in self.model.parameters()]
        loss = self.step(fn)
        return {"loss": loss.clone(), "gradients": [_detached_clone(p.grad) for p in self.model.parameters()],
                "update": [p.detach() - b for p, b in zip(self.model.parameters(), before)]}

    def twin(self, dtype: torch.dtype | None = None) -> Task:
        """An independent eager copy in the same state (weights, optimizer state, inputs, which a workload
        may mutate, and the position in its input sets); with `dtype`, model, floating inputs and
        optimizer state cast to it (float64: the reference)."""
        twin = copy.copy(self)
        twin.model = copy.deepcopy(self.model)
        twin.input_dtype = dtype or self.input_dtype
        twin.input_sets = pytree.tree_map(
            lambda x: _cast(x, dtype) if dtype is not None else x.clone() if isinstance(x, torch.Tensor) else x,
            self.input_sets)
        if dtype is not None:
            twin.model.to(dtype)
        if self.optimizer is not None:
            twin.optimizer = type(self.optimizer)(twin.model.parameters(), **self.optimizer.defaults)
            # load_state_dict casts the state to each parameter's dtype; the deep copy keeps it unshared
            twin.optimizer.load_state_dict(copy.deepcopy(self.optimizer.state_dict()))
            twin.optimizer_step = twin.optimizer.step  # eager: the reference's
        twin.target = twin._target()
        return twin
