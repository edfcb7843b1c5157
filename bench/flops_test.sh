#!/usr/bin/env bash
# ctest bench.flops: the FLOP count behind every GFLOP/s and %GEMM the bench reports
# (AnalyticFlops) against the profiler's count of the matrix products a profiled step ran,
# from their operands' shapes (--profile --check: equal to 1e-9, else the run fails). Every
# engine the sweep has (full, the checkpoint baselines, stream, offloaded, kept attention), the
# three objectives, sliding windows past a key tile (Gemma3 at T = 1536), a mixture of experts, and
# rows of packed sequences (whose tiles before a chunk's first sequence are skipped), with windows;
# and on two threads, where attention runs its heads on both.
set -euo pipefail
BENCH=${1:?streambp-bench}; OUT=${2:-$(mktemp -d)}; mkdir -p "$OUT"
engines=full,checkpoint,stream,stream:offload,stream:keep
run() {
  local name=$1; shift
  "$BENCH" --quick --profile --check --engines "$engines" --no-search --ablation-seq-len 0 \
    --json "$OUT/$name.json" "$@" > "$OUT/$name.log" || { cat "$OUT/$name.log"; exit 1; }
  grep -q "analytic FLOPs = the profiled steps' counted GEMM FLOPs" "$OUT/$name.log"
  python3 - "$OUT/$name.json" "$name" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
runs = [x for x in r["runs"] if "time_breakdown" in x]
assert len(runs) >= 10, f"{sys.argv[2]}: {len(runs)} profiled points"
for x in runs:
    counted = x["time_breakdown"]["gemm_flops_counted"]
    assert counted > 0 and abs(x["flops"] / counted - 1) <= 1e-9, (sys.argv[2], x["flops"], counted)
print(f"{sys.argv[2]}: {len(runs)} profiled points, analytic = counted")
PY
}
run sft
run dpo --objective dpo
run grpo_moe --objective grpo --family qwen3_moe
run gemma3_windows --family gemma3 --seq-lens 256,1536
# Two threads: the tiled attention splits its heads between them, and the products the other
# thread runs count too (the tests' environment runs one thread unless told).
run gemma3_windows_two_threads --family gemma3 --seq-lens 256,1536 --threads 2
run packed --pack 3 --seq-lens 256,300
run gemma3_packed --family gemma3 --pack 2 --seq-lens 1024,1536
# --pack packs sft sequences: another objective is refused before any model is built.
if out=$("$BENCH" --quick --objective dpo --pack 2 2>&1); then echo "--pack with dpo ran: $out"; exit 1; fi
grep -q -- "--pack packs sft sequences" <<<"$out" || { echo "$out"; exit 1; }
echo "--pack with dpo refused"
