"""Small programs, each a known CUDA-graph hazard, as a user would write them.

Each is a builder `(device, compile) -> Program`: it makes its model from the current seed, applies
`compile` where a user would (the whole module, each block, two modules sharing weights) and returns
the step and the inputs of each call. `compile` is the identity for eager.
"""

from __future__ import annotations

import collections
import copy
import dataclasses
import io
import math
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint


@dataclasses.dataclass
class Program:
    step: Callable[..., Any]  # one call: returns what is compared with eager
    inputs: Callable[[int], tuple]  # the arguments of call i (the same for every variant)
    compare: str = "close"  # with eager: close (elementwise), norm (normwise, deep float32 models), random
                            # (numbers drawn inside: shape, dtype and finiteness, and whether a call drew
                            # the same numbers as the one before where eager did), none (data-dependent)


Compile = Callable[[Any], Any]
HAZARDS: dict[str, Callable[[torch.device, Compile], Program]] = {}


def hazard(fn):
    HAZARDS[fn.__name__] = fn
    return fn


def _mlp(width: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(width, width), nn.GELU(), nn.Linear(width, width))


def _x(device, *shape, dtype=torch.float32):
    return lambda i: (torch.randn(*shape, generator=torch.Generator().manual_seed(i), dtype=dtype).to(device),)


def training(model: nn.Module, device, compile, inputs: Callable[[int], tuple],
             run: Callable[..., torch.Tensor] | None = None, compare: str = "close") -> Program:
    """A training step of `model` in train mode on inputs(i): the loss (what run(compiled model,
    *inputs) picks from its output, by default the output, summed with fixed weights of either sign: a
    mean square would be the same for every input after a final LayerNorm, and its gradients noise)
    and every gradient, each set to None first (one that stays None, of a parameter that the loss does
    not reach, counts as zeros: a compiled graph computes zeros for it where eager computes nothing)."""
    model = model.to(device).train()
    compiled = compile(model)
    run = run or (lambda f, *args: f(*args))

    def step(*args):
        for p in model.parameters():
            p.grad = None
        out = run(compiled, *args).float()
        loss = (out * torch.arange(out.numel(), device=out.device).view_as(out).cos()).mean()
        loss.backward()
        return [loss.detach()] + [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    return Program(step, inputs, compare)


def _training(model: nn.Module, device, compile, *shape) -> Program:
    return training(model, device, compile, _x(device, *shape))


# --- Python values and CPU tensors --------------------------------------------------------------

@hazard
def python_int_argument(device, compile):
    f = compile(lambda x, n: x * n + n)
    return Program(f, lambda i: (_x(device, 8)(i)[0], i + 1))


@hazard
def python_float_argument(device, compile):
    f = compile(lambda x, s: torch.sin(x) * s)
    return Program(f, lambda i: (_x(device, 8)(i)[0], 0.5 + i))


@hazard
def string_argument_selects_a_branch(device, compile):  # a guard on the string: one graph per value
    model = _mlp(8).to(device)

    def forward(x, output="logits"):
        y = model(x)
        return y.softmax(-1) if output == "probs" else y
    f = compile(forward)

    def step(x, output):
        with torch.no_grad():
            return f(x, output=output)
    return Program(step, lambda i: (_x(device, 4, 8)(i)[0], ("logits", "probs")[i % 2]))


@hazard
def shape_tuple_argument(device, compile):  # the target shape of a reshape, a tuple of Python ints
    f = compile(lambda x, shape: (x * 2).reshape(shape).sum(-1))
    return Program(f, lambda i: (_x(device, 4, 6)(i)[0], ((4, 6), (8, 3), (2, 12))[i % 3]))


@hazard
def interpolate_by_a_changing_scale(device, compile):  # a Python float that sets the output's size
    conv = nn.Conv2d(3, 4, 3, padding=1).to(device)
    f = compile(lambda x, scale: F.interpolate(conv(x), scale_factor=scale, mode="bilinear"))
    return Program(torch.no_grad()(f), lambda i: (_x(device, 1, 3, 8, 8)(i)[0], (2.0, 1.5, 2.0, 0.5)[i % 4]))


@hazard
def cpu_scalar_made_inside(device, compile):
    f = compile(lambda x: x * torch.tensor(2.0).to(x.device) + torch.tensor(1.0).to(x.device))
    return Program(f, _x(device, 8))


@hazard
def cpu_arange_made_inside(device, compile):
    f = compile(lambda x: x + torch.arange(x.shape[-1]).to(x.device))
    return Program(f, _x(device, 4, 8))


class _Denoiser(nn.Module):
    """A diffusion step: the timestep a Python int, its embedding made on the CPU, then moved."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)

    def forward(self, x, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(8) / 8)
        emb = torch.tensor([float(t)]) * freqs
        emb = torch.cat([emb.sin(), emb.cos()]).to(x.device)
        return self.lin(x + emb)


@hazard
def timestep_embedding_on_the_cpu(device, compile):
    model = _Denoiser().to(device)
    f = compile(model)
    return Program(torch.no_grad()(f), lambda i: (_x(device, 2, 16)(i)[0], 10 * i + 1))


class _TimestepDenoiser(nn.Module):
    """A diffusion model's step: the timestep a CPU tensor (a scheduler's), embedded on the CPU, then moved."""

    def __init__(self):
        super().__init__()
        self.time = nn.Linear(16, 16)
        self.body = nn.Sequential(nn.Linear(16, 16), nn.SiLU(), nn.Linear(16, 16))

    def forward(self, x, t):
        freqs = torch.exp(-math.log(10000) * torch.arange(8, dtype=torch.float32) / 8)
        emb = t.float()[:, None] * freqs[None]
        emb = torch.cat([emb.sin(), emb.cos()], -1).to(x.device)
        return self.body(x + self.time(emb))


@hazard
def denoising_loop_over_cpu_timesteps(device, compile):
    """A sampler's loop: each step calls the model with the next of the scheduler's timesteps, kept on
    the CPU, expanded to the batch (as diffusers' pipelines do)."""
    model = _TimestepDenoiser().to(device)
    f = compile(model)
    timesteps = torch.linspace(999, 0, 5).long()

    @torch.no_grad()
    def step(x):
        for t in timesteps:
            x = x - 0.1 * f(x, t.expand(x.shape[0]))
        return x
    return Program(step, _x(device, 2, 16))


@hazard
def cpu_tensor_input(device, compile):
    f = compile(lambda x, scale: x / scale)
    return Program(f, lambda i: (_x(device, 8)(i)[0], torch.tensor(2.0 + i)))


@hazard
def pinned_cpu_input_written_after_the_call(device, compile):
    """A pinned CPU tensor (a staging buffer, as pin_memory gives) that the compiled code copies to the GPU,
    written by the caller as soon as the call returns while the GPU is still busy with earlier work: the
    call must compute with the values it was given, as eager's blocking copy does."""
    on_gpu = device.type == "cuda"
    scale = torch.empty(4, pin_memory=on_gpu)
    busy = torch.randn(4096, 4096, device=device) if on_gpu else None  # about a millisecond of GPU work
    f = compile(lambda x, s: x * s.to(x.device))

    def step(i, x):
        if busy is not None:
            busy @ busy  # queued: a copy that does not wait for it runs after the call has returned
        scale.fill_(i + 1.0)
        out = f(x, scale)
        scale.fill_(-1.0)
        return out
    return Program(step, lambda i: (i, _x(device, 4)(i)[0]))


class _Schedule(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.table = torch.linspace(0.1, 1.0, 10)  # a plain CPU attribute, as samplers keep it

    def forward(self, x, step: int):
        return self.lin(x) * self.table[step].to(x.device)


@hazard
def cpu_table_indexed_by_step(device, compile):
    model = _Schedule().to(device)
    f = compile(model)
    return Program(torch.no_grad()(f), lambda i: (_x(device, 2, 8)(i)[0], i % 10))


@hazard
def python_counter_in_forward(device, compile):  # an attribute forward increments: a guard on its value
    class Counts(nn.Module):
        def __init__(self):
            super().__init__()
            self.linear, self.calls = nn.Linear(8, 8), 0

        def forward(self, x):
            self.calls += 1
            return self.linear(x) * (self.calls % 3)
    model = Counts().to(device)
    f = compile(model)

    def step(i, x):
        model.calls = i
        with torch.no_grad():
            return f(x)
    return Program(step, lambda i: (i, _x(device, 4, 8)(i)[0]))


# --- State mutated in place ----------------------------------------------------------------------

@hazard
def kv_cache_written_in_place(device, compile):
    cache = torch.zeros(4, 6, device=device)

    def step(x, pos):
        cache.index_copy_(1, pos, x)
        return cache.sum(dim=1)

    f = compile(step)
    return Program(f, lambda i: (_x(device, 4, 1)(i)[0], torch.tensor([i % 6], device=device)))


@hazard
def batchnorm_in_training(device, compile):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).to(device).train()
    f = compile(model)
    return Program(lambda x: [f(x), model[1].running_mean.clone()], _x(device, 4, 8))


@hazard
def input_mutated_in_place(device, compile):
    def step(x):
        x.mul_(2)
        return x + 1
    f = compile(step)
    return Program(lambda x: [f(x), x], _x(device, 8))


@hazard
def cache_grown_by_cat_in_forward(device, compile):  # a module attribute replaced by a larger tensor
    class Grows(nn.Module):
        def __init__(self):
            super().__init__()
            self.proj, self.cache = nn.Linear(8, 8), None

        def forward(self, x):
            k = self.proj(x)
            self.cache = k if self.cache is None else torch.cat([self.cache, k])
            return self.cache.sum(0)
    model = Grows().to(device)
    f = compile(model)

    def step(i, x):
        if i == 0:
            model.cache = None
        with torch.no_grad():
            return f(x)
    return Program(step, lambda i: (i, _x(device, 2, 8)(i)[0]))


@hazard
def embedding_renormed_in_forward(device, compile):  # max_norm: each lookup rescales its rows of the weight in place
    embedding = nn.Embedding(32, 8, max_norm=1.0).to(device)
    with torch.no_grad():
        embedding.weight.mul_(3)
    f = compile(embedding)

    def step(ids):
        with torch.no_grad():
            return [f(ids), embedding.weight.clone()]
    return Program(step, lambda i: (torch.tensor([(5 * i + k) % 32 for k in range(6)], device=device),))


# --- Random numbers ------------------------------------------------------------------------------
# The same input on every call, so that what changes from one call to the next is what was drawn: new
# numbers each call, or the same again where the seed is set again (Program.compare `random`)

def _same_x(device, *shape):
    x = _x(device, *shape)(0)
    return lambda i: x


@hazard
def dropout_in_training(device, compile):
    model = nn.Sequential(nn.Linear(8, 8), nn.Dropout(0.5)).to(device).train()
    return Program(compile(model), _same_x(device, 4, 8), compare="random")


@hazard
def rand_in_forward(device, compile):
    f = compile(lambda x: x + torch.rand_like(x))
    return Program(f, _same_x(device, 8), compare="random")


class _Attention(nn.Module):
    def __init__(self):
        super().__init__()
        self.qkv = nn.Linear(16, 48)

    def forward(self, x):
        q, k, v = self.qkv(x).view(2, 5, 3, 4, 4).permute(2, 0, 3, 1, 4)
        return F.scaled_dot_product_attention(q, k, v, dropout_p=0.2)


@hazard
def attention_dropout_in_training(device, compile):  # drawn inside the attention kernel
    return Program(compile(_Attention().to(device).train()), _same_x(device, 2, 5, 16), compare="random")


def _seeded_in_pairs(f, x, seed: Callable[[int], Any] = torch.manual_seed) -> Program:
    """f(x) after seed(i // 2) on call i: the same seed for two calls in turn, as a user reproducing a
    run sets it."""
    def step(i, x):
        seed(i // 2)
        return f(x)
    return Program(step, lambda i: (i, x), compare="random")


@hazard
def seed_set_again_between_calls(device, compile):
    f = compile(lambda x: F.dropout(x, 0.5) + torch.randn_like(x))
    return _seeded_in_pairs(f, _x(device, 4, 8)(0)[0])


@hazard
def tokens_sampled_with_a_seed(device, compile):
    """A decoding step that samples the next tokens (temperature, softmax, multinomial)."""
    head = nn.Linear(16, 50).to(device)
    f = compile(lambda h: torch.multinomial(torch.softmax(head(h) / 0.8, -1), 1))
    return _seeded_in_pairs(torch.no_grad()(f), _x(device, 16, 16)(0)[0])


@hazard
def dropout_masks_of_two_forwards_in_one_backward(device, compile):
    """Two forwards, each with its own dropout mask, then one backward, which must use each forward's
    mask: on ones, an element's gradient is exactly its output (kept: 3 / 0.5, dropped: 0). Compared
    as booleans, equal whatever numbers were drawn; and the two masks differ."""
    f = compile(lambda x: F.dropout(x, 0.5) * 3.0)

    def step(i):
        xs = [torch.ones(64, device=device, requires_grad=True) for _ in range(2)]
        ys = [f(x) for x in xs]
        (ys[0].sum() + ys[1].sum()).backward()
        return [x.grad == y for x, y in zip(xs, ys)] + [(ys[0] != ys[1]).any()]
    return Program(step, lambda i: (i,))


@hazard
def explicit_generator_in_forward(device, compile):
    generator = torch.Generator(device=device)
    f = compile(lambda x: x + torch.randn(x.shape, generator=generator, device=x.device) * 0.1)
    return _seeded_in_pairs(f, _x(device, 4, 8)(0)[0], generator.manual_seed)


# --- Data-dependent shapes -----------------------------------------------------------------------

@hazard
def nonzero(device, compile):
    f = compile(lambda x: torch.nonzero(x > 0).float().sum(0))
    return Program(f, _x(device, 6, 3))


@hazard
def boolean_mask(device, compile):
    f = compile(lambda x: x[x > 0] * 2)
    return Program(f, _x(device, 16))


@hazard
def unique(device, compile):
    f = compile(lambda x: torch.unique((x * 2).round()))
    return Program(f, _x(device, 16))


# --- Graph breaks --------------------------------------------------------------------------------

@hazard
def item_in_forward(device, compile):
    def step(x):
        s = x.sum().item()
        return x * s
    return Program(compile(step), _x(device, 8))


@hazard
def tolist_in_forward(device, compile):
    def step(x):
        values = x[:3].tolist()
        return x * sum(values)
    return Program(compile(step), _x(device, 8))


_SINK = io.StringIO()  # print's output, out of the way


@hazard
def print_in_forward(device, compile):
    def step(x):
        y = x * 2
        print("a print inside forward", file=_SINK)
        return y + 1
    return Program(compile(step), _x(device, 8))


@hazard
def branch_on_a_tensor_value(device, compile):
    def step(x):
        if x.mean() > 0:
            return x * 2
        return x - 1
    return Program(compile(step), _x(device, 8))


@hazard
def output_moved_to_the_cpu_in_forward(device, compile):  # a copy to the host ends the graph's work
    model = _mlp(8).to(device)
    f = compile(lambda x: model(x).argmax(-1).cpu())

    def step(x):
        with torch.no_grad():
            return f(x)
    return Program(step, _x(device, 4, 8))


# --- Shapes, outputs, aliasing -------------------------------------------------------------------

@hazard
def shape_changes_every_call(device, compile):
    model = _mlp().to(device)
    f = compile(model)
    return Program(torch.no_grad()(f), lambda i: (_x(device, 1 + i, 16)(i)[0],))


@hazard
def outputs_kept_across_calls(device, compile):
    model = _mlp().to(device)
    f = torch.no_grad()(compile(model))
    kept = []

    def step(x):
        kept.append(f(x))
        return list(kept)
    return Program(step, _x(device, 2, 16))


@hazard
def threads_sharing_a_model(device, compile):
    """A server's workers: four threads call one compiled model at once, each on an input of its own."""
    model = _mlp().to(device)
    f = torch.no_grad()(compile(model))
    pool = ThreadPoolExecutor(4)
    return Program(lambda x: list(pool.map(lambda k: f(x * (k + 1)), range(4))), _x(device, 2, 16))


@hazard
def captured_by_the_caller(device, compile):
    """A program that captures a CUDA graph of its own around the compiled call (as serving frameworks
    capture their decode step): from the third call on it copies the input in and replays that graph."""
    f = torch.no_grad()(compile(_mlp().to(device)))
    state: dict[str, Any] = {"calls": 0}

    def step(x):
        state["calls"] += 1
        if x.device.type != "cuda" or state["calls"] < 3:
            return f(x)
        if "graph" not in state:
            state["x"] = x.clone()
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # torch.cuda.graph's advice: a call on a side stream first
                f(state["x"])
            torch.cuda.current_stream().wait_stream(side)
            state["graph"] = torch.cuda.CUDAGraph()
            with torch.cuda.graph(state["graph"]):
                state["y"] = f(state["x"])
        state["x"].copy_(x)
        state["graph"].replay()
        return state["y"].clone()
    return Program(step, _x(device, 8, 16))


@torch.library.custom_op("grace_corpus::synchronizes", mutates_args=())
def _synchronizes(x: torch.Tensor) -> torch.Tensor:
    if x.is_cuda:  # as a user's op that reads a result on the host would: not allowed while captured
        torch.cuda.current_stream().synchronize()
    return x * 2


@_synchronizes.register_fake
def _(x):
    return torch.empty_like(x)


@hazard
def custom_op_that_synchronizes(device, compile):
    """A user's op that synchronizes, inside what Inductor takes for capturable: the capture fails, and
    random numbers drawn afterwards, outside any graph, must still work."""
    model = _mlp().to(device)
    f = torch.no_grad()(compile(lambda x: model(_synchronizes(model(x)))))

    def step(x):
        y = f(x)
        torch.rand(1, device=x.device)  # raises where a failed capture left the generator capturing
        return y
    return Program(step, _x(device, 4, 16))


@hazard
def output_aliases_input(device, compile):
    f = compile(lambda x: (x, x[0], x * 2))
    return Program(f, _x(device, 4, 4))


@hazard
def output_is_a_view(device, compile):
    f = compile(lambda x: (x * 2).t()[1:])
    return Program(f, _x(device, 4, 4))


@hazard
def output_expands_a_buffer(device, compile):  # an output that is a view of a buffer, which the caller then changes
    class Positions(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(8, 8)
            self.register_buffer("pos", torch.randn(1, 8))

        def forward(self, x):
            return self.lin(x) + self.pos, self.pos.expand(x.shape[0], -1)
    model = Positions().to(device)
    f = compile(model)

    def step(x):
        with torch.no_grad():
            y, pos = f(x)
            model.pos.add_(1)  # written through to `pos`, as in eager
            return [y, pos.clone()]
    return Program(step, _x(device, 4, 8))


@hazard
def outputs_in_a_dict_of_lists(device, compile):
    model = _mlp(8).to(device)

    def forward(x):
        hidden = [x]
        for layer in model:
            hidden.append(layer(hidden[-1]))
        return {"hidden_states": hidden[1:], "last": hidden[-1]}
    f = compile(forward)

    def step(x):
        with torch.no_grad():
            out = f(x)
            return out["hidden_states"] + [out["last"]]
    return Program(step, _x(device, 4, 8))


# --- Autograd, control flow, regions -------------------------------------------------------------

class _Square(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _WithFunction(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)

    def forward(self, x):
        return _Square.apply(self.lin(x))


@hazard
def custom_autograd_function(device, compile):
    return _training(_WithFunction(), device, compile, 4, 8)


class _Doubled(torch.autograd.Function):  # writes its input in place and says so (mark_dirty)
    @staticmethod
    def forward(ctx, x):
        ctx.mark_dirty(x)
        return x.mul_(2)

    @staticmethod
    def backward(ctx, grad):
        return grad * 2


@hazard
def custom_function_writing_its_input(device, compile):
    linear = nn.Linear(8, 8).to(device)
    f = compile(lambda x: _Doubled.apply(linear(x)) + 1)

    def step(x):
        linear.zero_grad()
        x = x.clone().requires_grad_()
        y = f(x)
        y.square().sum().backward()
        return [y.detach(), x.grad, linear.weight.grad]
    return Program(step, _x(device, 4, 8))


@hazard
def functorch_grad_inside(device, compile):  # torch.func.grad traced into the compiled graph
    w = torch.randn(8, generator=torch.Generator().manual_seed(1)).to(device)
    f = compile(lambda x: torch.func.grad(lambda x: (x * w).sin().sum())(x))
    return Program(f, _x(device, 8))


@hazard
def torch_cond(device, compile):
    def step(x):
        return torch.cond(x.sum() > 0, lambda v: v * 2, lambda v: v - 1, (x,))
    return Program(compile(step), _x(device, 8))


class _Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = _mlp(), _mlp()

    def forward(self, x):
        return self.b(checkpoint(self.a, x, use_reentrant=False))


@hazard
def activation_checkpointing(device, compile):
    return _training(_Checkpointed(), device, compile, 4, 16)


@hazard
def regional_compilation(device, compile):
    blocks = nn.ModuleList(_mlp() for _ in range(3)).to(device)
    compiled = [compile(b) for b in blocks]

    def forward(x):
        for b in compiled:
            x = b(x) + x
        return x
    return Program(torch.no_grad()(forward), _x(device, 2, 16))


@hazard
def weights_shared_by_two_compiled_modules(device, compile):
    shared = nn.Linear(16, 16).to(device)
    first, second = nn.Sequential(shared, nn.ReLU()), nn.Sequential(shared, nn.Tanh())
    f, g = compile(first), compile(second)
    return Program(torch.no_grad()(lambda x: (f(x), g(x))), _x(device, 2, 16))


@hazard
def training_step(device, compile):
    return _training(_mlp(), device, compile, 4, 16)


@hazard
def gradient_accumulation(device, compile):
    """Two micro-batches' gradients summed into the same .grad tensors (zeroed in place, not set to
    None): the second backward's replay must not write where the first one's gradients are held."""
    model = _mlp().to(device)
    compiled = compile(model)

    def step(x):
        model.zero_grad(set_to_none=False)
        for half in x.chunk(2):
            compiled(half).float().square().mean().backward()
        return [p.grad.clone() for p in model.parameters()]
    return Program(step, _x(device, 8, 16))


# --- Dtypes, layouts, grad modes -----------------------------------------------------------------

@hazard
def integer_tensors(device, compile):
    f = compile(lambda x: (x * 3 + 1) // 2 % 7)
    return Program(f, lambda i: (torch.arange(16, device=device) + i,))


@hazard
def bool_tensors(device, compile):
    f = compile(lambda x: (x > 0) & ~(x > 1))
    return Program(f, _x(device, 16))


@hazard
def complex_tensors(device, compile):
    f = compile(lambda x: (x * (1 + 2j)).abs())
    return Program(f, lambda i: (torch.randn(8, dtype=torch.complex64,
                                             generator=torch.Generator().manual_seed(i)).to(device),))


@hazard
def channels_last_convolution(device, compile):
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU()).to(device).to(memory_format=torch.channels_last)
    f = torch.no_grad()(compile(model))
    return Program(f, lambda i: (_x(device, 2, 3, 8, 8)(i)[0].to(memory_format=torch.channels_last),))


@hazard
def inference_in_grad_mode(device, compile):
    model = _mlp().to(device)
    f = compile(model)
    return Program(lambda x: f(x).detach(), _x(device, 2, 16))


@hazard
def inference_under_no_grad(device, compile):
    model = _mlp().to(device)
    return Program(torch.no_grad()(compile(model)), _x(device, 2, 16))


@hazard
def inference_mode(device, compile):
    model = _mlp().to(device)
    f = compile(model)

    def step(x):
        with torch.inference_mode():
            return f(x)
    return Program(step, _x(device, 2, 16))


@hazard
def bfloat16_autocast(device, compile):
    model = _mlp().to(device)
    f = compile(model)

    def step(x):
        with torch.autocast(device.type, dtype=torch.bfloat16), torch.no_grad():
            return F.layer_norm(f(x), (16,))
    return Program(step, _x(device, 2, 16))


@hazard
def sparse_input(device, compile):
    w = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)).to(device)
    f = compile(lambda s: torch.sparse.mm(s, w).relu())
    return Program(lambda x: f((x * (x > 0.5)).to_sparse()), _x(device, 6, 8))


# --- Inputs a graph reads where they lie ---------------------------------------------------------

@hazard
def same_tensor_passed_twice(device, compile):
    f = compile(lambda a, b: a * 2 + b.sin())
    return Program(lambda x: f(x, x), _x(device, 8))


@hazard
def overlapping_input_views(device, compile):
    f = compile(lambda a, b: a * 2 + b)
    return Program(lambda t: f(t[:-1], t[1:]), _x(device, 9))


@hazard
def transposed_input(device, compile):
    f = compile(_mlp().to(device))
    return Program(lambda x: f(x.t()), _x(device, 16, 4))


@hazard
def expanded_input(device, compile):  # stride 0: no copy can be written into it
    f = compile(lambda a: a * 2 + 1)
    return Program(lambda x: f(x.expand(4, 8)), _x(device, 1, 8))


@hazard
def empty_batch(device, compile):
    f = compile(_mlp().to(device))
    return Program(f, lambda i: _x(device, 0 if i % 2 else 3, 16)(i))


@hazard
def list_and_keyword_inputs(device, compile):
    f = compile(lambda xs, *, scale: sum(x * scale for x in xs))
    return Program(lambda x: f([x, x + 1, x * 3], scale=2.0), _x(device, 4, 4))


_Batch = collections.namedtuple("_Batch", "x mask")


@hazard
def namedtuple_input(device, compile):
    model = _mlp(8).to(device)
    f = compile(lambda batch: model(batch.x).masked_fill(batch.mask, 0.0))

    def step(x):
        with torch.no_grad():
            return f(_Batch(x, x > 0.5))
    return Program(step, _x(device, 4, 8))


@hazard
def global_tensor_changed_between_calls(device, compile):
    scale = torch.ones(1, device=device)
    f = compile(lambda x: x * scale)

    def step(i, x):
        scale.fill_(i + 1.0)
        return f(x)
    return Program(step, lambda i: (i, _x(device, 4, 4)(i)[0]))


_DATA = torch.randn(64, 8, generator=torch.Generator().manual_seed(0))


@hazard
def batches_sliced_from_one_tensor(device, compile):  # one storage, another offset each call
    data, f = _DATA.to(device), compile(_mlp(8).to(device))

    def step(i):
        with torch.no_grad():
            return f(data[4 * (i % 16):4 * (i % 16) + 4])
    return Program(step, lambda i: (i,))


@hazard
def input_buffer_resized_and_reused(device, compile):  # the caller's buffer, reallocated as it grows
    f = compile(lambda x: x * 2 + 1)
    buffer = torch.empty(0, device=device)

    def step(x):
        outs = []
        for n in (4, 8, 4):
            buffer.resize_(n, 8).copy_(x.repeat(2, 1)[:n])
            outs.append(f(buffer).clone())
        return outs
    return Program(step, _x(device, 4, 8))


@hazard
def called_on_a_side_stream(device, compile):  # one call on the current stream, one on another
    f = compile(_mlp(8).to(device))
    side = torch.cuda.Stream(device) if device.type == "cuda" else None

    def step(x):
        with torch.no_grad():
            y = f(x)
            if side is None:
                return [y, f(x + 1)]
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                z = f(x + 1)
            torch.cuda.current_stream(device).wait_stream(side)
            return [y, z]
    return Program(step, _x(device, 4, 8))


@hazard
def parameters_passed_as_arguments(device, compile):  # one graph, called with each layer's weights
    layers = nn.ModuleList(nn.Linear(8, 8) for _ in range(3)).to(device)
    f = compile(lambda w, b, x: torch.addmm(b, x, w.t()).relu())

    def step(x):
        with torch.no_grad():
            for layer in layers:
                x = f(layer.weight, layer.bias, x)
            return x
    return Program(step, _x(device, 4, 8))


# --- Weights the caller changes between calls ----------------------------------------------------

def _changed_at_call_2(device, compile, change) -> Program:
    """An MLP whose weights `change(model)` alters before call 2: later calls must see the new ones."""
    model = _mlp().to(device)
    f = compile(model)

    def step(i, x):
        if i == 2:
            change(model)
        return f(x)
    return Program(step, lambda i: (i, _x(device, 4, 16)(i)[0]))


@hazard
def weights_loaded_between_calls(device, compile):  # copied in place: the same storages
    return _changed_at_call_2(device, compile, lambda m: m.load_state_dict(
        {k: torch.randn_like(v) for k, v in m.state_dict().items()}))


@hazard
def parameter_data_swapped(device, compile):  # the same Parameter over a new storage
    return _changed_at_call_2(device, compile, lambda m: setattr(m[0].weight, "data", m[0].weight.data * 3))


@hazard
def parameter_reassigned(device, compile):
    return _changed_at_call_2(device, compile,
                              lambda m: setattr(m[0], "weight", nn.Parameter(m[0].weight.detach() * 3)))


@hazard
def weights_changed_to_channels_last(device, compile):  # the same values in new storages, strided otherwise
    model = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 4, 3)).to(device)
    f = compile(model)

    def step(i, x):
        model.to(memory_format=torch.channels_last if i % 2 else torch.contiguous_format)
        return f(x)
    return Program(step, lambda i: (i, torch.randn(2, 3, 12, 12, generator=torch.Generator().manual_seed(i)).to(device)))


@hazard
def compiled_model_deep_copied(device, compile):  # an EMA copy: its own weights, compiled code shared
    f = compile(_mlp().to(device))
    copies = []

    def step(x):
        y = f(x)
        if not copies:
            copies.append(copy.deepcopy(f))
            with torch.no_grad():
                for p in copies[0].parameters():
                    p.mul_(0.5)
        return y, copies[0](x)
    return Program(step, _x(device, 4, 16))


class _Counted(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(8, 8)
        self.register_buffer("steps", torch.zeros((), dtype=torch.long))

    def forward(self, x):
        self.steps += 1
        with torch.no_grad():
            self.lin.weight.clamp_(-0.2, 0.2)
        return self.lin(x) * self.steps


@hazard
def buffer_and_weight_changed_in_forward(device, compile):
    model = _Counted().to(device)
    f = compile(model)
    return Program(lambda x: [f(x), model.steps.clone(), model.lin.weight.clone()], _x(device, 4, 8))


# --- Outputs the caller feeds back, keeps or changes ---------------------------------------------

@hazard
def recurrent_state_fed_back(device, compile):  # call i's output is call i+1's input
    f = compile(nn.GRUCell(8, 8).to(device))
    state = {}

    def step(i, x):
        state["h"] = f(x, state["h"] if i else torch.zeros(4, 8, device=device))
        return state["h"].clone()
    return Program(step, lambda i: (i, _x(device, 4, 8)(i)[0]))


@hazard
def states_collected_over_a_loop(device, compile):
    f = compile(nn.GRUCell(8, 8).to(device))

    def step(x):
        h, hs = torch.zeros(4, 8, device=device), []
        for t in range(5):
            h = f(x[t], h)
            hs.append(h)
        return torch.stack(hs)
    return Program(step, _x(device, 5, 4, 8))


@hazard
def output_changed_in_place_by_the_caller(device, compile):
    f = compile(_mlp().to(device))

    def step(x):
        y = f(x)
        y.add_(1)
        return [y, f(x)]
    return Program(step, _x(device, 4, 16))


def _first_kept_by(device, compile, keep: Callable[[torch.Tensor], Any],
                   unkeep: Callable[[Any, torch.Size], torch.Tensor]) -> Program:
    """The caller keeps the first call's output only by what `keep` gives (a view, the storage), calls
    again, then reads the first output back through `unkeep`."""
    f = compile(lambda x: x * 2 + 1)

    def step(x):
        y = f(x)
        kept, shape = keep(y), y.shape
        del y
        second = f(x + 10)
        return [unkeep(kept, shape), second]
    return Program(step, _x(device, 4, 4))


@hazard
def view_of_an_output_kept(device, compile):
    return _first_kept_by(device, compile, lambda y: y[1:3], lambda kept, shape: kept)


@hazard
def tensor_kept_on_the_module_in_forward(device, compile):  # an output that forward stores, not returns
    class Remembers(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin, self.last = nn.Linear(8, 8), None

        def forward(self, x):
            y = self.lin(x).relu()
            self.last = y * 2
            return y
    model = Remembers().to(device)
    f = compile(model)
    kept = []

    def step(x):
        with torch.no_grad():
            y = f(x)
        kept.append(model.last)  # the caller collects them: a replay must not write over the older ones
        return [y, *kept[-3:]]
    return Program(step, _x(device, 4, 8))


@hazard
def storage_of_an_output_kept(device, compile):
    return _first_kept_by(device, compile, lambda y: y.untyped_storage(),
                          lambda kept, shape: torch.empty(0, device=device).set_(kept).view(shape))


@hazard
def output_shared_through_dlpack(device, compile):
    return _first_kept_by(device, compile, lambda y: torch.utils.dlpack.from_dlpack(torch.utils.dlpack.to_dlpack(y)),
                          lambda kept, shape: kept)


def _written_through(device, compile, view: Callable[[torch.Tensor], torch.Tensor], x) -> Program:
    """The caller writes into an output that is a view of its input: eager's input changes with it."""
    f = compile(lambda x: (view(x), x * 2))

    def step(x):
        y, doubled = f(x)
        y.mul_(3)
        return [y, doubled, x]
    return Program(step, x)


@hazard
def output_view_written_through(device, compile):
    return _written_through(device, compile, lambda x: x[1:], _x(device, 4, 4))


@hazard
def output_view_in_another_dtype_written_through(device, compile):
    return _written_through(device, compile, torch.view_as_real, _x(device, 4, 4, dtype=torch.complex64))


@hazard
def input_written_and_returned(device, compile):  # `x.mul_(2)` returned is x: writing it writes x
    f = compile(lambda x: x.mul_(2))

    def step(x):
        out = []
        for k in range(4):  # a new tensor each call, as a caller's batches are
            xk = x + k
            f(xk).add_(1)
            out.append(xk)
        return out
    return Program(step, _x(device, 4, 4))


@hazard
def outputs_fed_forward_and_kept(device, compile):  # each output is the next call's input, all kept
    f = compile(lambda x: x * 0.5 + 1)

    def step(x):
        ys = [x]
        for _ in range(4):
            ys.append(f(ys[-1]))
        return ys
    return Program(step, _x(device, 4, 4))


@hazard
def output_written_then_passed_back(device, compile):
    f = compile(lambda x, y: x * 2 + y)

    def step(x):
        y = f(x, x)
        y[0] = 100.0
        return [y, f(y, x)]
    return Program(step, _x(device, 4, 4))


@hazard
def two_forwards_before_backward(device, compile):  # the first forward's saved activations must survive
    model = _mlp(8).to(device).train()
    f = compile(model)

    def step(x):
        for p in model.parameters():
            p.grad = None
        a, b = f(x), f(x * 2)
        (a.pow(2).sum() + b.sum()).backward()
        return [a.detach(), b.detach()] + [p.grad for p in model.parameters()]
    return Program(step, _x(device, 4, 8))


@hazard
def outputs_of_python_values(device, compile):
    pair = collections.namedtuple("pair", "a b")
    f = compile(lambda x: {"p": pair(x * 2, x.sum()), "none": None, "n": x.shape[0], "k": 1.5})
    return Program(lambda x: (lambda o: [o["p"].a, o["p"].b, o["n"], o["k"], o["none"]])(f(x)), _x(device, 4, 4))


@hazard
def slice_of_a_larger_result(device, compile):
    f = compile(lambda x: (x @ x.t())[:2, 1:])
    return Program(f, _x(device, 8, 8))


@hazard
def two_sizes_in_one_step(device, compile):
    f = compile(_mlp().to(device))
    return Program(lambda x: [f(x), f(x[:2]), f(x)], _x(device, 4, 16))


@hazard
def outputs_returned_in_a_dict(device, compile):
    model = _mlp(8).to(device)
    f = compile(lambda x: {"logits": model(x), "hidden": x * 2, "batch": x.shape[0]})

    def step(x):
        with torch.no_grad():
            out = f(x)
            return [out["logits"], out["hidden"], torch.tensor(out["batch"])]
    return Program(step, _x(device, 4, 8))


@hazard
def scalar_output_read_by_the_caller(device, compile):
    model = _mlp(8).to(device)
    f = compile(lambda x: model(x).mean())

    def step(x):
        with torch.no_grad():
            m = f(x)
            return [torch.tensor(m.item()), m]
    return Program(step, _x(device, 4, 8))


# --- Modes the caller switches between calls -----------------------------------------------------

@hazard
def train_and_eval_alternating(device, compile):
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8)).to(device)
    f = compile(model)

    def step(i, x):
        model.train(i % 2 == 0)
        with torch.no_grad():
            return [f(x), model[1].running_mean.clone()]
    return Program(step, lambda i: (i, _x(device, 4, 8)(i)[0]))


@hazard
def grad_mode_alternating(device, compile):
    f = compile(_mlp().to(device))

    def step(i, x):
        with torch.set_grad_enabled(i % 2 == 0):
            return f(x).detach()
    return Program(step, lambda i: (i, _x(device, 4, 16)(i)[0]))


@hazard
def inference_mode_alternating(device, compile):
    f = compile(_mlp().to(device))

    def step(i, x):
        if i % 2:
            with torch.inference_mode():
                return f(x).clone()
        return f(x).detach()
    return Program(step, lambda i: (i, _x(device, 4, 16)(i)[0]))


@hazard
def forward_hook_changes_output(device, compile):
    model = _mlp().to(device)
    model[0].register_forward_hook(lambda module, args, out: out * 0.5)
    return Program(compile(model), _x(device, 4, 16))


@hazard
def optional_mask_given_then_not(device, compile):
    linear = nn.Linear(8, 8).to(device)

    def forward(x, mask=None):
        y = linear(x)
        return (y if mask is None else y.masked_fill(mask, 0.0)).relu()
    f = compile(forward)

    def step(x):
        with torch.no_grad():
            return [f(x), f(x, mask=x > 0), f(x), f(x, x < 0)]
    return Program(step, _x(device, 4, 8))


@hazard
def autocast_switched_between_calls(device, compile):
    model = _mlp(8).to(device)
    f = compile(model)

    def step(x, on):
        with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=on):
            return f(x).float()
    return Program(step, lambda i: (_x(device, 4, 8)(i)[0], bool(i % 2)), compare="norm")


@hazard
def forward_pre_hook_reads_a_setting(device, compile):  # the hook scales the input by a value the caller sets
    model = _mlp(8).to(device)
    setting = {"scale": 1.0}
    model.register_forward_pre_hook(lambda module, args: (args[0] * setting["scale"],))
    f = compile(model)

    def step(x, scale):
        setting["scale"] = scale
        with torch.no_grad():
            return f(x)
    return Program(step, lambda i: (_x(device, 4, 8)(i)[0], 1.0 + i % 2))


@hazard
def model_cast_to_bfloat16_between_calls(device, compile):
    model = _mlp(8).to(device)
    f = compile(model)

    def step(i, x):
        if i >= 2:
            model.to(torch.bfloat16)
        with torch.no_grad():
            return f(x.to(next(model.parameters()).dtype)).float()
    return Program(step, lambda i: (i, _x(device, 4, 8)(i)[0]), compare="norm")


@hazard
def input_dtype_alternating(device, compile):
    f = compile(lambda x: (x * 2 + 1).sin())
    return Program(lambda x: [f(x), f(x.double()), f(x.bfloat16()).float()], _x(device, 4, 8), compare="norm")


@hazard
def parameter_frozen_every_other_call(device, compile):
    model = _mlp(8).to(device)
    f = compile(model)

    def step(i, x):
        model[0].weight.requires_grad_(i % 2 == 0)
        for p in model.parameters():
            p.grad = None
        loss = f(x).sum()
        loss.backward()
        return [loss.detach()] + [torch.zeros_like(p) if p.grad is None else p.grad for p in model.parameters()]
    return Program(step, lambda i: (i, _x(device, 4, 8)(i)[0]))


@hazard
def deterministic_algorithms_on(device, compile):  # a global flag that Dynamo guards on, every other call
    f = compile(_mlp().to(device))

    def step(i, x):
        # warn_only: on a GPU, cuBLAS without CUBLAS_WORKSPACE_CONFIG would fail eager itself
        torch.use_deterministic_algorithms(i % 2 == 1, warn_only=True)
        try:
            return f(x)
        finally:
            torch.use_deterministic_algorithms(False)
    return Program(step, lambda i: (i, _x(device, 4, 16)(i)[0]))


@hazard
def cudagraph_step_marked_by_the_caller(device, compile):  # stock's API, called whatever the backend
    f = compile(_mlp().to(device))

    def step(x):
        torch.compiler.cudagraph_mark_step_begin()
        return f(x)
    return Program(step, _x(device, 4, 16))


# --- Autograd as callers use it ------------------------------------------------------------------

def _gradients(model: nn.Module, backward: Callable[[torch.Tensor], None], kept: list | None = None) -> Callable:
    def step(y):
        for p in model.parameters():
            p.grad = None
        backward(y)
        if kept is not None:
            kept.append(y)
        return [y.detach()] + [p.grad for p in model.parameters()]
    return step


@hazard
def backward_twice_with_retained_graph(device, compile):
    model = _mlp(8).to(device)
    f = compile(model)

    def twice(y):
        y.sum().backward(retain_graph=True)
        y.sum().backward()
    grads = _gradients(model, twice)
    return Program(lambda x: grads(f(x)), _x(device, 4, 8))


@hazard
def training_outputs_kept(device, compile):
    model = _mlp().to(device).train()
    f = compile(model)
    grads = _gradients(model, lambda y: y.sum().backward(), kept=[])
    return Program(lambda x: grads(f(x)), _x(device, 4, 16))


class _PartlyFrozen(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(8, 8), nn.Linear(8, 8)

    def forward(self, x):
        with torch.no_grad():
            t = self.a(x)
        return self.b(x) * t


@hazard
def no_grad_inside_training(device, compile):
    return _training(_PartlyFrozen(), device, compile, 4, 8)


@hazard
def gradient_of_the_input(device, compile):
    f = compile(_mlp(8).to(device))

    def step(x):
        x = x.clone().requires_grad_()
        f(x).sum().backward()
        return [x.grad]
    return Program(step, _x(device, 4, 8))


@hazard
def parameter_gradients_by_autograd_grad(device, compile):
    """Gradients taken with torch.autograd.grad (a meta-learning or gradient-penalty step), not .grad."""
    model = _mlp(8).to(device)
    f = compile(model)
    return Program(lambda x: torch.autograd.grad(f(x).square().mean(), list(model.parameters())),
                   _x(device, 4, 8))


@hazard
def parameter_returned_with_the_output(device, compile):
    embedding = nn.Embedding(10, 8).to(device)
    f = compile(lambda idx: (embedding(idx), embedding.weight))

    def step(idx):
        embedding.weight.grad = None
        y, w = f(idx)
        (y.sum() + (w * w).sum()).backward()
        return [y.detach(), w.detach().clone(), embedding.weight.grad]
    return Program(step, lambda i: (torch.tensor([i % 10, (i + 3) % 10], device=device),))


# --- Layers and training utilities users reach for -----------------------------------------------

@hazard
def batch_marked_dynamic(device, compile):
    f = compile(_mlp().to(device))

    def step(x):
        torch._dynamo.mark_dynamic(x, 0)
        return f(x)
    return Program(step, lambda i: _x(device, 2 + i, 16)(i))


@hazard
def attention_with_a_padding_mask(device, compile):
    mha = nn.MultiheadAttention(16, 4, batch_first=True).to(device).eval()
    f = compile(lambda x, mask: mha(x, x, x, key_padding_mask=mask, need_weights=False)[0])

    def inputs(i):
        mask = torch.zeros(2, 5, dtype=torch.bool)
        mask[0, 4 - i % 3:] = True
        return _x(device, 2, 5, 16)(i)[0], mask.to(device)
    return Program(f, inputs)


@hazard
def lstm(device, compile):
    model = nn.LSTM(8, 8, num_layers=2, batch_first=True).to(device).eval()
    f = compile(lambda x: model(x)[0])

    def step(x):
        with torch.no_grad():
            return f(x)
    return Program(step, _x(device, 2, 5, 8))


@hazard
def lazy_module_compiled_before_first_call(device, compile):  # its weight is made by the first call
    model = nn.Sequential(nn.LazyLinear(16), nn.ReLU(), nn.Linear(16, 4)).to(device)
    return Program(torch.no_grad()(compile(model)), _x(device, 4, 8))


@hazard
def transformer_with_a_causal_mask_made_inside(device, compile):
    model = nn.Transformer(16, 2, 1, 1, 32, batch_first=True).to(device).eval()

    def run(src, tgt):
        mask = nn.Transformer.generate_square_subsequent_mask(tgt.shape[1], device=tgt.device)
        return model(src, tgt, tgt_mask=mask)
    f = compile(run)

    def step(src, tgt):
        with torch.no_grad():
            return f(src, tgt)
    return Program(step, lambda i: (_x(device, 2, 6, 16)(i)[0], _x(device, 2, 4, 16)(i + 100)[0]))


@hazard
def topk_with_a_changing_k(device, compile):
    f = compile(lambda x, k: x.topk(k).values)
    return Program(f, lambda i: (_x(device, 4, 16)(i)[0], 2 + i % 3))


@hazard
def index_add_and_accumulating_index_put(device, compile):
    def run(x, idx):
        return torch.zeros(8, x.shape[1], device=x.device).index_add(0, idx, x).index_put((idx,), x, accumulate=True)
    return Program(compile(run), lambda i: (_x(device, 6, 4)(i)[0], torch.tensor([0, 1, 1, 3, 7, 7]).to(device)))


@hazard
def distribution_in_forward(device, compile):
    lin = nn.Linear(8, 4).to(device)

    def run(x):
        mu, log_std = lin(x).chunk(2, -1)
        return torch.distributions.Normal(mu, log_std.exp()).log_prob(mu)
    return Program(compile(run), _x(device, 4, 8))


@hazard
def vmap_of_a_functional_call(device, compile):
    model = _mlp(8).to(device)
    params = {k: v.detach() for k, v in model.named_parameters()}
    f = compile(lambda x: torch.func.vmap(lambda xi: torch.func.functional_call(model, params, (xi,)))(x))
    return Program(f, _x(device, 4, 8))


@hazard
def spectral_norm_in_training(device, compile):  # a power iteration's buffers updated on every forward
    model = nn.Sequential(nn.utils.parametrizations.spectral_norm(nn.Linear(8, 8)), nn.Tanh())
    return _training(model, device, compile, 4, 8)


@hazard
def backward_hook(device, compile):
    model = _mlp(8)
    model[2].register_full_backward_hook(lambda module, grad_in, grad_out: (grad_in[0] * 2,))
    return _training(model, device, compile, 4, 8)


@hazard
def mixed_precision_with_a_grad_scaler(device, compile):
    model = _mlp().to(device).train()
    f = compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler(device.type, init_scale=256.0)

    def step(x):
        opt.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            loss = f(x).float().pow(2).mean()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        return [loss.detach()] + [p.detach().clone() for p in model.parameters()]
    return Program(step, _x(device, 4, 16), compare="norm")


@hazard
def compiled_optimizer_with_a_schedule(device, compile):  # a Python float lr that changes every step
    model = _mlp().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    schedule = torch.optim.lr_scheduler.StepLR(opt, 1, gamma=0.5)
    opt_step = compile(opt.step)

    def step(x):
        opt.zero_grad(set_to_none=True)
        model(x).pow(2).mean().backward()
        opt_step()
        schedule.step()
        return [p.detach().clone() for p in model.parameters()]
    return Program(step, _x(device, 4, 16), compare="norm")


@hazard
def gradients_clipped(device, compile):
    model = _mlp(8).to(device)
    f = compile(model)

    def step(x):
        model.zero_grad(set_to_none=True)
        f(x).pow(2).sum().backward()
        return [nn.utils.clip_grad_norm_(model.parameters(), 0.1)] + [p.grad for p in model.parameters()]
    return Program(step, _x(device, 4, 8))


@hazard
def weights_averaged_in_place(device, compile):  # an EMA of the weights, under no_grad
    model, average = _mlp(8).to(device), _mlp(8).to(device)

    @torch.no_grad()
    def update(decay):
        for a, p in zip(average.parameters(), model.parameters()):
            a.mul_(decay).add_(p, alpha=1 - decay)
    f = compile(update)

    def step(x):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(x.mean())
        f(0.9)
        return [a.clone() for a in average.parameters()]
    return Program(step, _x(device, 4))


# --- Training loops as users write them ----------------------------------------------------------

@hazard
def train_step_then_eval_each_call(device, compile):  # BatchNorm's two modes, batch sizes 4 and 2
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    f = compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def step(x):
        model.train()
        opt.zero_grad()
        loss = f(x).pow(2).mean()
        loss.backward()
        opt.step()
        model.eval()
        with torch.no_grad():
            y = f(x[:2])
        return [loss.detach(), y] + [p.detach().clone() for p in model.parameters()]
    return Program(step, _x(device, 4, 8))


@hazard
def loss_and_logits_kept_over_steps(device, compile):
    model = _mlp(8).to(device)
    f = compile(lambda x: (lambda out: (out, out.pow(2).mean()))(model(x)))
    history = []

    def step(x):
        model.zero_grad()
        logits, loss = f(x)
        loss.backward()
        history.append(logits)
        return [h.detach().clone() for h in history[-2:]] + [p.grad.clone() for p in model.parameters()]
    return Program(step, _x(device, 4, 8))


@hazard
def one_output_returned_twice(device, compile):
    f = compile(lambda x: (lambda y: (y, y))(x * 2 + 1))

    def step(x):
        a, b = f(x)
        a.add_(1)  # b is a: eager's b changes with it
        return [a, b]
    return Program(step, _x(device, 4))


@hazard
def nested_compiled_modules(device, compile):
    inner = _mlp(8).to(device)
    inner_compiled = compile(inner)
    head = nn.Linear(8, 2).to(device)
    f = compile(lambda x: head(inner_compiled(x).relu()))

    def step(x):
        with torch.no_grad():
            return [f(x), inner_compiled(x)]
    return Program(step, _x(device, 4, 8))


@hazard
def compiled_forward_method(device, compile):
    model = _mlp(8).to(device)
    model.forward = compile(model.forward)

    def step(x):
        with torch.no_grad():
            return model(x)
    return Program(step, _x(device, 4, 8))


@hazard
def input_requiring_grad_under_no_grad(device, compile):
    f = compile(_mlp(8).to(device))

    def step(x):
        with torch.no_grad():
            return f(x.requires_grad_())
    return Program(step, _x(device, 4, 8))
