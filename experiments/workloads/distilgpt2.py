"""DistilGPT2: GPT2LMHeadModel with GPT2Config's defaults and 6 layers, as distilgpt2 has."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "distilgpt2"
    acronyms = {"train": "DGPT2"}
    batch_sizes = {"train": 16}
    origin = "transformers.GPT2LMHeadModel(GPT2Config(n_layer=6)), the DistillGPT2 of PyTorch's HF suite"
    model_class = "GPT2LMHeadModel"
    config = {"n_layer": 6}
    tiny_config = {"vocab_size": 128, "n_embd": 32, "n_layer": 2, "n_head": 2, "n_positions": 64}
    seq_len = 512
    inputs = "lm"
