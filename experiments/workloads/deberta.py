"""DebertaForMaskedLM (HuggingFace), DebertaConfig's defaults (deberta-base: 12 layers, hidden 768)."""

import torch

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "deberta"
    acronyms = {"train": "DMLM"}
    batch_sizes = {"train": 8}
    origin = "transformers.DebertaForMaskedLM(DebertaConfig())"
    model_class = "DebertaForMaskedLM"
    tiny_config = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 64}
    seq_len = 512
    inputs = "lm"
    # transformers' DeBERTa fills masked attention scores with float32's minimum, which overflows the
    # bfloat16 scores that autocast produces ("value cannot be converted to type BFloat16"): train in float32.
    train_dtype = torch.float32
