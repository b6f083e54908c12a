"""BlenderbotSmallForConditionalGeneration (HuggingFace), its config's defaults (8+8 layers, d_model 512)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "blenderbot_small"
    acronyms = {"train": "BSCG"}
    batch_sizes = {"train": 64}
    origin = "transformers.BlenderbotSmallForConditionalGeneration(BlenderbotSmallConfig())"
    model_class = "BlenderbotSmallForConditionalGeneration"
    tiny_config = {"vocab_size": 128, "d_model": 32, "encoder_layers": 2, "decoder_layers": 2,
                   "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 64,
                   "decoder_ffn_dim": 64}
    seq_len = 128
    inputs = "seq2seq"
