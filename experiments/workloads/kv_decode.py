"""Input mutation: one decoding step of a 12-layer transformer with a preallocated KV cache that the step
writes in place (index_copy_ at the current position), as LLM serving loops do. The cache is an input,
not a parameter or buffer: stock CUDA graph trees do not record a function that mutates such an input."""

import torch
from torch import nn
from torch.nn import functional as F

from experiments.workloads import Workload


class _Layer(nn.Module):
    def __init__(self, d: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.norm1, self.norm2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, k_cache, v_cache, pos, valid):
        b, _, d = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, 1, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        k_cache.index_copy_(2, pos, k)  # write this step's key and value into the cache, in place
        v_cache.index_copy_(2, pos, v)
        att = F.scaled_dot_product_attention(q, k_cache, v_cache, attn_mask=valid)
        x = x + self.proj(att.transpose(1, 2).reshape(b, 1, d))
        return x + self.mlp(self.norm2(x))


class _Decoder(nn.Module):
    def __init__(self, vocab: int, d: int, heads: int, layers: int):
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.layers = nn.ModuleList(_Layer(d, heads) for _ in range(layers))
        self.head = nn.Linear(d, vocab)

    def forward(self, token, k_cache, v_cache, pos):
        valid = (torch.arange(k_cache.shape[3], device=token.device) <= pos)[None, None, None]  # written so far
        x = self.embed(token)
        for i, layer in enumerate(self.layers):
            x = layer(x, k_cache[i], v_cache[i], pos, valid)
        return self.head(x)


class Model(Workload):
    name = "kv_decode"
    batch_sizes = {"eval": 8}
    origin = "in-house: GPT-style decoder step (12 layers, d 768) with an in-place KV cache input"

    def build(self):
        vocab, d, heads, layers, max_len = (64, 32, 2, 2, 16) if self.tiny else (50257, 768, 12, 12, 1024)
        cache = (layers, self.batch, heads, max_len, d // heads)
        k_cache, v_cache = torch.randn(cache) * 0.1, torch.randn(cache) * 0.1
        token = torch.randint(0, vocab, (self.batch, 1))
        pos = torch.tensor([max_len // 2])  # the cache is full up to here
        inputs = tuple(t.to(self.device) for t in (token, k_cache, v_cache, pos))
        return _Decoder(vocab, d, heads, layers).to(self.device), inputs
