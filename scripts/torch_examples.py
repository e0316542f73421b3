#!/usr/bin/python3
"""PyTorch twins of cnnc's example models (examples/lenet5.cnn,
vgg_small.cnn, mobilenet_small.cnn, resnet18.cnn), with the same layers
under the same state_dict names (a statement `bn1 = batchnorm2d(...)` is
the attribute bn1: bn1.weight, bn1.bias, bn1.running_mean, ...), and
their side of cnnc's cross-checks (codegen/trainergen,
TestExamplesInPyTorch).

Reads one JSON object on stdin:
  model       lenet5, vgg_small, mobilenet_small or resnet18
  checkpoint  a cnnc checkpoint of the model (safetensors)
  pixels      N images as uint8 HWC, flattened (as cnnc's loader gives them)
  labels      N class numbers
  steps       training steps to take on the batch
  masks       dropout layer -> one list of 0/1 per step: the elements cnnc
              kept (its counter-based masks cannot be drawn by torch's RNG)
  out         a folder for the state after the steps
  loss_bound  true: also the float32 error bound of the evaluation loss
              (f32_error_bound.py; its rules cover LeNet-5's ops)
  dtype       "float64" (or "float32"): instead of all the below, train in
              that type as cnnc's CPU target trains in float32 (codegen/cpu,
              TestExamplesFloat32InPyTorch, against float64):
              one step on each of BATCHES ({pixels, labels}; pixels
              * (1.0f/255), the float32 constant cnnc's kernels load them
              with, the product in DTYPE: exact in float64), MASKS
              indexed by step, at learning rate LR (default: the
              checkpoint's); writes the parameters, buffers and the
              optimizer's state (optimizer.NAME.STATE, cnnc's names) after
              the last step and prints the losses
Loads the checkpoint with load_state_dict(strict=True) in float32 (names,
shapes and buffers must all match) and checks every value arrived; then,
in float64 from those float32 values: the loss and correct count in
evaluation mode, and STEPS training steps of the torch.optim optimizer the
checkpoint names (from the checkpoint's optimizer state), each step's
training-mode loss (batch statistics) before its update. Writes every
parameter and buffer after the steps to OUT/NAME (float64, little endian,
row-major) and prints one JSON object: the parameter count, the losses and
the names written.

No safetensors package is needed (cnnc_checkpoint.py reads the format).
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
from cnnc_checkpoint import read as read_raw  # noqa: E402
from f32_error_bound import Analysis  # noqa: E402


class Dropout(nn.Module):
    """nn.Dropout, or, when the test sets mask, cnnc's own mask (kept
    elements scaled by 1/(1-p), as nn.Dropout scales them)."""

    def __init__(self, p):
        super().__init__()
        self.p, self.mask = p, None

    def forward(self, x):
        if not self.training:
            return x
        if self.mask is None:
            return F.dropout(x, self.p, True)
        return x * self.mask.to(x.dtype).reshape(x.shape) / (1 - self.p)


class LeNet5(nn.Module):
    """examples/lenet5.cnn."""
    shape = (1, 28, 28)

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, 10)

    def forward(self, x):
        x = F.avg_pool2d(torch.tanh(self.conv1(x)), 2)
        x = F.avg_pool2d(torch.tanh(self.conv2(x)), 2)
        x = torch.tanh(self.fc1(x.flatten(1)))
        return self.fc3(torch.tanh(self.fc2(x)))


class VGGSmall(nn.Module):
    """examples/vgg_small.cnn."""
    shape = (3, 32, 32)

    def __init__(self):
        super().__init__()
        for i, (cin, cout) in enumerate([(3, 32), (32, 32), (32, 64), (64, 64), (64, 128)], 1):
            setattr(self, f"conv{i}", nn.Conv2d(cin, cout, 3, padding=1, bias=False))
            setattr(self, f"bn{i}", nn.BatchNorm2d(cout))
        self.fc1 = nn.Linear(128 * 4 * 4, 256)
        self.drop1 = Dropout(0.5)
        self.fc2 = nn.Linear(256, 10)

    def forward(self, x):
        for i in range(1, 6):
            x = torch.relu(getattr(self, f"bn{i}")(getattr(self, f"conv{i}")(x)))
            if i in (2, 4, 5):
                x = F.max_pool2d(x, 2)
        return self.fc2(self.drop1(torch.relu(self.fc1(x.flatten(1)))))


class MobileNetSmall(nn.Module):
    """examples/mobilenet_small.cnn: depthwise-separable blocks."""
    shape = (3, 32, 32)
    blocks = [(16, 32, 2), (32, 64, 2), (64, 128, 2), (128, 128, 1)]

    def __init__(self):
        super().__init__()
        self.conv0 = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.bn0 = nn.BatchNorm2d(16)
        for i, (cin, cout, s) in enumerate(self.blocks, 1):
            setattr(self, f"dw{i}", nn.Conv2d(cin, cin, 3, stride=s, padding=1, groups=cin, bias=False))
            setattr(self, f"dwbn{i}", nn.BatchNorm2d(cin))
            setattr(self, f"pw{i}", nn.Conv2d(cin, cout, 1, bias=False))
            setattr(self, f"pwbn{i}", nn.BatchNorm2d(cout))
        self.fc = nn.Linear(128, 10)

    def forward(self, x):
        x = F.hardswish(self.bn0(self.conv0(x)))
        for i in range(1, len(self.blocks) + 1):
            x = F.hardswish(getattr(self, f"dwbn{i}")(getattr(self, f"dw{i}")(x)))
            x = F.hardswish(getattr(self, f"pwbn{i}")(getattr(self, f"pw{i}")(x)))
        return self.fc(x.mean((2, 3)))


class ResNet18(nn.Module):
    """examples/resnet18.cnn: CIFAR-style ResNet-18, torchvision's
    BasicBlock with flat names (layer2.0.conv1 is l2_0_conv1)."""
    shape = (3, 32, 32)

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.plan = []  # (prefix, stride, projection)
        cin = 64
        for st, (c, s) in enumerate([(64, 1), (128, 2), (256, 2), (512, 2)], 1):
            for b in range(2):
                p, stride = f"l{st}_{b}_", s if b == 0 else 1
                setattr(self, p + "conv1", nn.Conv2d(cin, c, 3, stride=stride, padding=1, bias=False))
                setattr(self, p + "bn1", nn.BatchNorm2d(c))
                setattr(self, p + "conv2", nn.Conv2d(c, c, 3, padding=1, bias=False))
                setattr(self, p + "bn2", nn.BatchNorm2d(c))
                proj = stride != 1 or cin != c
                if proj:
                    setattr(self, p + "sc", nn.Conv2d(cin, c, 1, stride=stride, bias=False))
                    setattr(self, p + "scbn", nn.BatchNorm2d(c))
                self.plan.append((p, proj))
                cin = c
        self.fc = nn.Linear(512, 10)

    def forward(self, x):
        m = lambda name: getattr(self, name)  # noqa: E731
        x = torch.relu(self.bn1(self.conv1(x)))
        for p, proj in self.plan:
            y = torch.relu(m(p + "bn1")(m(p + "conv1")(x)))
            y = m(p + "bn2")(m(p + "conv2")(y))
            x = torch.relu(y + (m(p + "scbn")(m(p + "sc")(x)) if proj else x))
        return self.fc(x.mean((2, 3)))


MODELS = {"lenet5": LeNet5, "vgg_small": VGGSmall, "mobilenet_small": MobileNetSmall, "resnet18": ResNet18}


def load(cls, tensors, dtype):
    model = cls().to(dtype)
    model.load_state_dict({k: v if v.dtype == torch.int64 else v.to(dtype) for k, v in tensors.items()
                           if not k.startswith("optimizer.")}, strict=True)
    return model


def set_masks(model, masks, step):
    for name, per_step in masks.items():
        getattr(model, name).mask = torch.tensor(per_step[step])


def train_float32(req, cls, tensors, meta):
    """req's float32 steps (dtype "float32" above): the twin of cnnc's
    float32 training, from the checkpoint's parameters, buffers and
    optimizer state."""
    from torch_checkpoint import optimizer
    dtype = getattr(torch, req["dtype"])
    model = load(cls, tensors, dtype)
    model.train()
    opt = optimizer(meta["optimizer"], model.parameters())
    for g in opt.param_groups:  # the run's rate (the checkpoint's; the test sets its own)
        g["lr"] = float(req.get("lr", meta["lr"]))
    names = {}
    for name, p in model.named_parameters():  # the checkpoint's momentum, bit for bit
        names[p] = name
        st = {k[len(f"optimizer.{name}."):]: v.to(dtype) for k, v in tensors.items() if k.startswith(f"optimizer.{name}.")}
        if st:
            opt.state[p] = st
    c, h, w = cls.shape
    scale = torch.tensor(1 / 255, dtype=torch.float32).to(dtype)  # 1.0f/255, as cnnc's loads multiply
    out = {"torch": torch.__version__, "train_losses": []}
    for t, b in enumerate(req["batches"]):
        labels = torch.tensor(b["labels"], dtype=torch.long)
        x8 = torch.tensor(b["pixels"], dtype=torch.uint8).reshape(len(labels), h, w, c).permute(0, 3, 1, 2)
        set_masks(model, req.get("masks") or {}, t)
        opt.zero_grad()
        loss = F.cross_entropy(model(x8.to(dtype) * scale), labels)
        loss.backward()
        opt.step()
        out["train_losses"].append(loss.item())
    state = dict(model.state_dict())
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v) and v.is_floating_point():
                state[f"optimizer.{names[p]}.{k}"] = v
    for k, v in state.items():
        with open(os.path.join(req["out"], k), "wb") as f:
            f.write(v.double().contiguous().numpy().astype("<f8").tobytes())
    out["state"] = list(state)
    json.dump(out, sys.stdout)


def main():
    from torch_checkpoint import optimizer  # here: torch_checkpoint imports the twins
    req = json.load(sys.stdin)
    cls = MODELS[req["model"]]
    tensors = load_file(req["checkpoint"])
    meta = read_raw(req["checkpoint"])[1]
    if req.get("dtype") in ("float32", "float64"):
        train_float32(req, cls, tensors, meta)
        return
    model32 = load(cls, tensors, torch.float32)
    for k, v in model32.state_dict().items():  # every value arrived, bit for bit
        if not torch.equal(v, tensors[k]):
            raise SystemExit(f"torch_examples: {k} changed on loading")
    c, h, w = cls.shape
    labels = torch.tensor(req["labels"], dtype=torch.long)
    n = len(labels)
    x8 = torch.tensor(req["pixels"], dtype=torch.uint8).reshape(n, h, w, c).permute(0, 3, 1, 2)
    x = x8.double() / 255  # ToTensor; exact in float64
    model = load(cls, tensors, torch.float64)
    model.eval()
    with torch.no_grad():
        logits = model(x)
    out = {"torch": torch.__version__, "params": sum(p.numel() for p in model.parameters()),
           "buffers": sum(b.numel() for b in model.buffers()),
           "eval_loss": F.cross_entropy(logits, labels).item(),
           "eval_correct": int((logits.argmax(1) == labels).sum()), "train_losses": []}
    if req.get("loss_bound"):
        # the float32 error bound of the evaluation loss (f32_error_bound.py)
        info = Analysis(model, exact=False).forward_bound(x, labels)
        out["eval_loss_bound"], out["may_flip"] = info["loss_bound"], info["may_flip"]
    model.train()
    opt = optimizer(meta["optimizer"], model.parameters())
    for name, p in model.named_parameters():  # the checkpoint's momentum
        st = {k[len(f"optimizer.{name}."):]: v.double().clone() for k, v in tensors.items()
              if k.startswith(f"optimizer.{name}.")}
        if st:
            opt.state[p] = st
    for t in range(req["steps"]):
        set_masks(model, req.get("masks") or {}, t)
        opt.zero_grad()
        loss = F.cross_entropy(model(x), labels)
        loss.backward()
        opt.step()
        out["train_losses"].append(loss.item())
    for k, v in model.state_dict().items():
        with open(os.path.join(req["out"], k), "wb") as f:
            f.write(v.double().contiguous().numpy().astype("<f8").tobytes())
    out["state"] = list(model.state_dict())
    json.dump(out, sys.stdout)


if __name__ == "__main__":
    main()
