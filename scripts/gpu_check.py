#!/usr/bin/env python3
"""One command that validates and times cnnc on a GPU machine, in order:

1. kernel tests: every generated kernel family on the GPU against the CPU
   emulator and the float64 reference (bin/cuda.test, go test -tags cuda);
2. trainer parity: 20 steps of examples/mnist.cnn on the GPU from the same
   init and batches as the CPU run made when the bundle was built; then
   `make demo`'s job on the GPU: one epoch of the real MNIST, test accuracy
   and wall time;
3. step time (warm-up, median of many steps) of examples/simplecnn.cnn at
   B=32 and B=256 and of examples/mnist.cnn, against PyTorch eager and
   torch.compile (max-autotune, reduce-overhead), same model, batch and
   precision, on the same GPU, in this same call;
4. peak memory: cnnc's arena against torch.cuda.max_memory_allocated;
5. per-kernel achieved GB/s and GFLOP/s against the roofline (--profile);
   and the performance model's calibration: its predicted time per kernel
   and per step (`cnnc plan --gpu`, made when the bundle was built, in
   predicted/) beside the measured ones, written to OUT/calibration.json;
6. compute-sanitizer memcheck over a few trainer steps;
7. the 1-rank NCCL job (issue 15): trainers built with `cnnc build --gpus 1
   --data-parallel` (SimpleCNN B=32, MNIST B=64) run against the machine's
   real libnccl.so.2 — $CNNC_NCCL_LIBRARY, else the one PyTorch's wheels
   bring (nvidia.nccl's lib/ or torch's lib/), else the loader's (ldconfig);
   none: "skipped: no libnccl", not a failure. Their steady-state step
   (bench, as step 3) beside the plain trainer's at the same batch, kernel
   by kernel (a rank runs no CUDA graph): what the data-parallel step adds
   (split updates, the buckets' all-reduces on a second stream, the waits
   for them), in µs/step and %, beside the performance model's all-reduce
   prediction where `cnnc plan --gpu --gpus 1` gives one; and 20 MNIST steps
   of the NCCL trainer against the plain one's (step 2's data and seed): the same bits
   are expected, an all-reduce over one rank being the identity and a split
   update reading the gradient the fused one held. Written to
   OUT/nccl.json.

It prints one short table last and writes the whole log to OUT/gpu-check.log
(OUT: $OUT, else ./out). Two modes test the script on a machine without a
GPU (GPU-only steps are skipped): `--cpu` runs the trainer steps on the CPU
emulator; `--fake DIR` runs the bundle's CUDA binaries themselves under
cnnc's fake libcuda in DIR (internal/fakecuda; `make gpu-bundle-fake`),
which executes their kernels on the emulator. Every step has a time limit; the whole run is sized for about
8 minutes on an H200.
"""
import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOFLINE = {"H200": "4800,67000", "H100": "3350,67000", "A100": "2039,19500"}


class Run:
    def __init__(self, out, dev, env=None):
        self.out, self.dev, self.env = out, dev, env or {}
        os.makedirs(out, exist_ok=True)
        self.log = open(os.path.join(out, "gpu-check.log"), "w")
        self.rows = []

    def sh(self, name, cmd, timeout, env=None):
        """Runs cmd, logs everything, returns (exit code, output)."""
        self.log.write(f"\n===== {name}: {' '.join(cmd)}\n")
        self.log.flush()
        print(f"== {name}", flush=True)
        t0 = time.time()
        try:
            p = subprocess.run(cmd, cwd=HERE, capture_output=True, text=True, timeout=timeout,
                               env=dict(os.environ, **self.env, **(env or {})))
            code, out = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired as e:
            code, out = 124, (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            out += f"\n(timed out after {timeout} s)"
        except FileNotFoundError as e:
            code, out = 127, str(e)
        self.log.write(out)
        self.log.write(f"\n(exit {code}, {time.time() - t0:.1f} s)\n")
        self.log.flush()
        return code, out

    def row(self, what, result):
        self.rows.append((what, result))
        print(f"   {what}: {result}", flush=True)


def unpack(run):
    """The bundle's binaries travel gzipped (the transfer limit): unpack them once."""
    import gzip
    bindir = os.path.join(HERE, "bin")
    for name in sorted(os.listdir(bindir)):
        if name.endswith(".gz"):
            target = os.path.join(bindir, name[:-3])
            with gzip.open(os.path.join(bindir, name)) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst)
            os.chmod(target, 0o755)
            os.remove(os.path.join(bindir, name))
            run.log.write(f"unpacked {target}\n")


def bench(run, binary, steps, extra=(), env=None):
    code, out = run.sh(f"bench {binary}", [f"bin/{binary}", "--bench", str(steps), "--device", run.dev, *extra], 240, env)
    m = re.search(r"median step ([\d.]+) ms .* ([\d]+) images/s, arena (\d+) bytes", out)
    if code != 0 or not m:
        return None, None, out
    return float(m.group(1)), int(m.group(3)), out


# GPU names as nvidia-smi reports them -> the performance model's names
MODEL_GPUS = [("H200", "h200"), ("H100", "h100"), ("A100", "a100"), ("L4", "l4"), ("4090", "rtx4090")]


def model_gpu(gpu_name):
    """The performance model's name for the GPU here (h200 off a GPU: the
    fake and the emulator have no model of their own)."""
    return next((m for key, m in MODEL_GPUS if key in gpu_name), "h200")


def parse_profile(out):
    """Per-kernel measured milliseconds (total over the step's calls) from a
    trainer's --profile table."""
    measured, inside = {}, False
    for line in out.splitlines():
        if line.startswith("kernel ") and "total ms" in line:
            inside = True
            continue
        fields = line.split()
        if not inside or len(fields) < 4:
            inside = inside and bool(fields)
            continue
        try:
            measured[fields[0]] = float(fields[2])
        except ValueError:
            inside = False
    return measured


def calibration(predicted, measured_ms, step_ms):
    """Rows of (kernel, predicted µs, measured µs, measured/predicted) for
    every kernel of the prediction, summed over its launches, then the
    step's; measured is None where the profile has no such kernel."""
    per_kernel = {}
    for launch in predicted["launches"]:
        per_kernel[launch["kernel"]] = per_kernel.get(launch["kernel"], 0.0) + 1e6 * launch["predicted_seconds"]
    rows = []
    for kernel, pred in sorted(per_kernel.items(), key=lambda kv: -kv[1]):
        meas = measured_ms.get(kernel)
        rows.append((kernel, pred, None if meas is None else 1e3 * meas, None if meas is None else 1e3 * meas / pred))
    pred_step = 1e6 * predicted["predicted_step_seconds"]
    rows.append(("(step)", pred_step, None if step_ms is None else 1e3 * step_ms, None if step_ms is None else 1e3 * step_ms / pred_step))
    return rows


def calibrate(run, name, binary, gpu, steps_ms):
    """Profiles binary's step and sets it beside the model's prediction."""
    path = os.path.join(HERE, "predicted", f"{name}.{gpu}.json")
    if not os.path.exists(path):
        run.row(f"model calibration {name}", f"no prediction for {gpu} in the bundle (CNNC_BUNDLE_GPUS)")
        return None
    with open(path) as f:
        predicted = json.load(f)
    code, out = run.sh(f"profile {binary}", [f"bin/{binary}", "--bench", "3", "--profile", "1", "--device", run.dev], 240)
    if code != 0:
        run.row(f"model calibration {name}", f"FAIL (exit {code})")
        return None
    rows = calibration(predicted, parse_profile(out), steps_ms)
    run.log.write(f"\nmodel calibration {name} on {gpu} (predicted vs measured µs):\n")
    for kernel, pred, meas, ratio in rows:
        run.log.write(f"  {kernel:90s} {pred:10.1f} {'-' if meas is None else f'{meas:10.1f}'} {'-' if ratio is None else f'{ratio:6.2f}x'}\n")
    step = rows[-1]
    matched = [r for r in rows[:-1] if r[3] is not None]
    worst = max(matched, key=lambda r: abs(r[3] - 1) if r[3] > 0 else 0, default=None)
    run.row(f"model calibration {name}", f"step predicted {step[1]:.1f} µs, measured {'-' if step[2] is None else f'{step[2]:.1f}'} µs"
            + (f" ({step[3]:.2f}x)" if step[3] else "") + f"; {len(matched)}/{len(rows) - 1} kernels matched"
            + (f", furthest {worst[0]} {worst[3]:.2f}x" if worst else ""))
    return {"model": name, "gpu": gpu, "rows": [dict(zip(("kernel", "predicted_us", "measured_us", "ratio"), r)) for r in rows]}


def find_nccl():
    """The libnccl.so.2 to run the NCCL trainers against, and where it was
    found; (None, why) when the machine has none. No network: only what is
    installed — $CNNC_NCCL_LIBRARY, PyTorch's pip wheels (nvidia-nccl-cu*'s
    nvidia/nccl/lib, or torch/lib), the dynamic loader's cache."""
    import glob
    import importlib.util
    env = os.environ.get("CNNC_NCCL_LIBRARY")
    if env:
        return (env, "$CNNC_NCCL_LIBRARY") if os.path.exists(env) else (None, f"$CNNC_NCCL_LIBRARY={env} does not exist")
    candidates = []
    for mod, sub in (("nvidia.nccl", "lib"), ("torch", "lib")):
        try:
            spec = importlib.util.find_spec(mod)
        except (ImportError, ValueError):
            spec = None
        for d in (spec.submodule_search_locations or []) if spec else []:
            candidates += [(p, f"{mod} ({d})") for p in sorted(glob.glob(os.path.join(d, sub, "libnccl.so*")))]
    for d in sys.path:  # nvidia-nccl-cu* without an importable nvidia package
        candidates += [(p, "site-packages") for p in sorted(glob.glob(os.path.join(d, "nvidia", "nccl", "lib", "libnccl.so*")))]
    try:
        cache = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        cache = ""
    candidates += [(m.group(1), "ldconfig") for m in re.finditer(r"libnccl\.so\.2 \(.*?\) => (\S+)", cache)]
    for path, where in candidates:
        if os.path.exists(path):
            return os.path.realpath(path), where
    return None, "no libnccl.so.2 in $CNNC_NCCL_LIBRARY, PyTorch's wheels (nvidia.nccl, torch/lib) or the loader's cache"


def same_bits(want_path, got_path):
    """Compares two checkpoints tensor by tensor: (tensors, differing names,
    the worst difference relative to its tensor's largest magnitude)."""
    import struct
    sys.path.insert(0, HERE)
    from cnnc_checkpoint import read
    want, got = read(want_path)[0], read(got_path)[0]
    differ, worst = [], 0.0
    for name, (_, w) in want.items():
        g = got.get(name, (None, None))[1]
        if g == w:
            continue
        differ.append(name)
        if g is None or len(g) != len(w):
            worst = float("inf")
            continue
        wf, gf = struct.unpack(f"<{len(w) // 4}f", w), struct.unpack(f"<{len(g) // 4}f", g)
        scale = max(max(abs(x) for x in wf), 1e-30)
        worst = max(worst, max(abs(x - y) for x, y in zip(wf, gf)) / scale)
    return len(want), differ, worst


def predicted_all_reduce(gpu):
    """The performance model's all-reduce cost for one rank at SimpleCNN
    B=32, where the bundle's `cnnc plan --gpu --gpus 1 --json` has one: the
    exposed (not hidden by the backward pass) and total seconds; None when
    the model predicts none for one rank."""
    path = os.path.join(HERE, "predicted", f"simplecnn-b32.{gpu}.json")
    if not os.path.exists(path):
        return None
    with open(path) as f:
        data = json.load(f)
    found = {}

    def walk(v):
        if isinstance(v, dict):
            for k, x in v.items():
                if k in ("exposed_all_reduce_seconds", "all_reduce_seconds") and isinstance(x, (int, float)):
                    found.setdefault(k, x)
                walk(x)
        elif isinstance(v, list):
            for x in v:
                walk(x)
    walk(data)
    return found or None


def nccl_job(run, args, gpu, fake, gpu_name):
    """Step 7: the 1-rank NCCL trainers against the real libnccl (the fake
    one under --fake): what the data-parallel step adds to the plain one's,
    and whether 20 MNIST steps give the plain trainer's bits."""
    result = {"device": gpu_name, "note": "adds: the 1-rank data-parallel step (split updates, the buckets' all-reduces on a second stream, "
              "the waits for them) less the plain step, both kernel by kernel" + (" (not a GPU: the emulator's times, the fake libnccl)" if fake else "")}
    if not gpu:
        run.row("nccl: 1-rank job", "skipped: the CPU target's all-reduce sums host memory, which only the fake libnccl can (use --fake)")
        return
    pairs = [("simplecnn B=32", "simplecnn-b32-cuda", "simplecnn-b32-nccl-cuda", 100), ("mnist B=64", "mnist-cuda", "mnist-nccl-cuda", 100)]
    if not all(os.path.exists(os.path.join(HERE, "bin", b)) for _, _, b, _ in pairs):
        run.row("nccl: 1-rank job", "FAIL: the bundle has no NCCL trainers (make-gpu-bundle.sh builds them)")
        return
    if fake:
        lib, where = os.path.join(os.path.abspath(args.fake), "libnccl.so.2"), "the fake libnccl (--fake)"
        if not os.path.exists(lib):
            lib = None
    else:
        lib, where = find_nccl()
    result["library"], result["found_in"] = lib, where
    if lib is None:
        run.row("nccl: 1-rank job", f"skipped: no libnccl ({where})")
        result["skipped"] = "no libnccl"
        write_json(args.out, "nccl.json", result)
        return
    run.row("nccl: library", f"{lib} ({where})")
    env = {"CNNC_NCCL_LIBRARY": lib}
    result["timing"] = []
    for name, plain, dp, steps in pairs:
        if fake:
            steps = 3  # the emulator: check that it runs, not how fast
        # back to back, the same steps, the same bench; the plain trainer
        # kernel by kernel, as a rank runs (no CUDA graph)
        plain_ms, plain_arena, _ = bench(run, plain, steps, ("--cuda-graph=false",))
        graph_ms, _, _ = bench(run, plain, steps)
        dp_ms, arena, out = bench(run, dp, steps, env=env)
        row = {"model": name, "steps": steps, "plain_kernel_by_kernel_ms": plain_ms, "plain_cuda_graph_ms": graph_ms,
               "nccl_1rank_ms": dp_ms, "plain_arena_bytes": plain_arena, "nccl_arena_bytes": arena}
        if dp_ms is None or plain_ms is None:
            run.row(f"nccl {name}: 1 rank vs plain", f"FAIL (nccl {dp_ms}, plain {plain_ms} ms/step)")
        else:
            row["adds_us"] = 1e3 * (dp_ms - plain_ms)
            row["adds_percent"] = 100 * (dp_ms - plain_ms) / plain_ms
            run.row(f"nccl {name}: 1 rank vs plain", f"{dp_ms:.3f} vs {plain_ms:.3f} ms/step kernel by kernel: the data-parallel step adds "
                    f"{row['adds_us']:.1f} µs/step ({row['adds_percent']:+.1f}%)"
                    + (f"; plain with its CUDA graph {graph_ms:.3f} ms/step" if graph_ms else ""))
        result["timing"].append(row)
    mgpu = model_gpu(gpu_name)
    pred = predicted_all_reduce(mgpu)
    result["predicted"] = pred
    if pred:
        run.row("nccl simplecnn B=32: model's all-reduce for 1 rank (prediction)",
                ", ".join(f"{k.replace('_seconds', '')} {1e6 * v:.1f} µs" for k, v in sorted(pred.items())))
    else:
        run.row("nccl simplecnn B=32: model's all-reduce for 1 rank", f"no prediction in the bundle (`cnnc plan --gpu {mgpu} --gpus 1 --json` gives none)")
    # the same 20 steps as step 2: the plain trainer's bits expected
    cks = {}
    for binary in ("mnist-cuda", "mnist-nccl-cuda"):
        ck = os.path.join(args.out, f"{binary}-20.safetensors")
        code, out = run.sh(f"nccl parity {binary}", [f"bin/{binary}", "--device", "cuda", "--data", "data/mnist-small", "--test", "",
                                                     "--no-shuffle", "--seed", "1", "--max-steps", "20", "--checkpoint", ck, "--quiet"], 180, env)
        cks[binary] = ck if code == 0 else None
        if code != 0:
            run.row(f"nccl parity: {binary} 20 steps", f"FAIL (exit {code})")
    if all(cks.values()):
        n, differ, worst = same_bits(cks["mnist-cuda"], cks["mnist-nccl-cuda"])
        result["parity"] = {"tensors": n, "differing": differ, "worst_relative_difference": worst}
        if not differ:
            run.row("nccl parity: 20 mnist steps, 1 rank vs plain", f"the same bits in all {n} tensors")
        else:
            # not the identity: say where; a failure only past the fp32
            # drift step 2 allows between devices (compare_safetensors.py)
            verdict = "FAIL" if worst >= 1e-3 else "not the same bits, within fp32 drift"
            run.row("nccl parity: 20 mnist steps, 1 rank vs plain",
                    f"{verdict}: {len(differ)}/{n} tensors differ (worst relative {worst:.2e}: {', '.join(differ[:3])})")
    write_json(args.out, "nccl.json", result)


def write_json(out, name, value):
    with open(os.path.join(out, name), "w") as f:
        json.dump(value, f, indent=1)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cpu", action="store_true", help="run trainers on the CPU emulator (no GPU needed)")
    ap.add_argument("--fake", metavar="DIR", help="run the CUDA binaries under the fake libcuda in DIR (no GPU needed)")
    ap.add_argument("--out", default=os.environ.get("OUT") or os.path.join(os.getcwd(), "out"))
    ap.add_argument("--skip", nargs="*", default=[], help="steps to skip: kernels parity epoch timing torch profile calibrate memcheck nccl")
    args = ap.parse_args()
    args.out = os.path.abspath(args.out)  # the steps run in the bundle's folder
    gpu = not args.cpu
    fake = bool(args.fake)
    if fake:
        d = os.path.abspath(args.fake)
        env = {"CNNC_FAKECUDA": d, "LD_LIBRARY_PATH": d + (":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")}
        # like the GPU machine: no Go (the bundle must not need it)
        env["PATH"] = os.pathsep.join(p for p in os.environ.get("PATH", "").split(os.pathsep)
                                      if p and not os.path.exists(os.path.join(p, "go")))
    elif gpu and shutil.which("nvidia-smi") is None:
        sys.exit("gpu_check: no nvidia-smi here: run it on the GPU machine, or pass --cpu or --fake DIR")
    run = Run(args.out, "cuda" if gpu else "cpu", env if fake else None)
    unpack(run)
    gpu_name = "cpu (emulator)"
    if fake:
        gpu_name = "fake libcuda (CPU emulator)"
    elif gpu:
        _, out = run.sh("nvidia-smi", ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"], 30)
        gpu_name = out.strip().splitlines()[0] if out.strip() else "?"
    run.row("device", gpu_name)

    # 1. kernels on the GPU against the emulator and the reference
    if gpu and "kernels" not in args.skip:
        # the fake driver's own tests (driver calls per step, late graph runs)
        # are make test-fakecuda's; on a GPU they skip themselves
        skip = ["-test.skip", "^(TestDriverCallsPerStep|TestFakeDriverRunsGraphsWhenWaitedFor)$"] if fake else []
        code, out = run.sh("kernel tests", ["bin/cuda.test", "-test.v", "-test.timeout", "200s", *skip], 240, {"CNNC_REQUIRE_NVCC": "1"})
        passed, failed = out.count("--- PASS"), out.count("--- FAIL")
        run.row("kernel tests (GPU vs emulator/reference)", f"{'PASS' if code == 0 else 'FAIL'}: {passed} passed, {failed} failed")

    # 2. parity with the CPU run made at bundle time
    if "parity" not in args.skip:
        ck = os.path.join(args.out, f"mnist-{run.dev}.safetensors")
        code, out = run.sh("parity run", ["bin/mnist-cuda" if gpu else "bin/mnist-cpu", "--device", run.dev, "--data", "data/mnist-small",
                                          "--test", "", "--no-shuffle", "--seed", "1", "--max-steps", "20", "--checkpoint", ck, "--quiet"], 180)
        if code == 0:
            code2, out2 = run.sh("parity compare", [sys.executable, "compare_safetensors.py", "expected/mnist-cpu.safetensors", ck], 60)
            run.row("parity: 20 mnist steps vs CPU backend", out2.strip().splitlines()[-1] if out2.strip() else f"exit {code2}")
        else:
            run.row("parity: 20 mnist steps vs CPU backend", f"FAIL (exit {code})")

    # 2b. the demo on the device: one epoch of the real MNIST, test accuracy
    #     and wall time (the fake and the CPU emulator take about a minute)
    if "epoch" not in args.skip and os.path.isdir(os.path.join(HERE, "data", "mnist")):
        binary = "bin/mnist-cuda" if gpu else "bin/mnist-cpu"
        t0 = time.time()
        code, out = run.sh("mnist epoch", [binary, "--device", run.dev, "--data", "data/mnist", "--test", "data/mnist",
                                           "--epochs", "1", "--quiet"], 300)
        wall = time.time() - t0
        m = re.search(r"test accuracy ([\d.]+)%", out)
        if code == 0 and m:
            run.row("mnist: one epoch (60,000 images, B=64) then the test set",
                    f"test accuracy {m.group(1)}%, {wall:.1f} s wall (data loading and start-up included)")
        else:
            run.row("mnist: one epoch", f"FAIL (exit {code})")

    # 3 + 4. step time and memory against PyTorch
    cnnc = {}
    if "timing" not in args.skip:
        for name, binary, steps in [("simplecnn B=32", "simplecnn-b32", 100), ("simplecnn B=256", "simplecnn-b256", 30), ("mnist B=64", "mnist", 100)]:
            b = binary + ("-cuda" if gpu else "-cpu")
            if not os.path.exists(os.path.join(HERE, "bin", b)) or (fake and "b256" in b):
                continue
            if not gpu or fake:
                steps = 3  # the emulator: check that it runs, not how fast
            # the default: the step replayed as one CUDA graph
            ms, arena, out = bench(run, b, steps)
            cnnc[name] = (ms, arena)
            run.row(f"cnnc {name}", f"{ms:.3f} ms/step, arena {arena / 1e6:.2f} MB" if ms else "FAIL")
            # the host loop: steps submitted without waiting, two queued
            pm = re.search(r"bench: pipelined .*: ([\d.]+) ms per step", out)
            run.row(f"cnnc {name}, pipelined", f"{float(pm.group(1)):.3f} ms/step" if pm else "FAIL")
            if gpu:
                # the same step launched kernel by kernel
                pms, _, _ = bench(run, b, steps, ("--cuda-graph=false",))
                if pms:
                    cnnc[name + " no graph"] = (pms, arena)
                run.row(f"cnnc {name}, kernel by kernel (--cuda-graph=false)", f"{pms:.3f} ms/step" if pms else "FAIL")
    torch_rows = {}
    if gpu and not fake and "torch" not in args.skip:
        code, out = run.sh("pytorch", [sys.executable, "torch_gpu.py", "--batch", "32", "256", "--steps", "50"], 420)
        for line in out.splitlines():
            try:
                r = json.loads(line)
            except ValueError:
                continue
            torch_rows[(r["batch"], r["mode"])] = r
        for batch in (32, 256):
            mine = cnnc.get(f"simplecnn B={batch}", (None, None))
            for mode in ("eager", "max-autotune", "reduce-overhead"):
                r = torch_rows.get((batch, mode))
                if not r or "step_ms" not in r:
                    run.row(f"torch {mode} B={batch}", (r or {}).get("error", "no result"))
                    continue
                speed = f", cnnc is {r['step_ms'] / mine[0]:.2f}x faster" if mine[0] else ""
                run.row(f"torch {mode} B={batch}", f"{r['step_ms']:.3f} ms/step{speed}")
                if mode == "eager" and mine[1]:
                    run.row(f"memory B={batch}", f"cnnc arena {mine[1] / 1e6:.1f} MB vs torch max_memory_allocated {r['max_memory_allocated'] / 1e6:.1f} MB "
                                                 f"({100 * mine[1] / r['max_memory_allocated']:.1f}%)")

    # 5. per-kernel roofline
    if "profile" not in args.skip:
        roof = next((v for k, v in ROOFLINE.items() if k in gpu_name), "4800,67000")
        b = "simplecnn-b32" + ("-cuda" if gpu else "-cpu")
        code, out = run.sh("profile", [f"bin/{b}", "--bench", "3", "--profile", "1", "--roofline", roof, "--device", run.dev], 240)
        lines = [l for l in out.splitlines() if "%" in l and not l.startswith("kernel")]
        run.row("profile (top kernel)", lines[0].split()[0] + " " + lines[0].split()[-1] if lines else f"exit {code}")

    # 5b. the performance model against the measurement, kernel by kernel
    if "calibrate" not in args.skip:
        mgpu = model_gpu(gpu_name)
        table = []
        for name, binary in [("simplecnn-b32", "simplecnn-b32"), ("simplecnn-b256", "simplecnn-b256"), ("mnist", "mnist")]:
            b = binary + ("-cuda" if gpu else "-cpu")
            if not os.path.exists(os.path.join(HERE, "bin", b)) or (fake and "b256" in b):
                continue
            label = {"simplecnn-b32": "simplecnn B=32", "simplecnn-b256": "simplecnn B=256", "mnist": "mnist B=64"}[name]
            r = calibrate(run, name, b, mgpu, cnnc.get(label, (None, None))[0])
            if r:
                table.append(r)
        with open(os.path.join(args.out, "calibration.json"), "w") as f:
            json.dump({"device": gpu_name, "note": "predicted: cnnc's performance model; measured: this run"
                       + ("" if gpu and not fake else " (not a GPU: the emulator's times)"), "models": table}, f, indent=1)

    # 6. compute-sanitizer
    if gpu and not fake and "memcheck" not in args.skip:
        if shutil.which("compute-sanitizer"):
            code, out = run.sh("memcheck", ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "9", "bin/mnist-cuda", "--bench", "2", "--device", "cuda"], 300)
            m = re.search(r"ERROR SUMMARY: (\d+) error", out)
            run.row("compute-sanitizer memcheck (5 steps)", f"{m.group(1) if m else '?'} errors (exit {code})")
        else:
            run.row("compute-sanitizer memcheck", "not installed")

    # 7. the 1-rank NCCL job against the real library
    if "nccl" not in args.skip:
        nccl_job(run, args, gpu, fake, gpu_name)

    print("\n| check | result |\n|---|---|")
    for what, result in run.rows:
        print(f"| {what} | {result} |")
    print(f"\nfull log: {os.path.join(args.out, 'gpu-check.log')}")
    failed = [what for what, result in run.rows if "FAIL" in result or "exit " in result]
    if failed:
        print(f"FAILED: {', '.join(failed)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
