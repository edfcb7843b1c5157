#!/usr/bin/env python3
"""Hand-written eager PyTorch next to `streambp-server grad`: the same model files, the same
sequence, one SFT forward + backward each, in fresh processes.

The baseline is what a careful PyTorch user writes to fit long sequences without StreamBP:
every decoder layer under activation checkpointing, attention over query blocks each
checkpointed on its own (no T x T scores kept), and the lm_head + cross-entropy in checkpointed
chunks. The model is written here from the Hugging Face definitions of Llama/Qwen2/Qwen3
(RMSNorm in float32, rotate-half RoPE, GQA, SwiGLU), not from this project's code, so the
comparison doubles as an independent check of the loss and of every gradient.

    pytorch_baseline.py compare --server BIN [--preset small | --model DIR] --seq-len 8192
        peak RSS (the kernel's, per process) and wall time of both, their ratios, JSON; and
        each step's analytic FLOPs and achieved share of a 2048^3 GEMM measured before and
        after (in its own process, same LibTorch and BLAS): the FLOP ratio is the wall ratio
        the two steps would have if both ran at the same share of the GEMM; with --rounds N,
        N rounds of both processes in alternating order, the ratios the medians over rounds
    pytorch_baseline.py check --server BIN [--preset tiny] --seq-len 40
        float64: loss and every gradient of the baseline vs the server's stream engine
    pytorch_baseline.py step --model DIR --data F.jsonl [--out G.safetensors]
        one step of the baseline alone (what `compare` times)
    pytorch_baseline.py gemm [--threads N]
        GFLOP/s of a 2048^3 float32 matrix product, best of five (what `compare` measures)
    pytorch_baseline.py tiles [--chunk 512 --key-tile 512 --groups 2 --head-dim 64]
        one thread (as each of attention's threads runs its heads): GFLOP/s of one attention
        tile's products at those sizes, of a forward tile with its online softmax and of a
        backward tile with its elementwise steps (and a forward tile given the log-sum-exp),
        against the 2048^3 GEMM on one thread: how
        close attention's work can come to the GEMM reference (docs/results.md)

Needs PyTorch (Debian: python3-torch) and nothing else.
"""
import argparse
import json
import math
import os
import random
import statistics
import struct
import subprocess
import sys
import tempfile
import time

DTYPES = {"F64": "float64", "F32": "float32", "BF16": "bfloat16", "F16": "float16"}

# OpenBLAS kernel sets (openblas_get_corename's names) without AVX2: what OpenBLAS falls back to
# on a CPU model newer than the library (Debian 12's 0.3.21 runs Prescott's on Emerald Rapids).
BEFORE_AVX2 = {"katmai", "coppermine", "northwood", "prescott", "banias", "core2", "penryn", "dunnington",
               "nehalem", "atom", "sandybridge", "athlon", "opteron", "opteron_sse3", "barcelona", "bobcat",
               "bulldozer", "piledriver", "steamroller", "nano"}


def openblas_core():
    """The kernel set of the OpenBLAS this process's torch runs ("" for another BLAS)."""
    import ctypes
    import torch  # noqa: F401  (loads the BLAS)
    with open("/proc/self/maps") as f:
        paths = {line.split()[-1] for line in f if line.split()[-1].startswith("/")}
    for path in sorted(p for p in paths if "blas" in os.path.basename(p)):
        try:
            lib = ctypes.CDLL(path)
            lib.openblas_get_corename.restype = ctypes.c_char_p
            return lib.openblas_get_corename().decode()
        except (OSError, AttributeError):
            continue
    return ""


def use_cpu_blas_kernels():
    """What streambp-server does when it starts (UseCpuBlasKernels, docs/operations.md): where
    OpenBLAS fell back to kernels without AVX2 on a CPU with AVX2 and FMA and OPENBLAS_CORETYPE is
    unset, set it ("SkylakeX" with AVX-512, else "Haswell") and restart this script, so the
    baseline, the GEMM reference and the server (which inherits the variable) all run the same
    kernels. Returns the kernel set in use."""
    core = openblas_core()
    if "OPENBLAS_CORETYPE" in os.environ or core.lower() not in BEFORE_AVX2:
        return core
    with open("/proc/cpuinfo") as f:
        flags = set(next((line for line in f if line.startswith("flags")), "").split())
    if not {"avx2", "fma"} <= flags:
        return core
    avx512 = {"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"} <= flags
    os.environ["OPENBLAS_CORETYPE"] = "SkylakeX" if avx512 else "Haswell"
    os.environ["STREAMBP_OPENBLAS_FALLBACK"] = core
    sys.stdout.flush()
    os.execv(sys.executable, [sys.executable, os.path.abspath(__file__)] + sys.argv[1:])


def read_safetensors(path):
    import torch
    with open(path, "rb") as f:
        raw = f.read()
    n = struct.unpack("<Q", raw[:8])[0]
    header = json.loads(raw[8:8 + n])
    body = memoryview(raw)[8 + n:]
    out = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        lo, hi = info["data_offsets"]
        dtype = getattr(torch, DTYPES[info["dtype"]])
        t = torch.frombuffer(bytearray(body[lo:hi]), dtype=dtype) if hi > lo else torch.empty(0, dtype=dtype)
        out[name] = t.reshape(info["shape"]).clone()
    return out


def write_safetensors(path, tensors):
    header, chunks, offset = {}, [], 0
    names = {"torch.float64": "F64", "torch.float32": "F32"}
    for name, t in sorted(tensors.items()):
        data = t.detach().contiguous().cpu().numpy().tobytes()
        header[name] = {"dtype": names[str(t.dtype)], "shape": list(t.shape), "data_offsets": [offset, offset + len(data)]}
        chunks.append(data)
        offset += len(data)
    head = json.dumps(header).encode()
    head += b" " * (-len(head) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        for c in chunks:
            f.write(c)


class Model:
    """A decoder-only causal LM as Hugging Face's Llama/Qwen2/Qwen3 modeling code defines it."""

    def __init__(self, folder, dtype):
        import torch
        with open(os.path.join(folder, "config.json")) as f:
            c = json.load(f)
        # What this baseline does not write: refused by name rather than computed differently.
        if c.get("rope_scaling"):
            raise SystemExit(f"pytorch_baseline: rope_scaling {c['rope_scaling']} is not written here")
        if c.get("sliding_window") and c.get("use_sliding_window", c.get("model_type") == "mistral"):
            raise SystemExit("pytorch_baseline: sliding windows are not written here")
        if c.get("mlp_bias") or c.get("model_type") == "llama" and c.get("attention_bias"):
            raise SystemExit("pytorch_baseline: o_proj / MLP biases are not written here")
        self.c = c
        self.L, self.d = c["num_hidden_layers"], c["hidden_size"]
        self.H, self.KV = c["num_attention_heads"], c["num_key_value_heads"]
        self.hd = c.get("head_dim") or self.d // self.H
        self.eps = c["rms_norm_eps"]
        self.theta = c.get("rope_theta", 10000.0)
        self.w = {k: v.to(dtype).requires_grad_(True) for k, v in read_safetensors(
            os.path.join(folder, "model.safetensors")).items()}
        if "lm_head.weight" not in self.w:  # tied: the embedding is the head
            self.w["lm_head.weight"] = self.w["model.embed_tokens.weight"]
        self.dtype = dtype
        self.torch = torch

    def rms(self, x, w):
        t = self.torch
        xf = x.to(t.float32) if x.dtype != t.float64 else x
        xf = xf * t.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return w * xf.to(x.dtype)

    def rope(self, T):
        t = self.torch
        inv = 1.0 / (self.theta ** (t.arange(0, self.hd, 2, dtype=t.float64) / self.hd))
        freqs = t.outer(t.arange(T, dtype=t.float64), inv)
        emb = t.cat([freqs, freqs], -1)
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    @staticmethod
    def rotate(x, cos, sin):
        import torch
        half = x.shape[-1] // 2
        return x * cos + torch.cat([-x[..., half:], x[..., :half]], -1) * sin

    def attention_block(self, q, k, v, s):
        """Queries s.. of q against keys 0..s+len(q)-1: causal, float32 softmax as HF's eager attention."""
        t = self.torch
        e = s + q.shape[2]
        scores = t.matmul(q, k[:, :, :e].transpose(-1, -2)) / math.sqrt(self.hd)
        qi = t.arange(s, e).unsqueeze(1)
        kj = t.arange(e).unsqueeze(0)
        scores = scores.masked_fill(kj > qi, float("-inf"))
        p = t.softmax(scores.to(t.float32) if scores.dtype != t.float64 else scores, -1).to(q.dtype)
        return t.matmul(p, v[:, :, :e])

    def layer(self, i, x, cos, sin, block):
        t = self.torch
        from torch.utils.checkpoint import checkpoint
        p = f"model.layers.{i}."
        w = self.w
        B, T, _ = x.shape
        n = self.rms(x, w[p + "input_layernorm.weight"])

        def proj(name, heads):
            y = n @ w[p + f"self_attn.{name}_proj.weight"].t()
            if p + f"self_attn.{name}_proj.bias" in w:
                y = y + w[p + f"self_attn.{name}_proj.bias"]
            return y.view(B, T, heads, self.hd)
        q, k, v = proj("q", self.H), proj("k", self.KV), proj("v", self.KV)
        if p + "self_attn.q_norm.weight" in w:
            q = self.rms(q, w[p + "self_attn.q_norm.weight"])
            k = self.rms(k, w[p + "self_attn.k_norm.weight"])
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        q, k = self.rotate(q, cos, sin), self.rotate(k, cos, sin)
        groups = self.H // self.KV
        k = k.repeat_interleave(groups, dim=1)
        v = v.repeat_interleave(groups, dim=1)
        out = t.cat([checkpoint(self.attention_block, q[:, :, s:s + block], k, v, s, use_reentrant=False)
                     for s in range(0, T, block)], 2)
        out = out.transpose(1, 2).reshape(B, T, self.H * self.hd) @ w[p + "self_attn.o_proj.weight"].t()
        h = x + out
        m = self.rms(h, w[p + "post_attention_layernorm.weight"])
        gate = m @ w[p + "mlp.gate_proj.weight"].t()
        up = m @ w[p + "mlp.up_proj.weight"].t()
        return h + (t.nn.functional.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].t()

    def head_loss(self, h, targets):
        t = self.torch
        logits = self.rms(h, self.w["model.norm.weight"]) @ self.w["lm_head.weight"].t()
        logits = logits.to(t.float32) if logits.dtype != t.float64 else logits
        return t.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), reduction="sum")

    def sft_step(self, tokens, block, logits_chunk):
        """Mean next-token cross-entropy over the sequence, backward; returns the loss."""
        t = self.torch
        from torch.utils.checkpoint import checkpoint
        ids = t.tensor([tokens])
        T = ids.shape[1]
        cos, sin = self.rope(T)
        x = self.w["model.embed_tokens.weight"][ids]
        for i in range(self.L):
            x = checkpoint(self.layer, i, x, cos, sin, block, use_reentrant=False)
        h, targets = x[:, :-1], ids[:, 1:]
        loss = sum(checkpoint(self.head_loss, h[:, s:s + logits_chunk], targets[:, s:s + logits_chunk],
                              use_reentrant=False) for s in range(0, T - 1, logits_chunk)) / (T - 1)
        loss.backward()
        return float(loss)


def run_step(args):
    import torch
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    with open(args.data) as f:
        tokens = json.loads(f.readline())["tokens"]
    model = Model(args.model, dtype)
    result = {}
    if args.count_flops:
        # The profiler's count of every matrix product the step ran (forward, checkpoint
        # recomputes, backward): what step_flops says the baseline does, counted independently.
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CPU], with_flops=True) as prof:
            loss = model.sft_step(tokens, args.block, args.logits_chunk)
        gemms = ("aten::mm", "aten::bmm", "aten::addmm", "aten::baddbmm")
        result["gemm_flops"] = sum(e.flops for e in prof.events() if e.name in gemms)
        seconds = float("nan")
    else:
        t0 = time.perf_counter()
        loss = model.sft_step(tokens, args.block, args.logits_chunk)
        seconds = time.perf_counter() - t0
    if args.out:
        grads, seen = {}, set()
        for name, p in model.w.items():
            if id(p) in seen or p.grad is None:
                continue
            seen.add(id(p))
            grads[name] = p.grad
        write_safetensors(args.out, grads)
    print(json.dumps({"loss": loss, "step_seconds": seconds, **result}), flush=True)


def run_gemm(args):
    import torch
    torch.set_num_threads(args.threads)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.mm(a, b)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        torch.mm(a, b, out=c)
        best = min(best, time.perf_counter() - t0)
    print(json.dumps({"gflops": 2.0 * n ** 3 / best / 1e9}), flush=True)


def best_seconds(f, repeat):
    for _ in range(3):
        f()
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        f()
        best = min(best, time.perf_counter() - t0)
    return best


def run_tiles(args):
    """One query block x key tile of the tiled attention (the ops of
    core/src/model/tiled_attention.cpp, written here with the same LibTorch calls) on one thread."""
    import torch
    torch.set_num_threads(1)
    torch.manual_seed(0)
    rows, keys, hd = args.chunk * args.groups, args.key_tile, args.head_dim
    q, k, v = torch.randn(1, rows, hd), torch.randn(1, keys, hd), torch.randn(1, keys, hd)
    do, lse, D = torch.randn(1, rows, hd), torch.randn(1, rows, 1), torch.randn(1, rows, 1)
    m_old, l_old, acc = torch.randn(1, rows, 1), torch.rand(1, rows, 1), torch.randn(1, rows, hd)
    n = 2048
    a, b = torch.randn(n, n), torch.randn(n, n)
    c = torch.mm(a, b)
    gemm = 2.0 * n ** 3 / best_seconds(lambda: torch.mm(a, b, out=c), args.repeat) / 1e9
    product = 2.0 * rows * keys * hd  # each of the tile's products

    def products():  # the forward tile's two products alone
        torch.bmm(torch.bmm(q, k.transpose(1, 2)), v)

    def forward():  # scores, online softmax, rescale, P V (a tile after the first)
        s = torch.bmm(q, k.transpose(1, 2))
        m_new = torch.maximum(m_old, s.amax(-1, keepdim=True))
        shift = torch.where(torch.isinf(m_new), torch.zeros_like(m_new), m_new)
        alpha = (m_old - shift).exp_()
        s.sub_(shift).exp_()
        l_old.clone().mul_(alpha).add_(s.sum(-1, keepdim=True))
        acc.clone().mul_(alpha).baddbmm_(s, v)

    def known_lse():  # a forward tile that had the row's log-sum-exp already (not how the code runs)
        acc.clone().baddbmm_(torch.bmm(q, k.transpose(1, 2)).sub_(lse).exp_(), v)

    def backward():  # P from the log-sum-exp, dV, dP, dS, dQ, dK
        p = torch.bmm(q, k.transpose(1, 2)).sub_(lse).exp_()
        dv = torch.bmm(p.transpose(1, 2), do)
        ds = torch.bmm(do, v.transpose(1, 2)).sub_(D).mul_(p)
        torch.bmm(ds, k)
        torch.bmm(ds.transpose(1, 2), q)
        return dv

    out = {"threads": 1, "rows": rows, "keys": keys, "head_dim": hd, "gemm_gflops": gemm}
    for name, f, count in (("products", products, 2), ("forward", forward, 2), ("known_lse", known_lse, 2),
                             ("backward", backward, 5)):
        gflops = count * product / best_seconds(f, args.repeat) / 1e9
        out[name] = {"gflops": gflops, "of_gemm": gflops / gemm}
    print(f"one thread: 2048^3 GEMM {gemm:.1f} GFLOP/s; a {rows} x {keys} tile over head_dim {hd}: products "
          f"{out['products']['gflops']:.1f} ({out['products']['of_gemm']:.0%}), forward with the online softmax "
          f"{out['forward']['gflops']:.1f} ({out['forward']['of_gemm']:.0%}), the same with the log-sum-exp known "
          f"{out['known_lse']['gflops']:.1f} ({out['known_lse']['of_gemm']:.0%}), backward "
          f"{out['backward']['gflops']:.1f} ({out['backward']['of_gemm']:.0%})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


def chunked_pairs(T, block):
    """(query, key) pairs that causal query blocks of `block` visit: each block's queries
    against every key up to its last position (the diagonal block whole, masked)."""
    return sum((min(T, s + block) - s) * min(T, s + block) for s in range(0, T, block))


def tiled_pairs(T, chunk, key_tile, pieces=True):
    """(query, key) pairs the stream engine's tiled attention visits over one sequence: each
    chunk's key tiles up to its last position, and (pieces: float32 and float64, whose products
    run in the compute dtype) a tile the causal rule masks in part (the diagonal) in four pieces
    of the chunk's rows, each over the keys up to its last row, where that covers at most 7/8
    of the tile."""
    pairs = 0
    for s in range(0, T, chunk):
        e = min(T, s + chunk)
        step = (e - s + 3) // 4
        for k0 in range(0, e, key_tile):
            k1 = min(e, k0 + key_tile)
            tile = (e - s) * (k1 - k0)
            if not pieces or k1 - 1 <= s or e - s < 2:
                pairs += tile
                continue
            area = sum((min(e, a + step) - a) * (min(k1, e, a + step) - k0)
                       for a in range(s, e, step) if min(k1, e, a + step) > k0)
            pairs += area if 8 * area <= 7 * tile else tile
    return pairs


def step_flops(cfg, T, chunk, block, keep_attention=False, key_tile=None, pieces=True):
    """Analytic FLOPs (a multiply-add is 2) of one SFT step of T positions: the stream engine with
    query chunks of `chunk`, and the baseline with attention blocks of `block`. GEMMs only
    (norms, RoPE, softmax and the loss are not counted); a dense decoder with a gated MLP.

    Both run each layer's projections and MLP four times (forward, the recompute, the two
    products of the backward), but stream's recompute leaves out the down projection's
    product (its output is only backpropagated, never read); stream computes K and V once more
    (without a graph, for every chunk's keys), and its recompute of them for their VJP leaves out
    V's product, and K's where no k-norm reads it (Qwen3 and Gemma3 have one). Attention in units of a forward (QK^T and PV) over
    the pairs each visits (stream: tiled_pairs with key tiles of `key_tile`, default the chunk): stream 4.5 (the forward, its
    recompute, and the tiled backward's five products: QK^T again, dV, dP, dQ, dK), the
    baseline 5 (the forward, the layer's recompute, the block's own recompute under its nested
    checkpoint, and the materialized backward's four products). The head: stream 3 (logits,
    dh, dW, each chunk once), the baseline 4 (its checkpointed chunks run forward twice).
    With keep_attention stream's backward skips the attention forward's recompute: 3.5."""
    d, L, V = cfg["hidden_size"], cfg["num_hidden_layers"], cfg["vocab_size"]
    H, KV = cfg["num_attention_heads"], cfg["num_key_value_heads"]
    hd = cfg.get("head_dim") or d // H
    kv_params = 2 * d * KV * hd
    layer_params = 2 * d * H * hd + kv_params + 3 * d * cfg["intermediate_size"]
    attention = lambda pairs: 4 * H * hd * pairs  # noqa: E731
    head = 2 * (T - 1) * d * V
    ours_attention = (3.5 if keep_attention else 4.5) * attention(tiled_pairs(T, chunk, key_tile or chunk, pieces))
    down = d * cfg["intermediate_size"]
    qk_norm = cfg.get("model_type") in ("qwen3", "qwen3_moe", "gemma3", "gemma3_text")
    unread_kv = (1 if qk_norm else 2) * 2 * T * d * KV * hd
    ours = L * (8 * T * layer_params - 2 * T * down + 2 * T * kv_params - unread_kv + ours_attention) + 3 * head
    theirs = L * (8 * T * layer_params + 5 * attention(chunked_pairs(T, block))) + 4 * head
    return ours, theirs


def measure_one(cmd):
    """Peak RSS of one command alone: a child interpreter runs it and reports its own children's maxrss."""
    probe = ("import json, resource, subprocess, sys, time\n"
             "t0 = time.perf_counter()\n"
             "p = subprocess.run(sys.argv[1:], capture_output=True, text=True)\n"
             "wall = time.perf_counter() - t0\n"
             "sys.stderr.write(p.stderr)\n"
             "print(json.dumps({'rc': p.returncode, 'wall': wall, 'stdout': p.stdout,\n"
             "                  'maxrss_kib': resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}))\n")
    p = subprocess.run([sys.executable, "-c", probe] + cmd, capture_output=True, text=True)
    r = json.loads(p.stdout.strip().splitlines()[-1])
    if r["rc"] != 0:
        raise SystemExit(f"pytorch_baseline: {' '.join(cmd)} failed ({r['rc']}):\n{p.stderr}")
    return r


def prepare(args, folder):
    model = args.model
    if not model:
        model = os.path.join(folder, "model")
        subprocess.run([args.server, "init-model", "--preset", args.preset, "--seed", str(args.seed), "--dtype",
                        args.dtype, "--out", model], check=True, stdout=subprocess.DEVNULL)
    with open(os.path.join(model, "config.json")) as f:
        vocab = json.load(f)["vocab_size"]
    rng = random.Random(args.seed)
    data = os.path.join(folder, "data.jsonl")
    with open(data, "w") as f:
        f.write(json.dumps({"tokens": [rng.randrange(vocab) for _ in range(args.seq_len)]}) + "\n")
    return model, data


def server_cmd(args, model, data, out):
    keep = ["--keep-attention"] if args.keep_attention else []
    return [args.server, "--threads", str(args.threads), "grad", "--model", model, "--data", data, "--dtype",
            args.dtype, "--engine", "stream", "--out", out] + keep


def baseline_cmd(args, model, data, out=None):
    cmd = [sys.executable, os.path.abspath(__file__), "step", "--model", model, "--data", data, "--dtype", args.dtype,
           "--threads", str(args.threads), "--block", str(args.block), "--logits-chunk", str(args.logits_chunk)]
    return cmd + (["--out", out] if out else [])


def run_compare(args):
    """`rounds` rounds, each a GEMM reference, both processes and a GEMM reference again; the
    processes' order alternates from round to round, so neither always runs in the same minute
    of a shared machine. Each round's ratios come from its own two processes; the report's
    ratios are the medians over rounds (every round is kept in the JSON)."""
    if args.rounds < 1:
        raise SystemExit(f"pytorch_baseline: --rounds must be at least 1, got {args.rounds}")
    gemm_cmd = [sys.executable, os.path.abspath(__file__), "gemm", "--threads", str(args.threads)]
    gemm = lambda: json.loads(subprocess.run(gemm_cmd, capture_output=True, text=True,  # noqa: E731
                                             check=True).stdout.strip().splitlines()[-1])["gflops"]
    mib = 1.0 / 1024
    rounds = []
    with tempfile.TemporaryDirectory() as folder:
        model, data = prepare(args, folder)
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        for i in range(args.rounds):
            gemm_start = gemm()
            runs = {}
            order = ("ours", "theirs") if i % 2 == 0 else ("theirs", "ours")
            for who in order:
                cmd = (server_cmd(args, model, data, os.path.join(folder, "ours.safetensors")) if who == "ours"
                       else baseline_cmd(args, model, data))
                runs[who] = measure_one(cmd)
            gemm_end = gemm()
            ours, theirs = runs["ours"], runs["theirs"]
            step = json.loads(theirs["stdout"].strip().splitlines()[-1])
            # grad's line: "... (stream engine, chunks C/LC/KC, S s); ..."
            line = ours["stdout"].split("(stream engine, chunks ")[1]
            chunk, key_tile = int(line.split("/")[0]), int(line.split(",")[0].split("/")[2])
            ours_step = float(line.split(", ")[1].split(" s)")[0])
            flops_ours, flops_theirs = step_flops(cfg, args.seq_len, chunk, args.block, args.keep_attention, key_tile,
                                                  args.dtype in ("float32", "float64"))
            gemm_ref = max(gemm_start, gemm_end)  # a slow minute at one end must not flatter the shares
            r = {
                "order": list(order),
                "streambp_grad_stream": {"peak_rss_mib": ours["maxrss_kib"] * mib, "wall_s": ours["wall"],
                                         "step_s": ours_step, "chunk": chunk, "flops": flops_ours,
                                         "gemm_fraction": flops_ours / ours_step / 1e9 / gemm_ref,
                                         "output": ours["stdout"].strip()},
                "pytorch_eager": {"peak_rss_mib": theirs["maxrss_kib"] * mib, "wall_s": theirs["wall"],
                                  "step_s": step["step_seconds"], "loss": step["loss"], "flops": flops_theirs,
                                  "gemm_fraction": flops_theirs / step["step_seconds"] / 1e9 / gemm_ref},
                "gemm_gflops": {"start": gemm_start, "end": gemm_end, "reference": gemm_ref},
            }
            r["rss_ratio"] = r["streambp_grad_stream"]["peak_rss_mib"] / r["pytorch_eager"]["peak_rss_mib"]
            r["wall_ratio"] = ours["wall"] / theirs["wall"]
            r["step_ratio"] = ours_step / step["step_seconds"]
            r["flop_ratio"] = flops_ours / flops_theirs
            rounds.append(r)
            if args.rounds > 1:
                print(f"round {i + 1}/{args.rounds} ({' then '.join(order)}): wall {ours['wall']:.2f} vs "
                      f"{theirs['wall']:.2f} s = {r['wall_ratio']:.3f}, peak RSS {r['rss_ratio']:.3f}, GEMM "
                      f"{gemm_start:.0f}/{gemm_end:.0f} GFLOP/s", flush=True)
    # The median round (by wall ratio) stands for the run; the ratios are each the median over rounds.
    mid = sorted(rounds, key=lambda r: r["wall_ratio"])[(len(rounds) - 1) // 2]
    report = {
        "seq_len": args.seq_len, "preset": args.preset if not args.model else None, "model": args.model or None,
        "dtype": args.dtype, "threads": args.threads, "keep_attention": args.keep_attention,
        "blas_core": args.blas_core, "blas_core_fallback": os.environ.get("STREAMBP_OPENBLAS_FALLBACK", ""),
        "baseline": {"block": args.block, "logits_chunk": args.logits_chunk},
        "streambp_grad_stream": mid["streambp_grad_stream"], "pytorch_eager": mid["pytorch_eager"],
        "gemm_gflops": mid["gemm_gflops"],
        "rss_ratio": statistics.median([r["rss_ratio"] for r in rounds]),
        "rss_ratio_max": max(r["rss_ratio"] for r in rounds),
        "wall_ratio": statistics.median([r["wall_ratio"] for r in rounds]),
        "wall_ratio_range": [min(r["wall_ratio"] for r in rounds), max(r["wall_ratio"] for r in rounds)],
        "step_ratio": statistics.median([r["step_ratio"] for r in rounds]),
        "flop_ratio": mid["flop_ratio"],
        "rounds": rounds,
    }
    print(f"T={args.seq_len} {args.dtype}, {args.threads} thread(s), OpenBLAS kernels {args.blas_core or '(not OpenBLAS)'}"
          f" in all processes; baseline: checkpointed layers, query blocks of "
          f"{args.block}, logits chunks of {args.logits_chunk}" +
          (f"; the median of {args.rounds} rounds (by wall ratio)" if args.rounds > 1 else ""))
    print(f"{'':24s} {'peak RSS MiB':>13s} {'wall s':>9s} {'step s':>9s} {'TFLOP':>7s} {'GFLOP/s':>8s} {'%GEMM':>6s}")
    ours_name = "streambp-server grad" + (" (keep)" if args.keep_attention else "")
    for name, r in ((ours_name, report["streambp_grad_stream"]), ("eager PyTorch", report["pytorch_eager"])):
        print(f"{name:24s} {r['peak_rss_mib']:13.1f} {r['wall_s']:9.2f} {r['step_s']:9.2f} {r['flops'] / 1e12:7.2f} "
              f"{r['flops'] / r['step_s'] / 1e9:8.1f} {100 * r['gemm_fraction']:5.0f}%")
    g = report["gemm_gflops"]
    print(f"GEMM 2048^3 float32: {g['start']:.0f} GFLOP/s before, {g['end']:.0f} after (shares use {g['reference']:.0f})")
    over = f" over {args.rounds} rounds" if args.rounds > 1 else ""
    print(f"ratios (streambp / PyTorch{', medians' + over if over else ''}): peak RSS {report['rss_ratio']:.3f}"
          f"{' (largest %.3f)' % report['rss_ratio_max'] if over else ''}, wall {report['wall_ratio']:.3f}"
          f"{' (%.3f-%.3f)' % tuple(report['wall_ratio_range']) if over else ''}, step {report['step_ratio']:.3f}; "
          f"FLOPs {report['flop_ratio']:.3f} (the step ratio at equal shares of the GEMM)")
    out = report["streambp_grad_stream"]["output"]
    print(f"losses: {out.split(';')[0].strip()} | PyTorch {report['pytorch_eager']['loss']:.9f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
            f.write("\n")
    return 0


def run_check(args):
    """float64: the baseline's loss and gradients against the server's stream engine."""
    args.dtype = "float64"
    with tempfile.TemporaryDirectory() as folder:
        model, data = prepare(args, folder)
        ours_path, theirs_path = os.path.join(folder, "ours.safetensors"), os.path.join(folder, "theirs.safetensors")
        ours = subprocess.run(server_cmd(args, model, data, ours_path) + ["--chunk", "7", "--key-chunk", "5",
                                                                          "--logits-chunk", "6"],
                              capture_output=True, text=True, check=True).stdout
        theirs = subprocess.run(baseline_cmd(args, model, data, theirs_path), capture_output=True, text=True,
                                check=True).stdout
        counted = subprocess.run(baseline_cmd(args, model, data) + ["--count-flops"], capture_output=True,
                                 text=True, check=True).stdout
        with open(os.path.join(model, "config.json")) as f:
            cfg = json.load(f)
        a, b = read_safetensors(ours_path), read_safetensors(theirs_path)
    loss_ours = float(ours.split("loss ")[1].split()[0])
    loss_theirs = json.loads(theirs.strip().splitlines()[-1])["loss"]
    # compare's FLOP count of the baseline against the profiler's count of the same step.
    flops_counted = json.loads(counted.strip().splitlines()[-1])["gemm_flops"]
    flops_formula = step_flops(cfg, args.seq_len, 1, args.block)[1]
    worst, names = 0.0, sorted(set(a) | set(b))
    failures = []
    if abs(loss_ours - loss_theirs) > 1e-9 * abs(loss_theirs):
        failures.append(f"loss {loss_ours!r} vs PyTorch {loss_theirs!r}")
    if flops_counted != flops_formula:
        failures.append(f"the baseline's step ran {flops_counted} GEMM FLOPs (profiler), step_flops says {flops_formula}")
    for name in names:
        if name not in a or name not in b:
            failures.append(f"{name}: only in {'ours' if name in a else 'PyTorch'}")
            continue
        scale = float(b[name].abs().max())
        diff = float((a[name] - b[name]).abs().max())
        rel = diff / scale if scale > 0 else diff
        worst = max(worst, rel)
        if not rel <= args.tolerance:
            failures.append(f"{name}: max |diff| {diff:.3g}, {rel:.3g} of the largest entry")
    print(f"float64, T={args.seq_len}: loss {loss_ours!r} vs PyTorch {loss_theirs!r}; {len(names)} gradients, "
          f"worst {worst:.3g} relative (tolerance {args.tolerance:g}); the baseline's GEMM FLOPs {flops_counted} "
          f"(profiler) vs {flops_formula:.0f} (step_flops)")
    for f in failures:
        print("FAIL:", f)
    return 1 if failures else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="command", required=True)
    g = sub.add_parser("gemm")
    g.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    t = sub.add_parser("tiles")
    t.add_argument("--chunk", type=int, default=512, help="query positions per block (the stream default)")
    t.add_argument("--key-tile", type=int, default=512, help="keys per tile (the default key chunk)")
    t.add_argument("--groups", type=int, default=2, help="query heads per kv head (small preset: 8 / 4)")
    t.add_argument("--head-dim", type=int, default=64)
    t.add_argument("--repeat", type=int, default=20, help="best of this many runs of each")
    t.add_argument("--json")
    for name in ("compare", "check", "step"):
        p = sub.add_parser(name)
        p.add_argument("--model", help="Hugging Face model folder (config.json + model.safetensors)")
        p.add_argument("--dtype", default="float64" if name == "check" else "float32")
        p.add_argument("--threads", type=int, default=os.cpu_count() or 1)
        p.add_argument("--block", type=int, default=512, help="baseline: query positions per attention block")
        p.add_argument("--logits-chunk", type=int, default=1024, help="baseline: positions per lm_head + loss chunk")
        if name == "step":
            p.add_argument("--data", required=True)
            p.add_argument("--out")
            p.add_argument("--count-flops", action="store_true",
                           help="run the step under the profiler and report its GEMM FLOPs (no time)")
        else:
            p.add_argument("--server", required=True, help="streambp-server binary")
            p.add_argument("--preset", default="tiny" if name == "check" else "small")
            p.add_argument("--seed", type=int, default=0)
            p.add_argument("--seq-len", type=int, default=40 if name == "check" else 8192)
            p.add_argument("--keep-attention", action="store_true",
                           help="run streambp-server grad with --keep-attention (selective recompute)")
        if name == "compare":
            p.add_argument("--json")
            p.add_argument("--rounds", type=int, default=1,
                           help="rounds of both processes, their order alternating; ratios are medians over rounds")
        if name == "check":
            p.add_argument("--tolerance", type=float, default=1e-10)
    args = ap.parse_args()
    args.blas_core = use_cpu_blas_kernels()
    if args.command == "check" and args.block == 512:
        args.block, args.logits_chunk = 9, 11  # several uneven blocks and chunks on a short sequence
    return {"compare": run_compare, "check": run_check, "step": run_step, "gemm": run_gemm,
            "tiles": run_tiles}[args.command](args) or 0


if __name__ == "__main__":
    sys.exit(main())
