"""Substitute for Speech2Text2ForCausalLM, which transformers 5 removed: TrOCRForCausalLM, the same
decoder-only family (learned positions, pre-norm off, cross-attention unused), sized as
Speech2Text2Config's defaults (6 layers, d_model 256, 4 heads, FFN 2048, vocabulary 10000)."""

from experiments.workloads._hf import HFWorkload


class Model(HFWorkload):
    name = "trocr"
    acronyms = {"train": "STCLM"}
    batch_sizes = {"train": 256}
    origin = ("transformers.TrOCRForCausalLM with Speech2Text2Config's dims: Speech2Text2ForCausalLM is gone "
              "from transformers 5, TrOCR's decoder is the same family")
    model_class = "TrOCRForCausalLM"
    config = {"vocab_size": 10000, "d_model": 256, "decoder_layers": 6, "decoder_attention_heads": 4,
              "decoder_ffn_dim": 2048, "max_position_embeddings": 1024}
    tiny_config = {"vocab_size": 128, "d_model": 32, "decoder_layers": 2, "decoder_attention_heads": 2,
                   "decoder_ffn_dim": 64}
    seq_len = 256
    inputs = "lm"
