#!/usr/bin/env python3
"""The rates the kernels under a Qwen3-8B step reach on this GPU, so the step's model FLOP
utilization can be read against what its parts can do (docs/gpu.md): LibTorch's flash
attention (the kernel the stream engine's fused backend calls) forward and forward+backward,
causal, 32 query heads over 32 (repeated) key heads of 128, and the bf16 GEMMs of the
layer's projections at T rows. usage: kernel_ceiling.py [T] > ceiling.json"""
import json
import sys
import time

import torch
import torch.nn.functional as F

T = int(sys.argv[1]) if len(sys.argv) > 1 else 32768
H, D, d, ff = 32, 128, 4096, 12288
dev, dt = "cuda", torch.bfloat16


def timed(fn, reps=3):
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) / reps


out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "T": T}
q, k, v = (torch.randn(1, H, T, D, device=dev, dtype=dt, requires_grad=True) for _ in range(3))
try:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    ctx = lambda: sdpa_kernel(SDPBackend.FLASH_ATTENTION)
except ImportError:
    ctx = lambda: torch.backends.cuda.sdp_kernel(enable_math=False, enable_mem_efficient=False)
flops_fwd = 2.0 * T * T * D * H  # causal: half of 4·T²·D per head
with ctx():
    fwd = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True))
    g = torch.randn(1, H, T, D, device=dev, dtype=dt)
    both = timed(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(g))
out["attention_forward_tflops"] = flops_fwd / fwd / 1e12
out["attention_forward_backward_tflops"] = 3.5 * flops_fwd / both / 1e12  # backward: 2.5x the forward's FLOPs
out["attention_seconds"] = {"forward": fwd, "forward_backward": both}
del q, k, v, g
x = torch.randn(T, d, device=dev, dtype=dt)
gemms = {"qkv": (d, d + 2 * 1024), "o": (d, d), "gate_up": (d, 2 * ff), "down": (ff, d)}
rates = {}
for name, (n_in, n_out) in gemms.items():
    a = torch.randn(T, n_in, device=dev, dtype=dt)
    w = torch.randn(n_out, n_in, device=dev, dtype=dt)
    s = timed(lambda: a @ w.t(), reps=5)
    rates[name] = 2.0 * T * n_in * n_out / s / 1e12
out["gemm_tflops"] = rates
print(json.dumps(out, indent=1))
