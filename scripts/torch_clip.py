#!/usr/bin/python3
"""PyTorch's side of cnnc's gradient clipping check (codegen/trainergen,
TestClipGradNormInPyTorch): the twin of the test's small CNN, trained in
float64 with torch.nn.utils.clip_grad_norm_ before every optimizer step.

Reads one JSON object on stdin:
  checkpoint  a cnnc checkpoint of the test's model (safetensors)
  shape       [C, H, W] of its images
  pixels      per step, the batch's images as uint8 HWC, flattened
  labels      per step, the batch's class numbers
  optimizer   {kind: sgd|adam|adamw, lr, momentum, nesterov, weight_decay,
              betas, eps}
  max_norm    clip_grad_norm_'s max_norm
  out         a folder for the state after the steps
Loads the checkpoint (strict) into the twin in float64 (from its float32
values) with a fresh optimizer (the checkpoint is taken before any step),
then per step: zero_grad, the loss, backward, clip_grad_norm_(parameters,
max_norm), step. Writes every parameter and optimizer state tensor after
the steps to OUT/NAME (OUT/optimizer.NAME.STATE; float64, little endian,
row-major) and prints one JSON object: torch's version, each step's loss
and total gradient norm (as clip_grad_norm_ returns it), the names written.
"""
import json
import os
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from cnnc_checkpoint import load_file  # noqa: E402


class Small(nn.Module):
    """The test's model (clipSrc in codegen/trainergen/clip_test.go)."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 4, 3)
        self.conv2 = nn.Conv2d(4, 5, 3)
        self.fc1 = nn.Linear(10, 12)
        self.fc2 = nn.Linear(12, 10)

    def forward(self, x):
        x = F.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = F.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(self.fc1(torch.flatten(x, 1)))


def make_optimizer(o, params):
    if o["kind"] == "sgd":
        return torch.optim.SGD(params, lr=o["lr"], momentum=o["momentum"], nesterov=o["nesterov"],
                               weight_decay=o["weight_decay"])
    cls = torch.optim.Adam if o["kind"] == "adam" else torch.optim.AdamW
    return cls(params, lr=o["lr"], betas=tuple(o["betas"]), eps=o["eps"], weight_decay=o["weight_decay"])


def main():
    req = json.load(sys.stdin)
    tensors = load_file(req["checkpoint"])
    model = Small().double()
    model.load_state_dict({k: v.double() for k, v in tensors.items() if not k.startswith("optimizer.")}, strict=True)
    opt = make_optimizer(req["optimizer"], model.parameters())
    c, h, w = req["shape"]
    out = {"torch": torch.__version__, "losses": [], "norms": [], "written": []}
    for pixels, labels in zip(req["pixels"], req["labels"]):
        y = torch.tensor(labels, dtype=torch.long)
        x = torch.tensor(pixels, dtype=torch.uint8).reshape(len(labels), h, w, c).permute(0, 3, 1, 2).double() / 255
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), req["max_norm"])
        opt.step()
        out["losses"].append(loss.item())
        out["norms"].append(norm.item())
    state = dict(model.state_dict())
    for name, p in model.named_parameters():
        for k, v in opt.state[p].items():
            if torch.is_tensor(v) and v.shape == p.shape:
                state[f"optimizer.{name}.{k}"] = v
    for k, v in state.items():
        with open(os.path.join(req["out"], k), "wb") as f:
            f.write(v.double().contiguous().numpy().astype("<f8").tobytes())
        out["written"].append(k)
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
