"""MT5ForConditionalGeneration (HuggingFace), MT5Config's defaults (mt5-small: 8 layers, d_model 512)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "mt5"
    acronyms = {"eval": "MTCG-I", "train": "MTCG-T"}
    batch_sizes = {"eval": 16, "train": 16}
    origin = "transformers.MT5ForConditionalGeneration(MT5Config())"
    model_class = "MT5ForConditionalGeneration"
    tiny_config = {"vocab_size": 128, "d_model": 32, "d_kv": 8, "d_ff": 64, "num_layers": 2, "num_heads": 2}
    seq_len = 128
    inputs = "seq2seq"
