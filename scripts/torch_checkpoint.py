#!/usr/bin/python3
"""PyTorch's side of cnnc's checkpoint tests (codegen/trainergen,
TestCheckpointInPyTorch): loads a cnnc checkpoint into the PyTorch model
of the same layers — the OOM guide's SimpleCNN (with the 2x2 max-pools that
make fc1's 32*30*30 inputs right) or examples/mnist.cnn's MNISTNet — with
load_state_dict(strict=True), evaluates a batch, takes STEPS steps of the
torch.optim optimizer the checkpoint's metadata names (sgd, adam or adamw
with their settings) on it, and writes the parameters as a safetensors
file for cnnc to compare: OUT from float32 (what PyTorch users get), and
OUT.f64 from the same steps in float64, the truth both float32 runs are
measured against (Adam turns float32 rounding of tiny gradients into
visible update differences, so two float32 runs differ by more than
either differs from the truth).

Usage: torch_checkpoint.py MODEL CHECKPOINT PIXELS LABELS N STEPS OUT
  MODEL: simplecnn or mnist
  PIXELS: N images, uint8 HWC (as cnnc's loader gives them)
  LABELS: N int32, little endian
Prints one JSON object: the evaluation loss and correct count.
No safetensors package is needed: the format is a JSON header and bytes.
"""
import json
import os
import re
import struct
import sys

import torch
import torch.nn.functional as F


HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "bench")]
from compare_safetensors import read  # noqa: E402
from torch_train import MNISTNet, SimpleCNN  # noqa: E402  (the guide's SimpleCNN, pools added)


MODELS = {"simplecnn": (SimpleCNN, (128, 128, 3)), "mnist": (MNISTNet, (28, 28, 1))}


def optimizer(spec, params):
    """torch.optim's optimizer for cnnc's "sgd(lr=..,momentum=..,...)" or
    "adam(lr=..,betas=[..,..],eps=..,weight_decay=..)" (adamw alike)."""
    m = re.fullmatch(r"(\w+)\((.*)\)", spec)
    name, args = m.group(1), {}
    for k, v in re.findall(r"(\w+)=(\[[^\]]*\]|[^,]+)", m.group(2)):
        args[k] = [float(x) for x in v.strip("[]").split(",")] if v.startswith("[") else v
    if name == "sgd":
        return torch.optim.SGD(params, lr=float(args["lr"]), momentum=float(args["momentum"]),
                               nesterov=args["nesterov"] == "true", weight_decay=float(args["weight_decay"]))
    cls = {"adam": torch.optim.Adam, "adamw": torch.optim.AdamW}[name]
    return cls(params, lr=float(args["lr"]), betas=tuple(args["betas"]), eps=float(args["eps"]),
               weight_decay=float(args["weight_decay"]))


def read_safetensors(path):
    tensors, meta = read(path)
    out = {}
    for name, (e, data) in tensors.items():
        assert e["dtype"] == "F32", (name, e["dtype"])
        out[name] = torch.frombuffer(bytearray(data), dtype=torch.float32).reshape(e["shape"])
    return out, meta


def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def train(cls, state, x, y, spec, steps, dtype):
    model = cls().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in state.items()}, strict=True)
    x = x.to(dtype)
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        correct = int((logits.argmax(1) == y).sum())
    opt = optimizer(spec, model.parameters())
    for _ in range(steps):
        opt.zero_grad()
        F.cross_entropy(model(x), y).backward()
        opt.step()
    return loss, correct, {k: v.float() for k, v in model.state_dict().items()}


def main():
    model_name, ck, pixels, labels, n, steps, out = sys.argv[1:8]
    n, steps = int(n), int(steps)
    cls, (h, w, c) = MODELS[model_name]
    tensors, meta = read_safetensors(ck)
    state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    # names, shapes and layouts must all match
    cls().load_state_dict(state, strict=True)
    with open(pixels, "rb") as f:
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(n, h, w, c)
    x = x.permute(0, 3, 1, 2).contiguous().float() / 255  # ToTensor: CHW
    with open(labels, "rb") as f:
        y = torch.tensor(struct.unpack(f"<{n}i", f.read())).long()
    loss, correct, params = train(cls, state, x, y, meta["optimizer"], steps, torch.float32)
    write_safetensors(out, params)
    _, _, params64 = train(cls, state, x, y, meta["optimizer"], steps, torch.float64)
    write_safetensors(out + ".f64", params64)
    print(json.dumps({"loss": loss, "correct": correct, "optimizer": meta["optimizer"], "torch": torch.__version__}))


if __name__ == "__main__":
    main()
