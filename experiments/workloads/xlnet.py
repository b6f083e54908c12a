"""XLNetLMHeadModel (HuggingFace), XLNetConfig's defaults (24 layers, d_model 1024)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "xlnet"
    acronyms = {"eval": "XLNET-I", "train": "XLNET-T"}
    batch_sizes = {"eval": 1, "train": 8}
    origin = "transformers.XLNetLMHeadModel(XLNetConfig())"
    model_class = "XLNetLMHeadModel"
    tiny_config = {"vocab_size": 128, "d_model": 32, "n_layer": 2, "n_head": 2, "d_inner": 64}
    seq_len = 512
    inputs = "lm"
