#!/usr/bin/python3
"""The ONNX and PyTorch side of cnnc's ONNX export test (export/onnx,
TestExportPassesONNXChecker): checks an exported model with ONNX's own
checker, and its initializers against the checkpoint it came from.

Usage: onnx_check.py MODEL.onnx CHECKPOINT [TORCH_MODEL]
  - onnx.checker.check_model(full_check=True): the protobuf, the opset's
    operator schemas, and ONNX's shape inference against the value_info;
  - every initializer equals the checkpoint's tensor of that name byte for
    byte (dtype, shape, float32 bits), and every parameter and buffer of
    the checkpoint (all but "optimizer.*", and batch norm's
    num_batches_tracked, which inference does not read) is an initializer;
  - with PyTorch importable: the same comparison as torch tensors
    (torch.equal), and with TORCH_MODEL (mnist or simplecnn) the
    initializers load into the PyTorch model of the same layers with
    load_state_dict(strict=True) — their names are the state_dict's.
Prints one JSON object; exits 1 on any failure.
"""
import json
import os
import sys

import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "bench")]
from compare_safetensors import read  # noqa: E402


def main():
    path, ck = sys.argv[1], sys.argv[2]
    torch_model = sys.argv[3] if len(sys.argv) > 3 else ""
    m = onnx.load(path)
    onnx.checker.check_model(m, full_check=True)
    tensors, meta = read(ck)
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    errors = []
    for name, arr in inits.items():
        if name not in tensors:
            errors.append(f"initializer {name} is not in the checkpoint")
            continue
        e, data = tensors[name]
        if e["dtype"] != "F32" or list(arr.shape) != e["shape"] or str(arr.dtype) != "float32" or arr.tobytes() != data:
            errors.append(f"initializer {name} ({arr.dtype}{list(arr.shape)}) differs from the checkpoint's ({e['dtype']}{e['shape']})")
    params = [n for n in tensors if not n.startswith("optimizer.") and not n.endswith(".num_batches_tracked")]
    errors += [f"checkpoint parameter {n} is not an initializer" for n in params if n not in inits]
    out = {
        "ir_version": m.ir_version,
        "opsets": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "inputs": [io_desc(v) for v in m.graph.input],
        "outputs": [io_desc(v) for v in m.graph.output],
        "initializers": list(inits),
        "ops": [n.op_type for n in m.graph.node],
        "torch": None,
    }
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None:
        import numpy as np
        for name, arr in inits.items():
            if name in tensors:
                want = torch.from_numpy(np.frombuffer(tensors[name][1], dtype="<f4").copy()).reshape(tensors[name][0]["shape"])
                if not torch.equal(torch.from_numpy(arr.copy()), want):
                    errors.append(f"torch: initializer {name} differs from the checkpoint's tensor")
        out["torch"] = {"version": torch.__version__, "compared": len(inits)}
        if torch_model:
            from torch_train import MNISTNet, SimpleCNN
            net = {"mnist": MNISTNet, "simplecnn": SimpleCNN}[torch_model]()
            net.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in inits.items()}, strict=True)
            out["torch"]["loaded_strict"] = torch_model
    out["errors"] = errors
    print(json.dumps(out))
    sys.exit(1 if errors else 0)


def io_desc(v):
    t = v.type.tensor_type
    return {
        "name": v.name,
        "elem_type": onnx.TensorProto.DataType.Name(t.elem_type),
        "dims": [d.dim_param if d.dim_param else d.dim_value for d in t.shape.dim],
    }


if __name__ == "__main__":
    main()
