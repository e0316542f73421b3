#!/usr/bin/env python3
"""PyTorch on the GPU, side by side with cnnc's trainers in scripts/gpu-check.sh:
step time (CUDA events; warm-up, median of many steps) of SimpleCNN at the
given batches with SGD momentum, fp32, in eager mode and under torch.compile
(mode max-autotune and reduce-overhead), and torch.cuda.max_memory_allocated
for one eager step. Prints one JSON object per line.
"""
import argparse
import json
import statistics
import sys
import time

import torch
import torch.nn as nn

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from torch_train import SimpleCNN  # noqa: E402


def step_fn(model, opt):
    def step(x8, y):
        x = x8.float().div_(255)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return loss
    return step


def timed(step, x8, y, warmup, steps):
    for _ in range(warmup):
        step(x8, y)
    torch.cuda.synchronize()
    times = []
    for _ in range(steps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        step(x8, y)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, nargs="+", default=[32, 256])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--modes", nargs="+", default=["eager", "max-autotune", "reduce-overhead"])
    args = ap.parse_args()
    dev = torch.device("cuda")
    for batch in args.batch:
        x8 = torch.randint(0, 256, (batch, 3, 128, 128), dtype=torch.uint8, device=dev)
        y = torch.randint(0, 10, (batch,), device=dev)
        for mode in args.modes:
            torch.manual_seed(0)
            model = SimpleCNN().to(dev)
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            step = step_fn(model, opt)
            t0 = time.perf_counter()
            if mode != "eager":
                step = torch.compile(step, mode=mode)
            torch.cuda.reset_peak_memory_stats()
            try:
                ms = timed(step, x8, y, 5, args.steps)
            except Exception as e:  # report, keep going
                print(json.dumps({"batch": batch, "mode": mode, "error": str(e)[:300]}), flush=True)
                continue
            print(json.dumps({"batch": batch, "mode": mode, "step_ms": ms, "images_per_s": batch / ms * 1e3,
                              "max_memory_allocated": torch.cuda.max_memory_allocated(),
                              "setup_s": time.perf_counter() - t0, "torch": torch.__version__,
                              "gpu": torch.cuda.get_device_name()}), flush=True)


if __name__ == "__main__":
    main()
