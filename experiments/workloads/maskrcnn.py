"""Mask R-CNN (ResNet-50 FPN) from torchvision, random weights, one image: detection with
data-dependent shapes (proposals, NMS), the graph-splitting case of the paper's VM."""

import torch

from experiments.workloads import Workload


class Model(Workload):
    name = "maskrcnn"
    acronyms = {"eval": "VM"}
    batch_sizes = {"eval": 1}
    eval_dtype = torch.float32  # torchvision's nms and roi_align have no bfloat16 kernels
    origin = "torchvision.models.detection.maskrcnn_resnet50_fpn(weights=None, weights_backbone=None)"

    def build(self):
        import torchvision

        side = 128 if self.tiny else 800
        model = torchvision.models.detection.maskrcnn_resnet50_fpn(
            weights=None, weights_backbone=None, num_classes=91, min_size=side, max_size=side,
            **({"rpn_pre_nms_top_n_test": 50, "rpn_post_nms_top_n_test": 20, "box_detections_per_img": 10}
               if self.tiny else {}))
        images = [torch.rand(3, side, side, device=self.device) for _ in range(self.batch)]
        return model.to(self.device), (images,)
