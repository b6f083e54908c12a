"""DebertaV2ForQuestionAnswering (HuggingFace), DebertaV2Config's defaults (24 layers, hidden 1536)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "deberta_v2"
    acronyms = {"eval": "DBV2"}
    batch_sizes = {"eval": 1}
    origin = "transformers.DebertaV2ForQuestionAnswering(DebertaV2Config())"
    model_class = "DebertaV2ForQuestionAnswering"
    tiny_config = {"vocab_size": 128, "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
                   "intermediate_size": 64}
    seq_len = 512
    inputs = "qa"
