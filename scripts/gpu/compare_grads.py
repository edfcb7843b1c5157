#!/usr/bin/env python3
"""Gradients of the same batch from two runs of `streambp-server grad --out F.safetensors`,
compared in float64: prints one JSON line per file with the global relative error
||other - ref|| / ||ref|| over every tensor, the worst tensor's, and whether it is within
the tolerance. usage: compare_grads.py LABEL TOL REFERENCE OTHER [OTHER ...]; exit 1 if any
file has a missing or non-finite tensor or exceeds TOL."""
import json
import sys

import torch

try:
    from safetensors.torch import load_file
except ImportError:  # Debian's python3-torch without safetensors (a dry run on the CPU machine)
    import struct

    _DTYPES = {"F64": (torch.float64, 8), "F32": (torch.float32, 4), "BF16": (torch.bfloat16, 2), "F16": (torch.float16, 2)}

    def load_file(path):
        """The safetensors format: an 8-byte little-endian header size, a JSON header, the data."""
        with open(path, "rb") as f:
            blob = f.read()
        (n,) = struct.unpack("<Q", blob[:8])
        header = json.loads(blob[8:8 + n])
        data = bytearray(blob[8 + n:])
        out = {}
        for name, e in header.items():
            if name == "__metadata__":
                continue
            start, end = e["data_offsets"]
            dtype, size = _DTYPES[e["dtype"]]
            t = torch.frombuffer(data, dtype=dtype, offset=start, count=(end - start) // size) \
                if end > start else torch.empty(0, dtype=dtype)
            out[name] = t.reshape(e["shape"]).clone()
        return out


def compare(ref, other):
    num = den = 0.0
    worst, worst_name, problems = 0.0, "", []
    for name, r in ref.items():
        if name not in other:
            problems.append("missing " + name)
            continue
        o = other[name].double()
        if not torch.isfinite(o).all():
            problems.append("non-finite " + name)
        r = r.double()
        d, n = (o - r).norm().item(), r.norm().item()
        num, den = num + d * d, den + n * n
        rel = d / n if n > 0 else d
        if rel > worst:
            worst, worst_name = rel, name
    extra = sorted(set(other) - set(ref))
    if extra:
        problems.append("unexpected " + ", ".join(extra[:3]))
    return (num ** 0.5) / (den ** 0.5 if den > 0 else 1.0), worst, worst_name, problems


def main():
    label, tol, ref_path = sys.argv[1], float(sys.argv[2]), sys.argv[3]
    ref = load_file(ref_path)
    ok_all = True
    for path in sys.argv[4:]:
        other = load_file(path)
        rel, worst, name, problems = compare(ref, other)
        ok = not problems and rel <= tol
        ok_all &= ok
        print(json.dumps({"check": label, "reference": ref_path, "file": path, "tensors": len(ref),
                          "global_rel": rel, "worst_rel": worst, "worst_tensor": name, "tolerance": tol,
                          "problems": problems, "pass": ok}))
    sys.exit(0 if ok_all else 1)


main()
