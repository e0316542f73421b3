#!/usr/bin/python3
"""PyTorch (CPU) counterparts of cnnc's CPU benchmarks, same models, batch,
precision and cores: the median training step time of examples/simplecnn.cnn
or examples/mnist.cnn at a batch size, and ImageFolder + DataLoader images/s.

Usage: torch_train.py train --model simplecnn|mnist [--batch 32] [--threads 2] [--steps 10]
       torch_train.py data ROOT [--workers 2]
       torch_train.py epoch ROOT [--threads 2] [--workers 2]   (SimpleCNN: one epoch + test pass, timed)
Prints one JSON object.
"""
import argparse
import json
import statistics
import time

import torch
import torch.nn as nn


class SimpleCNN(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3)
        self.conv2 = nn.Conv2d(16, 32, 3)
        self.fc1 = nn.Linear(32 * 30 * 30, 128)
        self.fc2 = nn.Linear(128, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(self.fc1(x.flatten(1)))


class MNISTNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.fc1 = nn.Linear(16 * 7 * 7, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = nn.functional.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = nn.functional.max_pool2d(torch.relu(self.conv2(x)), 2)
        return self.fc2(torch.relu(self.fc1(x.flatten(1))))


def step_times(model, shape, batch, lr, steps):
    """The seconds of each of steps training steps after 3 of warm-up."""
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    # uint8 images converted like ToTensor, inside the step as cnnc does
    x8 = torch.randint(0, 256, (batch,) + shape, dtype=torch.uint8)
    y = torch.randint(0, 10, (batch,))
    times = []
    for i in range(steps + 3):
        t0 = time.perf_counter()
        x = x8.float().div_(255)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return times


MODELS = {
    # name: (module, input shape, learning rate of the .cnn's train block)
    "simplecnn": (SimpleCNN, (3, 128, 128), 0.01),
    "mnist": (MNISTNet, (1, 28, 28), 0.05),
}


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    cls, shape, lr = MODELS[args.model]
    times = step_times(cls(), shape, args.batch, lr, args.steps)
    t = statistics.median(times)
    print(json.dumps({"torch": torch.__version__, "threads": torch.get_num_threads(), "model": args.model,
                      "batch": args.batch, "steps": args.steps, "step_times_s": times, "step_s": t,
                      "images_per_s": args.batch / t}))


def data(args):
    import torchvision
    from torchvision import transforms
    torch.set_num_threads(1)
    tf = transforms.Compose([transforms.Resize((128, 128)), transforms.ToTensor()])
    ds = torchvision.datasets.ImageFolder(args.root, transform=tf)
    loader = torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=args.workers)
    t0 = time.perf_counter()
    n = 0
    for x, _ in loader:
        n += x.shape[0]
    dt = time.perf_counter() - t0
    print(json.dumps({"torch": torch.__version__, "workers": args.workers, "images": n, "seconds": dt, "images_per_s": n / dt}))


def epoch(args):
    """One epoch of SimpleCNN at batch 32 on an ImageFolder (decode, resize
    to 128x128, train), then the test pass over the same folder: the seconds
    of both, as cnnc's trainer does with --data ROOT --test ROOT --epochs 1."""
    import torchvision
    from torchvision import transforms
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    tf = transforms.Compose([transforms.Resize((128, 128)), transforms.ToTensor()])
    t0 = time.perf_counter()
    ds = torchvision.datasets.ImageFolder(args.root, transform=tf)
    model = SimpleCNN()
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    model.train()
    for x, y in torch.utils.data.DataLoader(ds, batch_size=32, shuffle=True, num_workers=args.workers):
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    correct = 0
    with torch.no_grad():
        for x, y in torch.utils.data.DataLoader(ds, batch_size=32, num_workers=args.workers):
            correct += int((model(x).argmax(1) == y).sum())
    dt = time.perf_counter() - t0
    print(json.dumps({"torch": torch.__version__, "threads": args.threads, "workers": args.workers, "images": len(ds),
                      "seconds": dt, "test_accuracy": correct / len(ds)}))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("train")
    t.add_argument("--model", choices=sorted(MODELS), required=True)
    t.add_argument("--batch", type=int, default=32)
    t.add_argument("--threads", type=int, default=2)
    t.add_argument("--steps", type=int, default=10, help="timed steps after 3 of warm-up; the median is printed")
    d = sub.add_parser("data")
    d.add_argument("root")
    d.add_argument("--workers", type=int, default=2)
    e = sub.add_parser("epoch")
    e.add_argument("root")
    e.add_argument("--threads", type=int, default=2)
    e.add_argument("--workers", type=int, default=2)
    args = ap.parse_args()
    {"train": train, "data": data, "epoch": epoch}[args.cmd](args)


if __name__ == "__main__":
    main()
