"""Substitute for TorchBench's torch_multimodal_clip (torchmultimodal is not on the GPU machine):
transformers' CLIPModel on CLIPConfig's defaults (ViT-B/32 image tower, 12-layer text tower), the
same architecture, fed one image and one 77-token caption."""

import torch

from experiments.workloads._hf import TINY_SEQ, HFWorkload


class Model(HFWorkload):
    name = "clip"
    acronyms = {"eval": "MMC"}
    batch_sizes = {"eval": 1}
    origin = "transformers.CLIPModel(CLIPConfig()), for torchmultimodal's CLIP (package absent)"
    model_class = "CLIPModel"
    tiny_config = {"text_config": {"vocab_size": 128, "hidden_size": 32, "intermediate_size": 64,
                                   "num_hidden_layers": 2, "num_attention_heads": 2},
                   "vision_config": {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
                                     "num_attention_heads": 2, "image_size": 32, "patch_size": 8}}
    seq_len = 77

    def build(self):
        cls, config = self._config()
        side = config.vision_config.image_size
        ids = self._ids(config.text_config.vocab_size, TINY_SEQ if self.tiny else self.seq_len)
        pixels = torch.randn(self.batch, 3, side, side, device=self.device)
        return cls(config).to(self.device), {"input_ids": ids, "pixel_values": pixels}
