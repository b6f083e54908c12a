"""Tensor parallelism for Fig 11 (Megatron-style): each rank holds a slice of every layer's heads and
feed-forward width, and one sum over ranks closes each attention block and each feed-forward block.

    model = tp.parallelize("xlnet", model, rank, world, group)   # also speech_transformer, dalle2, maskrcnn

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

from experiments.instrument import all_reduce_sum


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


class _ParallelAttention(nn.Module):
    """nn.MultiheadAttention (batch_first, packed in-projection) with its heads split over ranks: Q, K, V
    column-parallel, the output projection row-parallel. Takes the same call as the module it replaces
    and returns (output, None)."""

    def __init__(self, mha: nn.MultiheadAttention, rank: int, world: int, group):
        super().__init__()
        if not (mha.batch_first and mha._qkv_same_embed_dim) or mha.num_heads % world:
            raise ValueError("needs a batch-first attention with packed projections and heads divisible by ranks")
        d = mha.embed_dim
        self.heads, self.head_dim, self.group = mha.num_heads // world, d // mha.num_heads, group
        w, b = mha.in_proj_weight.detach().split(d), mha.in_proj_bias.detach().split(d)
        self.in_proj_weight = nn.Parameter(torch.cat([x.chunk(world)[rank] for x in w]).clone())
        self.in_proj_bias = nn.Parameter(torch.cat([x.chunk(world)[rank] for x in b]).clone())
        self.out_weight = _slice(mha.out_proj.weight, 1, rank, world)
        self.out_bias = nn.Parameter(mha.out_proj.bias.detach().clone())
        self.batch_first = True

    def forward(self, query, key, value, key_padding_mask=None, need_weights=False, attn_mask=None,
                average_attn_weights=True, is_causal=False):
        if key_padding_mask is not None or need_weights:
            raise NotImplementedError("tensor-parallel attention: no key padding mask, no attention weights")
        wq, wk, wv = self.in_proj_weight.chunk(3)
        bq, bk, bv = self.in_proj_bias.chunk(3)

        def heads(x, w, b):
            y = F.linear(x, w, b)
            return y.view(y.shape[0], y.shape[1], self.heads, self.head_dim).transpose(1, 2)

        q, k, v = heads(query, wq, bq), heads(key, wk, bk), heads(value, wv, bv)
        if attn_mask is not None and attn_mask.dtype == torch.bool:
            attn_mask = ~attn_mask  # nn.MultiheadAttention: True masks out; sdpa: True keeps
        ctx = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_mask, is_causal=is_causal and attn_mask is None)
        ctx = ctx.transpose(1, 2).reshape(query.shape[0], query.shape[1], -1)
        return all_reduce_sum(F.linear(ctx, self.out_weight), self.group) + self.out_bias, None


class _RowParallelLinear(nn.Module):
    """y = sum over ranks of x_r @ W_r^T, plus the bias once: the input features are split."""

    def __init__(self, linear: nn.Linear, rank: int, world: int, group):
        super().__init__()
        self.weight = _slice(linear.weight, 1, rank, world)
        self.bias = nn.Parameter(linear.bias.detach().clone()) if linear.bias is not None else None
        self.group = group

    def forward(self, x):
        y = all_reduce_sum(F.linear(x, self.weight), self.group)
        return y if self.bias is None else y + self.bias


def _column_parallel_linear(linear: nn.Linear, rank: int, world: int) -> nn.Linear:
    out = nn.Linear(linear.in_features, linear.out_features // world, bias=linear.bias is not None,
                    device=linear.weight.device, dtype=linear.weight.dtype)
    out.weight = _slice(linear.weight, 0, rank, world)
    if linear.bias is not None:
        out.bias = _slice(linear.bias, 0, rank, world)
    return out


def speech_transformer(model: nn.Module, rank: int, world: int, group) -> nn.Module:
    """The speech transformer's encoder and decoder layers: attention heads and feed-forward width split.
    PyTorch's fused fast path for transformer layers knows nothing of this: it is turned off."""
    torch.backends.mha.set_fastpath_enabled(False)
    layers = list(model.encoder.layers) + list(model.decoder.layers)
    for layer in layers:
        layer.self_attn = _ParallelAttention(layer.self_attn, rank, world, group)
        if hasattr(layer, "multihead_attn"):
            layer.multihead_attn = _ParallelAttention(layer.multihead_attn, rank, world, group)
        layer.linear1 = _column_parallel_linear(layer.linear1, rank, world)
        layer.linear2 = _RowParallelLinear(layer.linear2, rank, world, group)
    return model


class _RowParallelConv(nn.Module):
    """A convolution whose input channels are split: partial outputs summed over ranks, bias once."""

    def __init__(self, conv: nn.Conv2d, rank: int, world: int, group):
        super().__init__()
        self.conv, self.group = conv, group
        conv.weight = _slice(conv.weight, 1, rank, world)
        self.bias = nn.Parameter(conv.bias.detach().clone())
        conv.bias = None

    def forward(self, x):
        return all_reduce_sum(self.conv(x), self.group) + self.bias[:, None, None]


def _column_parallel_conv(conv: nn.Conv2d, rank: int, world: int) -> nn.Conv2d:
    conv.weight = _slice(conv.weight, 0, rank, world)
    conv.bias = _slice(conv.bias, 0, rank, world)
    conv.out_channels //= world
    return conv


def _column_parallel_group_norm(norm: nn.GroupNorm, rank: int, world: int) -> nn.GroupNorm:
    """GroupNorm over this rank's channels: exact when whole groups fall on each rank."""
    if norm.num_groups % world:
        raise ValueError(f"{norm.num_groups} groups do not split over {world} ranks")
    norm.weight, norm.bias = _slice(norm.weight, 0, rank, world), _slice(norm.bias, 0, rank, world)
    norm.num_groups //= world
    norm.num_channels //= world
    return norm


def dalle2(model: nn.Module, rank: int, world: int, group) -> nn.Module:
    """The DALLE2 decoder's U-Net blocks: conv1 (and its norm and time embedding) column-parallel, conv2
    row-parallel; the rest of the block runs on the full, summed tensor."""
    unet = model.unet
    for block in [*unet.down, unet.mid, *unet.up]:
        _column_parallel_conv(block.conv1, rank, world)
        _column_parallel_group_norm(block.norm1, rank, world)
        block.emb = _column_parallel_linear(block.emb, rank, world)
        block.conv2 = _RowParallelConv(block.conv2, rank, world, group)
    return model


def maskrcnn(model: nn.Module, rank: int, world: int, group) -> nn.Module:
    """Mask R-CNN's box head (two 1024-wide fully connected layers, its largest matrices): fc6
    column-parallel, fc7 row-parallel; backbone, RPN and mask head stay replicated."""
    head = model.roi_heads.box_head
    head.fc6 = _column_parallel_linear(head.fc6, rank, world)
    head.fc7 = _RowParallelLinear(head.fc7, rank, world, group)
    return model


MODELS = {"xlnet": xlnet, "speech_transformer": speech_transformer, "dalle2": dalle2, "maskrcnn": maskrcnn}


def parallelize(workload: str, model: nn.Module, rank: int, world: int, group) -> nn.Module:
    if workload not in MODELS:
        raise NotImplementedError(f"no tensor-parallel version of {workload!r} (have: {', '.join(MODELS)})")
    return model if world == 1 else MODELS[workload](model, rank, world, group)
