#!/usr/bin/python3
"""PyTorch's side of cnnc's checkpoint tests (codegen/trainergen,
TestCheckpointInPyTorch): loads a cnnc checkpoint into the PyTorch model
of the same layers — the OOM guide's SimpleCNN (with the 2x2 max-pools that
make fc1's 32*30*30 inputs right) or examples/mnist.cnn's MNISTNet — with
load_state_dict(strict=True), evaluates a batch at it, and takes STEPS
steps of the torch.optim optimizer the checkpoint's metadata names (sgd,
adam or adamw with their settings) on the batch. Step T+1 (T = 0 ..
STEPS-1) starts from float32 parameters and optimizer state — cnnc's
checkpoint for the first, OUT.T.ck after — and writes:

  OUT.T+1.f64    the step in float64 from there, the truth: parameters and
                 "optimizer.<param>.<state>" as the nearest float32 NAME
                 and the rest NAME.lo (~48 bits together);
  OUT.T+1.bound  how far a float32 step may land from it, element by
                 element (f32_error_bound.py; rounded up to float32);
  OUT.T+1.torch  PyTorch's float32 step, for information only;
  OUT.T+1.ck     the truth rounded to float32, a cnnc checkpoint (step
                 T+1) that the next step starts from (not after the last).

Starting every step from the same float32 numbers keeps each step's error
that step's own: a bound carried across steps through magnitudes alone
grows a hundredfold a step, far beyond the error it bounds.

Usage: torch_checkpoint.py MODEL CHECKPOINT PIXELS LABELS N STEPS OUT
  MODEL: simplecnn, mnist or lenet5
  PIXELS: N images, uint8 HWC (as cnnc's loader gives them)
  LABELS: N int32, little endian
Prints one JSON object: the float64 loss and correct count on the batch at
the checkpoint, their bounds, PyTorch's float32 loss and count, and for
each step how many relu or pool elements float32 may flip and the
parameters at or below them ("unsettled": their bounds hold the gradient a
flip would send the other way).
No safetensors package is needed (cnnc_checkpoint.py reads the format).
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
from cnnc_checkpoint import load_file  # noqa: E402
from cnnc_checkpoint import read as read_raw  # noqa: E402
from f32_error_bound import Analysis, optimizer_step  # noqa: E402
from torch_examples import LeNet5  # noqa: E402  (examples/lenet5.cnn's twin)
from torch_train import MNISTNet, SimpleCNN  # noqa: E402  (the guide's SimpleCNN, pools added)


# model, image shape (HWC), and whether the bound carries the logits' error
# to the gradients exactly (f32_error_bound.Analysis): for MNISTNet that
# tightens the conv layers' bounds ~30x for a second a step; SimpleCNN's
# conv bounds stay above their step either way (its 47,628-term gradient
# sums), and its 30 passes would take ~10 s
MODELS = {"simplecnn": (SimpleCNN, (128, 128, 3), False), "mnist": (MNISTNet, (28, 28, 1), True),
          "lenet5": (LeNet5, (28, 28, 1), True)}


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


def write_safetensors(path, tensors, meta=None):
    header, blobs, off = {}, [], 0
    if meta:
        header["__metadata__"] = meta
    for name, t in tensors.items():
        b = t.detach().contiguous().numpy().astype("<f4").tobytes()
        header[name] = {"dtype": "F32", "shape": list(t.shape), "data_offsets": [off, off + len(b)]}
        blobs.append(b)
        off += len(b)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def start(cls, tensors, step, dtype, spec):
    """The model and its optimizer at a checkpoint: parameters and, after
    the first step, the optimizer state cnnc stores under
    optimizer.<param>.<state> (torch.optim's own state names)."""
    model = cls().to(dtype)
    model.load_state_dict({k: v.to(dtype) for k, v in tensors.items() if not k.startswith("optimizer.")}, strict=True)
    opt = optimizer(spec, model.parameters())
    if step > 0:
        for name, p in model.named_parameters():
            st = {k[len(f"optimizer.{name}."):]: v.to(dtype).clone() for k, v in tensors.items()
                  if k.startswith(f"optimizer.{name}.")}
            if isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                st["step"] = torch.tensor(float(step))
            opt.state[p] = st
    return model, opt


def state_after(model, opt):
    """Parameters and optimizer state by checkpoint name."""
    out = dict(model.state_dict())
    for name, p in model.named_parameters():
        out.update({f"optimizer.{name}.{k}": v for k, v in opt.state[p].items() if k != "step"})
    return out


def step32(cls, tensors, step, x, y, spec):
    """PyTorch's own float32 step (information: never a tolerance)."""
    model, opt = start(cls, tensors, step, torch.float32, spec)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    return state_after(model, opt)


def step64(cls, exact, tensors, step, x, y, spec):
    """The truth: the step in float64, and the float32 error bound of each
    parameter and state element; the loss info at the start."""
    model, opt = start(cls, tensors, step, torch.float64, spec)
    opt.zero_grad()
    analysis = Analysis(model, exact)
    G, info = analysis.bound(analysis.run(x, y), y)
    bounds = optimizer_step(opt, model, G)
    return info, state_after(model, opt), bounds


def split64(tensors):
    """float64 tensors as float32 pairs: NAME (nearest) and NAME.lo (the rest)."""
    out = {}
    for k, v in tensors.items():
        hi = v.float()
        out[k], out[k + ".lo"] = hi, (v - hi.double()).float()
    return out


def round_up32(t):
    """float32 values no smaller than t's, widened by 2^-28 for the truth's
    own error: its float64 rounding is the same analysis with u = 2^-53
    (2^-29 of the bound), and its split into NAME + NAME.lo loses 2^-48 of
    the value (the bound holds u = 2^-24 of it for the final rounding)."""
    t = t * (1 + 2.0 ** -28)
    f = t.float()
    return torch.where(f.double() < t, torch.nextafter(f, torch.tensor(float("inf"))), f)


def main():
    model_name, ck, pixels, labels, n, steps, out = sys.argv[1:8]
    n, steps = int(n), int(steps)
    cls, (h, w, c), exact = MODELS[model_name]
    meta = read_raw(ck)[1]
    tensors = load_file(ck)
    # names, shapes and layouts must all match
    cls().load_state_dict({k: v for k, v in tensors.items() if not k.startswith("optimizer.")}, strict=True)
    with open(pixels, "rb") as f:
        x8 = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(n, h, w, c).permute(0, 3, 1, 2)
    with open(labels, "rb") as f:
        y = torch.tensor(struct.unpack(f"<{n}i", f.read())).long()
    spec = meta["optimizer"]
    # ToTensor: CHW in [0, 1]; the truth divides exactly
    x32, x64 = x8.float() / 255, x8.double() / 255
    with torch.no_grad():
        logits = start(cls, tensors, 0, torch.float32, spec)[0](x32)
    result = {"torch_loss32": F.cross_entropy(logits, y).item(), "torch_correct32": int((logits.argmax(1) == y).sum()),
              "optimizer": spec, "torch": torch.__version__}
    for t in range(steps):
        write_safetensors(f"{out}.{t + 1}.torch", step32(cls, tensors, t, x32, y, spec))
        info, truth, bounds = step64(cls, exact, tensors, t, x64, y, spec)
        result.setdefault("flips", []).append(info.pop("flips"))
        result.setdefault("unsettled", []).append(info.pop("unsettled"))
        if t == 0:
            result.update(info)
        write_safetensors(f"{out}.{t + 1}.f64", split64(truth))
        write_safetensors(f"{out}.{t + 1}.bound", {k: round_up32(v) for k, v in bounds.items()})
        tensors = {k: v.float() for k, v in truth.items()}
        if t + 1 < steps:
            write_safetensors(f"{out}.{t + 1}.ck", tensors, dict(meta, step=str(t + 1)))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
