#!/usr/bin/python3
"""PyTorch's side of cnnc's checkpoint test (codegen/trainergen,
TestCheckpointInPyTorch): loads a cnnc checkpoint into the OOM guide's
SimpleCNN (with the 2x2 max-pools that make fc1's 32*30*30 inputs right)
with load_state_dict(strict=True), evaluates a batch, takes one
torch.optim.SGD step on it (momentum 0.9, as examples/simplecnn.cnn), and
writes the updated parameters as a safetensors file for cnnc to compare.

Usage: torch_checkpoint.py CHECKPOINT PIXELS LABELS N OUT
  PIXELS: N*128*128*3 uint8 (HWC, as cnnc's loader gives them)
  LABELS: N int32, little endian
Prints one JSON object: the evaluation loss and correct count.
No safetensors package is needed: the format is a JSON header and bytes.
"""
import json
import struct
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F


class SimpleCNN(nn.Module):
    def __init__(self):
        super(SimpleCNN, self).__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3)
        self.conv2 = nn.Conv2d(16, 32, kernel_size=3)
        self.fc1 = nn.Linear(32 * 30 * 30, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = F.max_pool2d(nn.ReLU()(self.conv1(x)), 2)
        x = F.max_pool2d(nn.ReLU()(self.conv2(x)), 2)
        x = x.view(x.size(0), -1)
        x = self.fc1(x)
        x = self.fc2(x)
        return x


def read_safetensors(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        assert e["dtype"] == "F32", (name, e["dtype"])
        a, b = e["data_offsets"]
        out[name] = torch.frombuffer(bytearray(body[a:b]), dtype=torch.float32).reshape(e["shape"])
    return out, header.get("__metadata__", {})


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


def main():
    ck, pixels, labels, n, out = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
    tensors, meta = read_safetensors(ck)
    model = SimpleCNN()
    state = {k: v for k, v in tensors.items() if not k.startswith("optimizer.")}
    model.load_state_dict(state, strict=True)  # names, shapes and layouts must all match
    with open(pixels, "rb") as f:
        x = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).reshape(n, 128, 128, 3)
    x = x.permute(0, 3, 1, 2).contiguous().float() / 255  # ToTensor: CHW
    with open(labels, "rb") as f:
        y = torch.tensor(struct.unpack(f"<{n}i", f.read())).long()
    with torch.no_grad():
        logits = model(x)
        loss = F.cross_entropy(logits, y).item()
        correct = int((logits.argmax(1) == y).sum())
    opt = torch.optim.SGD(model.parameters(), lr=float(meta.get("lr", 0.01)), momentum=0.9)
    opt.zero_grad()
    F.cross_entropy(model(x), y).backward()
    opt.step()
    write_safetensors(out, dict(model.state_dict()))
    print(json.dumps({"loss": loss, "correct": correct, "torch": torch.__version__}))


if __name__ == "__main__":
    main()
