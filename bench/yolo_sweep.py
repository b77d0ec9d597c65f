"""Ultralytics' YOLO detectors, segmenters, pose and oriented-box models and RT-DETR, as a user brings them:
exported, compiled untuned, checked against ONNX Runtime, timed. The same rows as `bench.torchvision_sweep`.

    pip install --no-deps ultralytics opencv-python-headless   # not a dependency of tuner (AGPL-3.0)
    python -m bench.yolo_sweep [--models yolov8n,yolo11n-seg,...] [--threads 1] [--rounds 5] [--size 640]

Each model is built from its architecture file (`yolov8n.yaml`: no download) with random weights and
BatchNorm statistics, fused and run twice as `yolo export` does, its head in export mode (one tensor of boxes and class scores for every anchor,
as `yolo export format=onnx` writes it), and exported by `torch.onnx.export` (opset 17, batch 1).
"""
from __future__ import annotations

from pathlib import Path

from bench.torchvision_sweep import _torchvision, export_net, sweep_cli

# v5u, v6, v8 (detect, segment, pose, oriented boxes, classify), v9, v10, 11 (its C2PSA attention), 12,
# and RT-DETR (a transformer decoder: TopK query selection, GridSample deformable attention)
DEFAULT = ("yolov5nu,yolov6n,yolov8n,yolov8n-seg,yolov8n-pose,yolov8n-obb,yolov8n-cls,yolov9t,yolov10n,yolo11n,"
           "yolo11n-seg,yolo12n,rtdetr-l")
TASKS = {"seg": "SegmentationModel", "pose": "PoseModel", "obb": "OBBModel", "cls": "ClassificationModel"}


def exporter(size: int):
    def export(name: str, path: Path, seed: int = 0, dynamo: bool = False) -> Path:
        torch, _ = _torchvision()
        from ultralytics.nn import tasks
        torch.manual_seed(seed)
        kind = next((k for k in TASKS if name.endswith(f"-{k}")), None)
        net = getattr(tasks, TASKS[kind] if kind else "DetectionModel")(f"{name}.yaml", verbose=False)
        with torch.no_grad():            # random BatchNorm statistics, then folded as `yolo export` folds them
            for m in net.modules():
                if isinstance(m, torch.nn.modules.batchnorm._BatchNorm):
                    m.running_mean.uniform_(-0.1, 0.1)
                    m.running_var.uniform_(0.5, 1.5)
        net = net.eval().fuse(verbose=False)
        for m in net.modules():          # the head's export form: no anchors rebuilt per call, one output
            if hasattr(m, "export"):
                m.export, m.format = True, "onnx"
        side = 224 if kind == "cls" and size == 640 else size
        with torch.no_grad():            # `yolo export`'s dry runs: RT-DETR's decoder keeps its anchors then
            for _ in range(2):
                net(torch.zeros(1, 3, side, side))
        return export_net(torch, net, (1, 3, side, side), path, dynamo)
    return export


def main(argv=None) -> int:
    return sweep_cli("yolo", __doc__, DEFAULT, argv,
                     lambda ap: ap.add_argument("--size", type=int, default=640,
                                                help="the image's side (default 640; 224 for the classifier)"),
                     lambda args: ({"export": exporter(args.size)}, {"size": args.size}))


if __name__ == "__main__":
    raise SystemExit(main())
