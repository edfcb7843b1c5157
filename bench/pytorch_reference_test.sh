#!/usr/bin/env bash
# ctest bench.pytorch_reference: the eager PyTorch baseline (bench/pytorch_baseline.py) as an
# independent float64 reference of the stream engine's loss and gradients (tiny model, two seeds
# and lengths, uneven chunks, 1e-10; once with --keep-attention), then its peak-RSS / wall comparison once at T=256 (run,
# reported, never asserted: those are measured with streambp-bench's tooling, docs/results.md).
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
"$py" "$script" compare --server "$server" --preset tiny --seq-len 256 --threads 1 --json "$json"
"$py" -c 'import json, sys; r = json.load(open(sys.argv[1])); assert r["rss_ratio"] > 0 and r["wall_ratio"] > 0, r' "$json"
echo "pytorch reference: passed"
