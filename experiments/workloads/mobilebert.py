"""MobileBertForQuestionAnswering (HuggingFace), MobileBertConfig's defaults (24 layers)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "mobilebert"
    acronyms = {"eval": "MBERT"}
    batch_sizes = {"eval": 128}
    origin = "transformers.MobileBertForQuestionAnswering(MobileBertConfig())"
    model_class = "MobileBertForQuestionAnswering"
    tiny_config = {"vocab_size": 128, "hidden_size": 32, "embedding_size": 16, "intra_bottleneck_size": 16,
                   "true_hidden_size": 16, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 32}
    seq_len = 128
    inputs = "qa"
