"""HuggingFace transformers workloads, built as PyTorch's benchmarks/dynamo/huggingface.py builds them:
the model class on its config class's defaults, random weights, random token ids. Each workload module
states only what differs: the class, config overrides, sequence length, and what its inputs are."""

from __future__ import annotations

from typing import ClassVar

import torch

from experiments.workloads import Workload

# Small dims for the tiny size: the same classes and code paths, a few thousand parameters per layer.
TINY_SEQ = 16


def _no_dropout(config) -> None:
    """Every dropout probability of a config (and of the configs inside it) set to 0. A compiled train
    step draws other dropout masks than eager's (Inductor has its own random number generation), so with
    dropout on no variant could be checked against eager: eager's own error against the float64 reference
    would be most of the gradients' norm, a tolerance that passes anything. Timings then leave out
    the dropout kernels (a few elementwise ones per layer)."""
    for name, value in vars(config).items():
        if isinstance(value, float) and any(k in name for k in ("dropout", "pdrop", "layerdrop")):
            setattr(config, name, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):
            _no_dropout(value)


class HFWorkload(Workload):
    model_class: ClassVar[str]  # a class of the transformers package
    config: ClassVar[dict] = {}  # overrides of the config class's defaults, at full size
    tiny_config: ClassVar[dict]  # overrides at tiny size (on top of `config`)
    seq_len: ClassVar[int]  # as benchmarks/dynamo/huggingface.py picks it for the model
    inputs: ClassVar[str]  # "lm": ids, labels = ids | "qa": ids, start/end positions | "seq2seq": + decoder

    def _config(self):
        import transformers

        cls = getattr(transformers, self.model_class)
        # use_cache off: one step returns its outputs, not a generation cache object
        config = cls.config_class(**{"use_cache": False, **self.config, **(self.tiny_config if self.tiny else {})})
        if self.mode == "train":
            _no_dropout(config)
        return cls, config

    def _ids(self, vocab: int, seq: int) -> torch.Tensor:
        return torch.randint(0, vocab, (self.batch, seq), device=self.device)

    def build(self):
        cls, config = self._config()
        model = cls(config)
        seq = TINY_SEQ if self.tiny else self.seq_len
        ids = self._ids(config.vocab_size, seq)
        kwargs = {"input_ids": ids}
        train = self.mode == "train"
        if self.inputs == "seq2seq":
            decoder = self._ids(config.vocab_size, seq)
            kwargs.update({"labels": decoder} if train else {"decoder_input_ids": decoder})
        elif self.inputs == "qa" and train:
            kwargs["start_positions"] = torch.randint(0, seq, (self.batch,), device=self.device)
            kwargs["end_positions"] = torch.randint(0, seq, (self.batch,), device=self.device)
        elif self.inputs == "lm" and train:
            kwargs["labels"] = ids
        return model.to(self.device), kwargs

    def loss(self, output):
        return output.loss
