#!/usr/bin/python3
"""PyTorch eager's memory for one training step of SimpleCNN or of an
example model's twin (scripts/torch_examples.py) — the counterpart of
`cnnc plan examples/MODEL.cnn`: bytes of tensors saved for backward
(torch.autograd.graph.saved_tensors_hooks), plus parameters, gradients and
SGD momentum (and batch norm's buffers). CPU is enough: the bytes are the
same on a GPU.

Usage: torch_memory.py [--model simplecnn] [--batch 32] [--image C H W] [--json]
  --model: simplecnn, lenet5, vgg_small, mobilenet_small or resnet18
  --image: another input size (a fully convolutional twin: resnet18 at 3 224 224)
"""
import os
import sys
import argparse
import json

import torch
import torch.nn as nn


class SimpleCNN(nn.Module):
    """examples/simplecnn.cnn: the OOM guide's model with its 2x2 pools."""

    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3)
        self.fc1 = nn.Linear(32 * 30 * 30, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = x.view(x.size(0), -1)
        return self.fc2(self.fc1(x))


def twin(name):
    """The model class and its input shape (C, H, W)."""
    if name == "simplecnn":
        return SimpleCNN, (3, 128, 128)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from torch_examples import MODELS
    return MODELS[name], MODELS[name].shape


def measure(batch, name="simplecnn", image=None):
    torch.manual_seed(0)
    cls, shape = twin(name)
    model = cls()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    x = torch.rand(batch, *(image or shape))
    y = torch.randint(0, 10, (batch,))
    saved = {}  # storage pointer -> (bytes, dtype): a tensor saved twice counts once

    def pack(t):
        st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
        saved[st.data_ptr()] = (st.nbytes(), str(t.dtype))
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    opt.step()
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    buffers = sum(b.numel() * b.element_size() for b in model.buffers())
    by_dtype = {}
    for nbytes, dtype in saved.values():
        by_dtype[dtype] = by_dtype.get(dtype, 0) + nbytes
    # the input batch itself is saved by conv1; count it with the rest, as
    # PyTorch must keep it
    saved_bytes = sum(by_dtype.values())
    return {
        "model": name,
        "batch": batch,
        "torch": torch.__version__,
        "saved_for_backward_bytes": saved_bytes,
        "saved_by_dtype": by_dtype,
        "param_bytes": params,
        "grad_bytes": params,
        "momentum_bytes": params,
        "buffer_bytes": buffers,
        "lower_bound_bytes": saved_bytes + 3 * params + buffers,
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--model", default="simplecnn")
    ap.add_argument("--image", type=int, nargs=3, metavar=("C", "H", "W"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    rows = [measure(b, args.model, args.image) for b in args.batch]
    if args.json:
        print(json.dumps(rows, indent=1))
        return
    for r in rows:
        mb = lambda b: b / 1e6
        print(f"{r['model']} B={r['batch']}: saved for backward {mb(r['saved_for_backward_bytes']):.1f} MB "
              f"({', '.join(f'{k} {mb(v):.1f} MB' for k, v in sorted(r['saved_by_dtype'].items()))}), "
              f"params/grads/momentum 3 x {mb(r['param_bytes']):.2f} MB, buffers {mb(r['buffer_bytes']):.3f} MB, "
              f"lower bound {mb(r['lower_bound_bytes']):.1f} MB (torch {r['torch']})")


if __name__ == "__main__":
    main()
