"""The learning rates torch.optim.lr_scheduler gives, for cnnc's schedule tests.

Reads JSON on stdin: {"cases": [{"name": ..., "kind": "constant" | "step" |
"multistep" | "cosine" | "onecycle", "base": lr, "per_epoch": steps, "epochs": n,
"warmup": N (0: none), and the kind's arguments: "every", "gamma", "milestones",
"eta_min", "t_max" (0: the epochs), "pct_start", "div_factor",
"final_div_factor", "anneal_strategy"}, ...]} and prints
{"torch": VERSION, "lrs": {name: [the rate of every optimizer step]}}.

PyTorch's usual use: StepLR, MultiStepLR and CosineAnnealingLR are stepped
after every epoch, OneCycleLR (cycle_momentum=False: cnnc does not cycle
momentum) and the warmup after every batch. The warmup is
LinearLR(start_factor=1/N, end_factor=1, total_iters=N), chained with the
schedule on the same optimizer: both multiply its rate.
"""
import json
import sys
import warnings

import torch
from torch.optim import lr_scheduler as S


def rates(c):
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=c["base"], momentum=0.9)
    per_step, per_epoch = [], []
    n = c.get("warmup", 0)
    if n:
        per_step.append(S.LinearLR(opt, start_factor=1.0 / n, end_factor=1.0, total_iters=n))
    kind = c["kind"]
    if kind == "step":
        per_epoch.append(S.StepLR(opt, step_size=c["every"], gamma=c["gamma"]))
    elif kind == "multistep":
        per_epoch.append(S.MultiStepLR(opt, milestones=c["milestones"], gamma=c["gamma"]))
    elif kind == "cosine":
        per_epoch.append(S.CosineAnnealingLR(opt, T_max=c.get("t_max") or c["epochs"], eta_min=c.get("eta_min", 0.0)))
    elif kind == "onecycle":
        per_step.append(S.OneCycleLR(opt, max_lr=c["base"], total_steps=c["per_epoch"] * c["epochs"],
                                     pct_start=float(c["pct_start"]), div_factor=c["div_factor"],
                                     final_div_factor=c["final_div_factor"],
                                     anneal_strategy=c.get("anneal_strategy", "cos"), cycle_momentum=False))
    elif kind != "constant":
        raise ValueError("unknown kind " + kind)
    lrs = []
    for _ in range(c["epochs"]):
        for _ in range(c["per_epoch"]):
            lrs.append(opt.param_groups[0]["lr"])
            opt.step()
            for s in per_step:
                s.step()
        for s in per_epoch:
            s.step()
    return lrs


def main():
    warnings.simplefilter("ignore")
    req = json.load(sys.stdin)
    json.dump({"torch": torch.__version__, "lrs": {c["name"]: rates(c) for c in req["cases"]}}, sys.stdout)


if __name__ == "__main__":
    main()
