"""Models beyond the suite, as their libraries build them (random weights, nothing downloaded), at a
size that builds in seconds: every torchvision model (classification, segmentation, detection, video,
optical flow) and timm models across families. Inference under no_grad in float32; and training steps of
a few timm models (`timm/train/`: BatchNorm's running statistics, depthwise convolutions, attention).
"""

from __future__ import annotations

from typing import Callable

import torch

from experiments.corpus.hazards import Compile, Program, training

MODELS: dict[str, Callable[[torch.device, Compile], Program]] = {}

TIMM = ("resnet18 resnet50d efficientnet_b0 mobilenetv3_small_100 convnext_atto vit_tiny_patch16_224 "
        "deit_tiny_patch16_224 swin_tiny_patch4_window7_224 regnetx_002 densenet121 dla34 dpn68 ghostnet_100 "
        "hrnet_w18_small mixnet_s mnasnet_100 poolformer_s12 resmlp_12_224 levit_128s pit_ti_224 cait_xxs24_224 "
        "coat_lite_tiny crossvit_tiny_240 edgenext_xx_small efficientformer_l1 fastvit_t8 gcvit_xxtiny "
        "mobilevit_xxs rexnet_100 selecsls42b tinynet_a xcit_nano_12_p16_224 lcnet_050 repvgg_a0 nf_resnet26 "
        "cspresnet50 eva02_tiny_patch14_224 beit_base_patch16_224 convit_tiny twins_svt_small volo_d1_224 "
        "mobileone_s0 hgnet_tiny").split()
TIMM_TRAIN = "resnet18 efficientnet_b0 mobilenetv3_small_100 convnext_atto vit_tiny_patch16_224".split()


def _image(device, *shape):
    return lambda i: (torch.randn(*shape, generator=torch.Generator().manual_seed(i)).to(device),)


def _images(device, n, *shape):
    """Detection models take a list of images."""
    return lambda i: ([torch.rand(*shape, generator=torch.Generator().manual_seed(10 * i + k)).to(device)
                       for k in range(n)],)


def _torchvision(kind: str, name: str) -> Callable[[torch.device, Compile], Program]:
    def build(device, compile):
        import torchvision

        kwargs = {"weights": None, "weights_backbone": None} if kind in ("segmentation", "detection") else {"weights": None}
        model = torchvision.models.get_model(name, **kwargs).to(device).eval()
        f = torch.no_grad()(compile(model))
        if kind == "detection":  # data-dependent outputs: which boxes pass NMS may differ in the last bit
            return Program(f, _images(device, 2, 3, 128, 128), compare="none")
        if kind == "optical_flow":
            # 4 flow updates, not 12: each is unrolled, and 12 took past a 10-minute call to compile
            return Program(lambda a, b: f(a, b, num_flow_updates=4)[-1], lambda i: (*_image(device, 1, 3, 128, 128)(i),
                                                                  *_image(device, 1, 3, 128, 128)(i + 100)),
                           compare="norm")
        if kind == "video":
            # s3d: its last pooling needs 16 frames of 224 by 224
            big = name.startswith(("mvit", "swin3d", "s3d"))
            return Program(f, _image(device, 1, 3, 16 if big else 8, 224 if big else 64, 224 if big else 64),
                           compare="norm")
        side = 224 if name.startswith(("vit_", "swin", "maxvit")) else 96
        if kind == "segmentation":
            return Program(lambda x: f(x)["out"], _image(device, 1, 3, side, side), compare="norm")
        return Program(f, _image(device, 1, 3, side, side), compare="norm")
    return build


def _timm(name: str) -> Callable[[torch.device, Compile], Program]:
    def build(device, compile):
        import timm

        model = timm.create_model(name, pretrained=False).to(device).eval()
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))
        return Program(torch.no_grad()(compile(model)), _image(device, 1, *size), compare="norm")
    return build


def _timm_training(name: str) -> Callable[[torch.device, Compile], Program]:
    def build(device, compile):
        import timm

        model = timm.create_model(name, pretrained=False)
        size = model.pretrained_cfg.get("input_size", (3, 224, 224))
        # four images: BatchNorm in training needs more than one value per channel after the last pooling,
        # and over two its statistics are so noisy that Inductor's rounding moved mobilenetv3's step by 1 %
        return training(model, device, compile, _image(device, 4, *size), compare="norm")
    return build


def _register() -> None:
    try:
        from torchvision import models
    except ImportError:
        models = None
    if models is not None:
        for kind, module in (("classification", models), ("segmentation", models.segmentation),
                             ("detection", models.detection), ("video", models.video),
                             ("optical_flow", models.optical_flow)):
            for name in models.list_models(module=module):
                MODELS[f"torchvision/{name}"] = _torchvision(kind, name)
    try:
        import timm
    except ImportError:
        return
    available = set(timm.list_models())
    for name in TIMM:
        if name in available:
            MODELS[f"timm/{name}"] = _timm(name)
    for name in TIMM_TRAIN:
        if name in available:
            MODELS[f"timm/train/{name}"] = _timm_training(name)


_register()
