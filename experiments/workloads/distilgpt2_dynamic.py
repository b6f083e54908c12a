"""Dynamic shapes: DistilGPT2 inference fed three sequence lengths in turn (128, 256, 384 tokens), as a
text model serving prompts of different lengths. Stock CUDA graphs record one graph per length."""

from experiments.workloads import distilgpt2


class Model(distilgpt2.Model):
    name = "distilgpt2_dynamic"
    acronyms = {}
    batch_sizes = {"eval": 1}
    origin = distilgpt2.Model.origin + ", inputs of three lengths in turn"
    varying_inputs = True
    seq_lens = (128, 256, 384)

    def build(self):
        cls, config = self._config()
        lens = (8, 12, 16) if self.tiny else self.seq_lens
        return cls(config).to(self.device), [{"input_ids": self._ids(config.vocab_size, n)} for n in lens]
