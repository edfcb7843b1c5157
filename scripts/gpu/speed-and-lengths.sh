#!/usr/bin/env bash
# One device call (docs/gpu.md): build, exactness on the tiny preset, the Qwen3-8B bf16 step at
# 32K (stream at its CUDA default chunks and at the old fixed 512, against checkpoint:tiled; stream
# with its layer inputs in pinned host memory), and
# the maximum length of each engine run to the first OOM and bisected (--search-to-peak). On a
# GPU with more than 90 GB the budget is an H100's (48 GiB of activations past the statics).
# A dry run on a CPU build: GPU_DEVICE=cpu GPU_BIN=... BENCH_PRESET=tiny SEARCH_PRESET=tiny
# SPEED_LEN=512 SEARCH_BUDGET=8MiB BENCH_BUDGET=8MiB SEARCH_START=1024 GEMM_N=256.
#   GPU_DEADLINE=$(( $(date +%s) + 570 )) bash scripts/gpu/speed-and-lengths.sh OUT
set -uo pipefail
W=${1:-${OUT:-$PWD/gpu-out}}; mkdir -p "$W"
export GPU_DEADLINE=${GPU_DEADLINE:-$(( $(date +%s) + 570 ))}
S="bash scripts/gpu/check.sh"
GPU_TARGETS=${GPU_TARGETS:-"streambp-server streambp-bench"} $S probe,build "$W" || exit 1
EXACT_PRESETS=${EXACT_PRESETS:-tiny} EXACT_LORA=0 $S exact "$W"
# The fused kernel's own grouped-query support failing its check: K/V repeated from here on.
python3 -c "import json,sys; sys.exit(any(not json.loads(l)['pass'] for l in open(sys.argv[1]) if l.strip()))" \
  "$W/exactness.jsonl" || { echo "exactness failed: STREAMBP_FLASH_GQA=expand from here on"; export STREAMBP_FLASH_GQA=expand; }
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
BUDGET=${SEARCH_BUDGET:-device}; [ -z "${SEARCH_BUDGET:-}" ] && [ "${MEM:-0}" -gt 90000 ] && BUDGET=48GiB
echo "device memory ${MEM:-?} MiB: search budget $BUDGET" | tee -a "$W/steps.log"
LEN=${SPEED_LEN:-32768}
BENCH_ENGINES=checkpoint:tiled,stream,stream:offload BENCH_LENS=$LEN BENCH_WARMUP=0 BENCH_NAME=sweep_${LEN} BENCH_SECONDS=150 $S bench "$W"
BENCH_ENGINES=stream BENCH_LENS=$LEN BENCH_WARMUP=0 BENCH_NAME=sweep_${LEN}_chunk512 BENCH_SECONDS=90 \
  BENCH_EXTRA="--chunk 512 --logits-chunk 1024 --key-chunk 1024" $S bench "$W"
# The chunks the engine would use (--search-chunks fixed): with `auto`, a length past the estimate
# gets the smallest chunks (16 positions), and such a probe takes many minutes on a GPU.
for e in ${SEARCH_LIST:-checkpoint:tiled stream checkpoint:materialized}; do
  SEARCH_ENGINES=$e SEARCH_START=${SEARCH_START:-8192} SEARCH_TOL=${SEARCH_TOL:-0.06} SEARCH_BUDGET=$BUDGET \
    SEARCH_EXTRA="--search-to-peak ${SEARCH_MORE:---search-chunks fixed}" SEARCH_NAME=search_${e/:/_} SEARCH_SECONDS=300 $S search "$W"
done
