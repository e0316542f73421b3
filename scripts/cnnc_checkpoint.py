"""Reads cnnc checkpoints (safetensors files) without the safetensors
package, which Debian's python3-torch lacks: the format is an 8-byte
little-endian header length, a JSON header (dtype, shape and byte range of
each tensor, plus "__metadata__"), then the tensors' bytes.

    import sys
    sys.path.insert(0, "scripts")  # cnnc's checkout
    from cnnc_checkpoint import load_file
    tensors = load_file("m.safetensors")  # like safetensors.torch.load_file

read() needs only the standard library (compare_safetensors.py and the GPU
bundle use it); load_file() needs torch.
"""
import json
import struct

# safetensors dtype -> (struct code, torch dtype name)
DTYPES = {"F32": ("f", "float32"), "F64": ("d", "float64"), "I32": ("i", "int32"),
          "I64": ("q", "int64"), "U8": ("B", "uint8")}


def read(path):
    """A safetensors file's tensors as (header entry, bytes) by name, in
    file order, and its metadata (a dict of strings)."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        header = json.loads(f.read(n))
        body = f.read()
    meta = header.pop("__metadata__", None) or {}
    tensors = {}
    for name, e in header.items():
        a, b = e["data_offsets"]
        if not 0 <= a <= b <= len(body):
            raise ValueError(f"{path}: tensor {name}: bytes {a}..{b} are outside the file's {len(body)}")
        tensors[name] = (e, body[a:b])
    return tensors, meta


def load_file(path):
    """The checkpoint's tensors as torch tensors by name, as
    safetensors.torch.load_file gives them (parameters under PyTorch's
    state_dict names, optimizer state under "optimizer.<param>.<state>")."""
    import torch

    out = {}
    for name, (e, data) in read(path)[0].items():
        if e["dtype"] not in DTYPES:
            raise ValueError(f"{path}: tensor {name}: dtype {e['dtype']} is not one cnnc writes")
        dtype = getattr(torch, DTYPES[e["dtype"]][1])
        t = torch.frombuffer(bytearray(data), dtype=dtype) if data else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(e["shape"])
    return out
