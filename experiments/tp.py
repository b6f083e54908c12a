"""Tensor parallelism for Fig 11 (Megatron-style): each rank holds a slice of every layer's heads and
feed-forward width, and one sum over ranks closes each attention block and each feed-forward block.

    model = tp.parallelize("xlnet", model, rank, world, group)

Column-parallel (output features split: Q, K, V, the relative-position projection R, the first
feed-forward linear) needs no communication; row-parallel (input features split: the attention output
projection O, the second feed-forward linear) ends in an all-reduce, before the bias, dropout, residual
and layer norm, which every rank then applies to the same full tensor. Embeddings and the LM head stay
replicated. The sums are functional collectives, so Dynamo traces them and a CUDA graph captures them.
"""

from __future__ import annotations

import types

import torch
from torch import nn
from torch.nn import functional as F

from grace.torch_adapter import all_reduce_sum


def _slice(t: torch.Tensor, dim: int, rank: int, world: int) -> nn.Parameter:
    if t.shape[dim] % world:
        raise ValueError(f"dimension {dim} of size {t.shape[dim]} does not split over {world} ranks")
    return nn.Parameter(t.detach().chunk(world, dim)[rank].clone(), requires_grad=t.requires_grad)


def _xlnet_post_attention(self, h, attn_vec, residual=True):
    """XLNetRelativeAttention.post_attention with its heads split: the partial projections are summed."""
    attn_out = all_reduce_sum(torch.einsum("ibnd,hnd->ibh", attn_vec, self.o), self.tp_group)
    attn_out = self.dropout(attn_out)
    if residual:
        attn_out = attn_out + h
    return self.layer_norm(attn_out)


def _xlnet_feed_forward(self, inp):
    """XLNetFeedForward.forward with its inner width split: layer_2's partial products are summed, then
    its bias is added once."""
    out = self.dropout(self.activation_function(self.layer_1(inp)))
    out = all_reduce_sum(F.linear(out, self.layer_2.weight), self.tp_group) + self.layer_2.bias
    return self.layer_norm(self.dropout(out) + inp)


def xlnet(model: nn.Module, rank: int, world: int, group) -> nn.Module:
    """XLNet (transformers' XLNetModel inside XLNetLMHeadModel), its layers split over `world` ranks."""
    for layer in model.transformer.layer:
        att, ff = layer.rel_attn, layer.ff
        for name in ("q", "k", "v", "o", "r"):  # [d_model, n_head, d_head]: split the heads
            setattr(att, name, _slice(getattr(att, name), 1, rank, world))
        for name in ("r_r_bias", "r_s_bias", "r_w_bias"):  # [n_head, d_head]
            setattr(att, name, _slice(getattr(att, name), 0, rank, world))
        att.seg_embed = _slice(att.seg_embed, 1, rank, world)  # [2, n_head, d_head]
        att.n_head //= world
        att.tp_group = group
        att.post_attention = types.MethodType(_xlnet_post_attention, att)
        ff.layer_1.weight = _slice(ff.layer_1.weight, 0, rank, world)  # column-parallel
        ff.layer_1.bias = _slice(ff.layer_1.bias, 0, rank, world)
        ff.layer_1.out_features //= world
        ff.layer_2.weight = _slice(ff.layer_2.weight, 1, rank, world)  # row-parallel
        ff.layer_2.in_features //= world
        ff.tp_group = group
        ff.forward = types.MethodType(_xlnet_feed_forward, ff)
    return model


MODELS = {"xlnet": xlnet}


def parallelize(workload: str, model: nn.Module, rank: int, world: int, group) -> nn.Module:
    if workload not in MODELS:
        raise NotImplementedError(f"no tensor-parallel version of {workload!r} (have: {', '.join(MODELS)})")
    return model if world == 1 else MODELS[workload](model, rank, world, group)
