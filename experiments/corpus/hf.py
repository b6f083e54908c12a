"""HuggingFace transformers architectures built from small configs (random weights, nothing downloaded):
encoders, decoders, encoder-decoders, vision and speech models (the suite's own architectures left out), inference under no_grad in float32;
training steps of a few of them (`hf/train/`); and decoding with a compiled forward, with a static KV
cache as transformers documents for fast decoding, with the default cache that grows each token, and
whisper's transcription.
"""

from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from experiments.corpus.hazards import Compile, Program, training

MODELS: dict[str, Callable[[torch.device, Compile], Program]] = {}

SMALL = {  # every field a config has of these is set so: two layers, width 64, two heads
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 2, "num_key_value_heads": 2,
    "intermediate_size": 128, "head_dim": 32, "d_model": 64, "encoder_layers": 2, "decoder_layers": 2,
    "encoder_attention_heads": 2, "decoder_attention_heads": 2, "encoder_ffn_dim": 128, "decoder_ffn_dim": 128,
    "n_layer": 2, "n_head": 2, "n_embd": 64, "num_layers": 2, "num_heads": 2, "d_ff": 128, "d_kv": 32,
    "embedding_size": 64, "vocab_size": 512, "image_size": 32, "patch_size": 8, "num_decoder_layers": 2,
    "max_position_embeddings": 128, "rotary_dim": 16, "max_source_positions": 64,  # whisper: 128 audio frames
}
# Architectures the suite has (BERT, DeBERTa, DeBERTa-v2, GPT-2, MT5, BlenderbotSmall, CLIP, XLNet,
# MobileBERT, TrOCR) are left out.
TEXT = ("roberta distilbert albert electra mpnet xlm-roberta camembert ernie squeezebert convbert megatron-bert "
        "roformer nystromformer yoso canine gpt_neo gptj opt bloom llama mistral qwen2 phi gemma falcon stablelm "
        "starcoder2 qwen3 mixtral modernbert mamba t5 bart mbart pegasus marian led").split()  # mixtral: experts
# routed by the data; mamba: a state-space scan in PyTorch (its CUDA kernels are not installed)
VISION = "vit deit beit resnet regnet mobilevit dinov2 segformer poolformer".split()
SPEECH = "wav2vec2 hubert wavlm".split()  # raw audio in
TRANSCRIBERS = ("whisper",)  # log-mel frames in, tokens out
DECODERS = ("llama", "qwen2", "mistral", "gemma")  # generation with a static cache
GROWING = ("llama", "gpt_neo")  # generation with the default cache: a new sequence length each token
TRAIN = ("roberta", "gpt_neo", "llama", "t5", "bart", "vit")  # a training step each
ENCODER_DECODER = {"t5", "bart", "mbart", "pegasus", "marian", "led"}


def _config(model_type: str):
    from transformers import AutoConfig

    config = AutoConfig.for_model(model_type)
    for name, value in SMALL.items():
        if hasattr(config, name) and isinstance(getattr(config, name), int):
            try:
                setattr(config, name, value)
            except (AttributeError, NotImplementedError):  # derived (falcon's head_dim) or fixed (funnel's layers)
                pass
    vocab = getattr(config, "vocab_size", None)
    for name, value in list(vars(config).items()):  # special tokens inside the smaller vocabulary
        if vocab and name.endswith("_token_id") and isinstance(value, int) and value >= vocab:
            setattr(config, name, 1)
    for name, value in vars(config).items():  # no dropout: compiled and eager draw other masks
        if isinstance(value, float) and any(k in name for k in ("dropout", "pdrop", "layerdrop")):
            setattr(config, name, 0.0)
    if hasattr(config, "pad_token_id") and config.pad_token_id is None:
        config.pad_token_id = 0
    return config


def _tokens(device, *shape, vocab: int = 500):
    return lambda i: torch.randint(3, vocab, shape, generator=torch.Generator().manual_seed(i)).to(device)


def _frames(config, device):
    """Log-mel frames as a transcriber takes them: as many as its encoder's positions, twice."""
    return lambda i: torch.randn(1, config.num_mel_bins, 2 * config.max_source_positions,
                                 generator=torch.Generator().manual_seed(i)).to(device)


def _called(model_type: str, config, device) -> tuple[Callable[..., torch.Tensor], Callable[[int], tuple]]:
    """How a model of this type is called, and on what: run(model, *inputs) -> the hidden states, and
    inputs(i)."""
    if model_type in VISION:
        size = getattr(config, "image_size", 32)
        size = size if isinstance(size, int) else 32
        images = lambda i: (torch.randn(1, 3, size, size, generator=torch.Generator().manual_seed(i)).to(device),)  # noqa: E731
        return (lambda f, x: f(pixel_values=x)[0]), images
    if model_type in SPEECH:
        audio = lambda i: (torch.randn(1, 4000, generator=torch.Generator().manual_seed(i)).to(device),)  # noqa: E731
        return (lambda f, x: f(input_values=x).last_hidden_state), audio
    tokens = _tokens(device, 1, 16)
    if model_type in TRANSCRIBERS:
        frames = _frames(config, device)
        return ((lambda f, x, ids: f(input_features=x, decoder_input_ids=ids).last_hidden_state),
                lambda i: (frames(i), tokens(i)[:, :8]))
    if model_type in ENCODER_DECODER:
        return (lambda f, ids: f(input_ids=ids, decoder_input_ids=ids[:, :8]).last_hidden_state), lambda i: (tokens(i),)
    return (lambda f, ids: f(input_ids=ids).last_hidden_state), lambda i: (tokens(i),)


def _inference(model_type: str):
    def build(device, compile):
        from transformers import AutoModel

        config = _config(model_type)
        model = AutoModel.from_config(config).to(device).eval()
        f = torch.no_grad()(compile(model))
        run, inputs = _called(model_type, config, device)
        return Program(lambda *args: run(f, *args), inputs, compare="norm")
    return build


def _training(model_type: str):
    def build(device, compile):
        from transformers import AutoModel

        config = _config(model_type)  # dropout off: eager and compiled would draw other masks
        run, inputs = _called(model_type, config, device)
        return training(AutoModel.from_config(config), device, compile, inputs, run, compare="norm")
    return build


def _generate(model_type: str, cache: str | None = "static"):
    """Greedy decoding of 8 tokens, the forward compiled as transformers documents (`model.forward =
    torch.compile(model.forward, ...)`), with a static KV cache (`cache_implementation="static"`) or,
    where `cache` is None, transformers' default one."""
    def build(device, compile):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(_config(model_type)).to(device).eval()
        model.forward = compile(model.forward)
        tokens = _tokens(device, 1, 8)

        def step(ids):
            with torch.no_grad():
                return model.generate(ids, max_new_tokens=8, do_sample=False, cache_implementation=cache,
                                      pad_token_id=0)
        return Program(step, lambda i: (tokens(i),))
    return build


def _transcribe(model_type: str):
    """Greedy transcription of 8 tokens, the forward compiled as for _generate."""
    def build(device, compile):
        from transformers import AutoModelForSpeechSeq2Seq

        config = _config(model_type)
        model = AutoModelForSpeechSeq2Seq.from_config(config).to(device).eval()
        model.forward = compile(model.forward)

        def step(frames):
            with torch.no_grad():
                return model.generate(input_features=frames, max_new_tokens=8, do_sample=False)
        frames = _frames(config, device)
        return Program(step, lambda i: (frames(i),))
    return build


def _register() -> None:
    if importlib.util.find_spec("transformers") is None:  # absent: no HuggingFace programs
        return
    for t in (*TEXT, *VISION, *SPEECH, *TRANSCRIBERS):
        MODELS[f"hf/{t}"] = _inference(t)
    for t in TRAIN:
        MODELS[f"hf/train/{t}"] = _training(t)
    for t in DECODERS:
        MODELS[f"hf/generate-static/{t}"] = _generate(t)
    for t in GROWING:
        MODELS[f"hf/generate-dynamic/{t}"] = _generate(t, cache=None)
    for t in TRANSCRIBERS:
        MODELS[f"hf/transcribe/{t}"] = _transcribe(t)


_register()
