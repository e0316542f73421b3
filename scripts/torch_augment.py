"""torchvision's augmentation of images, for cnnc's augment tests.

Reads JSON on stdin: {"cases": [{"h", "w", "c", "pixels": uint8 HWC values,
"steps": [{"kind": "random_crop" | "random_resized_crop" | "hflip" |
"normalize", "size": [h, w], "padding", "mean", "std"}, ...], "eval": bool,
"draws": [per step: {"top", "left", "height", "width", "flip"}]}, ...]} and
prints {"torchvision": VERSION, "outs": [CHW float32 values per case]}.

Each image goes through torchvision.transforms.functional as the transforms
apply it, with the random parameters cnnc drew (augment.Spec.DrawSteps) in
place of torchvision's own: ToTensor (to_tensor), then in list order
RandomCrop (pad with zeros, then crop at the drawn (i, j)),
RandomResizedCrop (resized_crop at the drawn box, bilinear, antialias=False:
the tensor path's interpolate), RandomHorizontalFlip (hflip when drawn) and
Normalize. Evaluation: ToTensor, CenterCrop of the crop's size where the
list crops, Normalize.
"""
import json
import sys
import warnings

import numpy as np
import torch
import torchvision
import torchvision.transforms.functional as F
from torchvision.transforms import InterpolationMode


def run(c):
    hwc = np.array(c["pixels"], dtype=np.uint8).reshape(c["h"], c["w"], c["c"])
    img = F.to_tensor(hwc)
    for st, d in zip(c["steps"], c["draws"]):
        k = st["kind"]
        if c["eval"]:
            if k in ("random_crop", "random_resized_crop"):
                img = F.center_crop(img, st["size"])
            elif k == "normalize":
                img = F.normalize(img, st["mean"], st["std"])
            continue
        if k == "random_crop":
            if st.get("padding", 0) > 0:
                img = F.pad(img, [st["padding"]], fill=0)
            img = F.crop(img, d["top"], d["left"], d["height"], d["width"])
        elif k == "random_resized_crop":
            img = F.resized_crop(img, d["top"], d["left"], d["height"], d["width"], st["size"],
                                 InterpolationMode.BILINEAR, antialias=False)
        elif k == "hflip":
            if d["flip"]:
                img = F.hflip(img)
        elif k == "normalize":
            img = F.normalize(img, st["mean"], st["std"])
    return img.contiguous().view(-1).tolist()


def main():
    warnings.simplefilter("ignore")
    torch.set_num_threads(1)
    req = json.load(sys.stdin)
    json.dump({"torchvision": torchvision.__version__, "outs": [run(c) for c in req["cases"]]}, sys.stdout)


if __name__ == "__main__":
    main()
