"""Substitute for TorchBench's BERT_pytorch (codertimo's BERT, not packaged): transformers'
BertForPreTraining with BERT_pytorch's shape (12 layers, hidden 768, 12 heads), masked-LM and
next-sentence heads, trained on both losses as BERT_pytorch's trainer does."""

import torch

from experiments.workloads._hf import TINY_SEQ, HFWorkload


class Model(HFWorkload):
    name = "bert"
    acronyms = {"train": "BERT"}
    batch_sizes = {"train": 16}
    origin = "transformers.BertForPreTraining(BertConfig()), for TorchBench's BERT_pytorch (not packaged)"
    model_class = "BertForPreTraining"
    tiny_config = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 64}
    seq_len = 128

    def build(self):
        cls, config = self._config()
        seq = TINY_SEQ if self.tiny else self.seq_len
        ids = self._ids(config.vocab_size, seq)
        segments = (torch.arange(seq, device=self.device) >= seq // 2).long().expand(self.batch, seq)
        next_sentence = torch.randint(0, 2, (self.batch,), device=self.device)
        inputs = {"input_ids": ids, "token_type_ids": segments, "labels": ids, "next_sentence_label": next_sentence}
        return cls(config).to(self.device), inputs
