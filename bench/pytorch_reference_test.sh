#!/usr/bin/env bash
# ctest bench.pytorch_reference: the eager PyTorch baseline (bench/pytorch_baseline.py) as an
# independent float64 reference of the stream engine's loss and gradients (tiny model, two seeds
# and lengths, uneven chunks, 1e-10; once with --keep-attention; its FLOP formula against the
# profiler's count of the same step), then its peak-RSS / wall / FLOP comparison at T=256 in three
# rounds of alternating order (checked for completeness and that the report's ratios are the
# medians over its rounds; ratios never asserted: they are measurements, docs/results.md),
# and its one-thread attention tile measurement once (fields checked, values not asserted).
#   pytorch_reference_test.sh PYTHON3 STREAMBP_SERVER OUT.json
set -euo pipefail
py="$1" server="$2" json="$3"
script="$(dirname "${BASH_SOURCE[0]}")/pytorch_baseline.py"
if ! "$py" -c 'import torch' 2>/dev/null; then
  if [ -n "${CI:-}" ]; then echo "FAIL: $py cannot import torch: CI installs python3-torch (scripts/packages.txt)"; exit 1; fi
  echo "torch is not installed: skipped"; exit 77
fi
"$py" "$script" check --server "$server" --seq-len 40
"$py" "$script" check --server "$server" --seq-len 67 --seed 5
"$py" "$script" check --server "$server" --seq-len 67 --seed 5 --keep-attention
"$py" "$script" compare --server "$server" --preset tiny --seq-len 256 --threads 1 --rounds 3 --json "$json"
"$py" -c '
import json, statistics, sys
r = json.load(open(sys.argv[1]))
ours, theirs = r["streambp_grad_stream"], r["pytorch_eager"]
assert r["rss_ratio"] > 0 and r["wall_ratio"] > 0 and r["step_ratio"] > 0, r
assert ours["chunk"] > 0 and ours["flops"] > 0 and theirs["flops"] > 0, r
assert ours["gemm_fraction"] > 0 and theirs["gemm_fraction"] > 0 and r["gemm_gflops"]["reference"] > 0, r
assert abs(r["flop_ratio"] - ours["flops"] / theirs["flops"]) < 1e-12, r
# Three rounds in alternating order; the ratios are medians over them, the median round stands for the run.
rounds = r["rounds"]
assert [x["order"] for x in rounds] == [["ours", "theirs"], ["theirs", "ours"], ["ours", "theirs"]], rounds
for x in rounds:
    assert abs(x["wall_ratio"] - x["streambp_grad_stream"]["wall_s"] / x["pytorch_eager"]["wall_s"]) < 1e-12, x
    assert abs(x["rss_ratio"] - x["streambp_grad_stream"]["peak_rss_mib"] / x["pytorch_eager"]["peak_rss_mib"]) < 1e-12, x
for key in ("wall_ratio", "rss_ratio", "step_ratio"):
    assert r[key] == statistics.median(x[key] for x in rounds), (key, r)
assert r["rss_ratio_max"] == max(x["rss_ratio"] for x in rounds), r
assert r["wall_ratio_range"] == [min(x["wall_ratio"] for x in rounds), max(x["wall_ratio"] for x in rounds)], r
assert r["streambp_grad_stream"]["wall_s"] / r["pytorch_eager"]["wall_s"] == r["wall_ratio"], r
' "$json"
"$py" "$script" tiles --chunk 64 --key-tile 64 --repeat 2 --json "$json.tiles"
"$py" -c '
import json, sys
r = json.load(open(sys.argv[1]))
assert r["rows"] == 128 and r["keys"] == 64 and r["head_dim"] == 64 and r["gemm_gflops"] > 0, r
for part in ("products", "forward", "known_lse", "backward"):
    assert r[part]["gflops"] > 0 and abs(r[part]["of_gemm"] - r[part]["gflops"] / r["gemm_gflops"]) < 1e-12, r
' "$json.tiles"
echo "pytorch reference: passed"
