"""In-house speech transformer after TorchBench's speech_transformer (Transformer ASR on 80-dim filter
banks, 6+6 layers, d_model 512, AISHELL's 4233 characters). Its eval decodes step by step with Python
bookkeeping between GPU steps; here a forced decoding of a fixed character sequence keeps that
structure (a host-built token tensor and a score pulled to the CPU at every step, as the original's
beam search does) while staying deterministic, so that numerics can be compared."""

import torch
from torch import nn

from experiments.workloads import Workload


class _SpeechTransformer(nn.Module):
    def __init__(self, d_model: int, heads: int, layers: int, vocab: int, steps: int, feats: int = 80):
        super().__init__()
        self.steps, self.vocab = steps, vocab
        self.inp = nn.Sequential(nn.Linear(feats, d_model), nn.LayerNorm(d_model))
        self.pos = nn.Parameter(torch.randn(1024, d_model) * 0.02)
        enc = nn.TransformerEncoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        dec = nn.TransformerDecoderLayer(d_model, heads, 4 * d_model, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(enc, layers, enable_nested_tensor=False)
        self.decoder = nn.TransformerDecoder(dec, layers)
        self.embed = nn.Embedding(vocab, d_model)
        self.out = nn.Linear(d_model, vocab)

    def forward(self, feats):
        memory = self.encode(feats)
        ys, scores = [1], []  # <sos>; the hypothesis lives in a Python list, as in the original
        for i in range(self.steps):
            tokens = torch.tensor([ys], device=feats.device).expand(feats.shape[0], -1)
            logp = self.step(tokens, memory)
            nxt = (7 * i + 3) % self.vocab  # the forced character
            scores.append(float(logp[0, nxt]))  # to the host, as the beam search's score bookkeeping
            ys.append(nxt)
        return logp, torch.tensor(scores)

    # The encoder and a decoding step are methods of their own, as the original's are: the score pulled
    # to the host breaks the graph inside forward's loop, so Dynamo runs forward itself without a graph,
    # and compiles these where forward calls them. Inlined into forward, nothing at all was compiled
    # (Dynamo skips a frame with a graph break in a loop, and does not start at torch.nn's own frames).
    def encode(self, feats):
        return self.encoder(self.inp(feats) + self.pos[: feats.shape[1]])

    def step(self, tokens, memory):
        h = self.decoder(self.embed(tokens) + self.pos[: tokens.shape[1]], memory)
        return torch.log_softmax(self.out(h[:, -1]).float(), dim=-1)


class Model(Workload):
    name = "speech_transformer"
    acronyms = {"eval": "ST"}
    batch_sizes = {"eval": 1}
    origin = "in-house, after TorchBench's speech_transformer (kaituoxu/Speech-Transformer): forced decoding"
    revised = "2026-11-30T19:42"  # the encoder and the decoding step compiled (before: nothing was)

    def build(self):
        if self.tiny:
            model, frames = _SpeechTransformer(32, 2, 1, 50, steps=3), 20
        else:
            model, frames = _SpeechTransformer(512, 8, 6, 4233, steps=20), 400
        return model.to(self.device), (torch.randn(self.batch, frames, 80, device=self.device),)
