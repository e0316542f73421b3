"""PyTorch's cross-entropy with label smoothing, for cnnc's tests.

Reads JSON on stdin: {"classes": C, "logits": [B*C floats], "labels": [B ints],
"label_smoothing": [eps, ...]} and prints, per eps, the mean loss of
torch.nn.functional.cross_entropy(logits, labels, label_smoothing=eps) and its
gradient with respect to the logits, computed in float64:
{"torch": VERSION, "results": [{"eps": e, "loss": l, "grad": [B*C floats]}, ...]}.
"""
import json
import sys

import torch
import torch.nn.functional as F


def main():
    req = json.load(sys.stdin)
    c = req["classes"]
    logits = torch.tensor(req["logits"], dtype=torch.float64).reshape(-1, c)
    labels = torch.tensor(req["labels"], dtype=torch.int64)
    results = []
    for eps in req["label_smoothing"]:
        x = logits.clone().requires_grad_(True)
        loss = F.cross_entropy(x, labels, label_smoothing=eps)
        loss.backward()
        results.append({"eps": eps, "loss": loss.item(), "grad": x.grad.reshape(-1).tolist()})
    json.dump({"torch": torch.__version__, "results": results}, sys.stdout)


if __name__ == "__main__":
    main()
