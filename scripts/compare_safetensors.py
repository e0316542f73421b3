#!/usr/bin/env python3
"""Compares two cnnc checkpoints tensor by tensor: prints the worst error
relative to each tensor's largest magnitude, and PASS when under 1e-3
(fp32 drift over 20 steps on different hardware, e.g. FMA on the GPU)."""
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cnnc_checkpoint import read  # noqa: E402  (the one safetensors reader)


def load(path):
    """The float32 tensors of a checkpoint, flat, by name."""
    return {name: struct.unpack(f"<{len(data) // 4}f", data) for name, (_, data) in read(path)[0].items()}


def main():
    want, got = load(sys.argv[1]), load(sys.argv[2])
    worst, where = 0.0, ""
    for name, w in want.items():
        g = got[name]
        scale = max(max(abs(x) for x in w), 1e-30)
        e = max(abs(x - y) for x, y in zip(w, g)) / scale
        print(f"{name}: {e:.2e}")
        if e > worst:
            worst, where = e, name
    print(f"{'PASS' if worst < 1e-3 else 'FAIL'}: worst relative difference {worst:.2e} ({where})")
    sys.exit(0 if worst < 1e-3 else 1)


if __name__ == "__main__":
    main()
