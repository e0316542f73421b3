#!/usr/bin/python3
"""Evaluates ops in PyTorch for cnnc's op tests (compiler/reference, TestOpsAgainstPyTorch).

Reads a JSON list of cases from stdin; each case has "expr" (a Python
expression over x, y, z, the op's parameters and buffers by suffix — weight,
bias, running_mean, ... — with F = torch.nn.functional), "tensors" (name ->
{"shape", "data"}, float64 row-major), "grad" (names of the tensors to
differentiate) and "dy" (the gradient of the output). Everything runs in
float64. Writes a JSON list: per case "out" (the output, flattened), "grads"
(name -> flattened gradient) and "after" (every tensor's values after the
call: batch norm updates its running statistics in place).
"""
import json
import sys

import torch
import torch.nn.functional as F  # noqa: F401 (used by the expressions)


def tensor(t):
    return torch.tensor(t["data"], dtype=torch.float64).reshape(t["shape"])


def run(case):
    env = {"torch": torch, "F": F}
    for name, t in case["tensors"].items():
        v = tensor(t)
        if name in case["grad"]:
            v.requires_grad_(True)
        env[name] = v
    out = eval(case["expr"], env)  # the op's expression, written in the op's file
    res = {"out": out.detach().reshape(-1).tolist(), "grads": {}, "after": {}}
    if case["grad"]:
        out.backward(tensor(case["dy"]))
        for name in case["grad"]:
            g = env[name].grad
            res["grads"][name] = None if g is None else g.reshape(-1).tolist()
    for name in case["tensors"]:
        res["after"][name] = env[name].detach().reshape(-1).tolist()
    return res


def main():
    torch.set_default_dtype(torch.float64)
    cases = json.load(sys.stdin)
    json.dump([run(c) for c in cases], sys.stdout)


if __name__ == "__main__":
    main()
