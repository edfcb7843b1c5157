#!/usr/bin/env bash
# The third H100 session's device call (docs/gpu.md): build; every family, MoE included, on
# CUDA in float64 against the CPU's float64 (the model code was rewritten as modules since the
# last GPU run); the kernels' own rates (flash attention, the layer's GEMMs) beside the step's
# MFU; the Qwen3-8B bf16 step at 32K with larger stream chunks against checkpoint:tiled; and
# the layer inputs offloaded to pinned host memory past the lengths that fit on the device
# (the pinned buffers now exactly one layer input each, the host's memory checked up front).
#   GPU_DEADLINE=$(( $(date +%s) + 560 )) bash scripts/gpu/offload-and-speed.sh OUT
# PARTS picks and orders the parts (default: exact kernels speed offload lora; also offload_warm,
# packed).
# A dry run on a CPU build: GPU_DEVICE=cpu GPU_BIN=DIR BENCH_PRESET=tiny SEARCH_PRESET=tiny
# SPEED_LEN=512 OFFLOAD_LEN=1024 OFFLOAD_MAX=2048 SEARCH_BUDGET=8MiB LORA_BUDGET=16MiB
# LORA_START=512 GEMM_N=256 PARTS="exact speed offload lora".
set -uo pipefail
W=${1:-${OUT:-$PWD/gpu-out}}; mkdir -p "$W"
export GPU_DEADLINE=${GPU_DEADLINE:-$(( $(date +%s) + 560 ))}
S="bash scripts/gpu/check.sh"
GPU_TARGETS=${GPU_TARGETS:-"streambp-server streambp-bench"} $S probe,build "$W" || exit 1
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
# An H100's budgets on a larger GPU (docs/gpu.md): 48.67 GiB of activations past full
# fine-tuning's statics, 79 GiB in all for LoRA.
BUDGET=${SEARCH_BUDGET:-device}; LORA_BUDGET=${LORA_BUDGET:-device}
if [ "${MEM:-0}" -gt 90000 ]; then [ -z "${SEARCH_BUDGET:-}" ] && BUDGET=49836MiB; LORA_BUDGET=81079MiB; fi
echo "device memory ${MEM:-?} MiB, host $(free -g | awk '/Mem:/ {print $2 " GiB, " $7 " GiB available"}'); budget $BUDGET" \
  | tee -a "$W/steps.log"
LEN=${SPEED_LEN:-32768}
# The offload search starts at the longest sequence whose layer inputs (36 x 4096 x 2 bytes =
# 288 KiB per position) the host's available memory holds with 8 GiB to spare for the process.
AVAIL_KIB=$(awk '/MemAvailable:/ {print $2}' /proc/meminfo)
OFF_START=${OFFLOAD_LEN:-$(( (AVAIL_KIB / 1024 / 1024 - 8) * 1024 * 1024 / 288 / 16384 * 16384 ))}
(( OFF_START > 524288 )) && OFF_START=524288
OFF_MAX=${OFFLOAD_MAX:-$(( OFF_START * 9 / 8 ))}
for part in ${PARTS:-exact kernels speed offload lora}; do
  case $part in
    exact) EXACT_FAMILIES=${EXACT_FAMILIES:-"qwen3_moe qwen3 gemma3"} $S exact_models "$W" ;;
    kernels) timeout 60 python3 scripts/gpu/kernel_ceiling.py $LEN > "$W/kernel_ceiling.json" 2> "$W/kernel_ceiling.log"
             echo "kernels rc $?" | tee -a "$W/steps.log"; cat "$W/kernel_ceiling.json" ;;
    # checkpoint:tiled and stream at the defaults, then stream with larger query (and logits) chunks.
    # SPEED_DEFAULTS=0 skips the defaults' pair; SPEED_CHUNKS="" runs no larger chunks.
    speed) [ "${SPEED_DEFAULTS:-1}" = 1 ] && BENCH_ENGINES=checkpoint:tiled,stream BENCH_LENS=$LEN BENCH_WARMUP=0 \
             BENCH_NAME=speed_${LEN} BENCH_SECONDS=100 $S bench "$W"
           for c in ${SPEED_CHUNKS-4096:1024 8192:1024}; do
             BENCH_ENGINES=stream BENCH_LENS=$LEN BENCH_WARMUP=0 BENCH_NAME=speed_${LEN}_chunk${c%%:*}_logits${c##*:} BENCH_SECONDS=60 \
               BENCH_EXTRA="--chunk ${c%%:*} --logits-chunk ${c##*:}" $S bench "$W"
           done ;;
    # stream and stream:offload after a warm-up step: the timed offload step reuses the pinned
    # buffers the warm-up pinned (memory::HostBufferCache).
    offload_warm) BENCH_ENGINES=stream,stream:offload BENCH_LENS=$LEN BENCH_WARMUP=1 BENCH_NAME=offload_warm_${LEN} \
                    BENCH_SECONDS=150 $S bench "$W" ;;
    # Packed rows (RL rollouts): stream at LEN with PACK (default 8) sequences per row, through
    # flash's varlen entry (STREAMBP_FLASH_VARLEN) and through the tiled kernel (the speed
    # part's stream step is the same tokens as one sequence).
    packed) for attn in auto tiled; do
              STREAMBP_ATTENTION=$attn BENCH_ENGINES=stream BENCH_LENS=$LEN BENCH_WARMUP=1 BENCH_SECONDS=90 \
                BENCH_NAME=packed${PACK:-8}_${LEN}_$attn BENCH_EXTRA="--pack ${PACK:-8}" $S bench "$W"
            done ;;
    # From OFF_START up to OFF_MAX; a length whose pinned buffers the host cannot hold is
    # refused before it runs (the step checks the host's available memory first).
    offload) echo "offload search from $OFF_START to $OFF_MAX (host: $(( AVAIL_KIB / 1024 / 1024 )) GiB available)" | tee -a "$W/steps.log"
             SEARCH_ENGINES=stream:offload SEARCH_START=$OFF_START SEARCH_GROWTH=1.125 SEARCH_TOL=0.065 \
               SEARCH_BUDGET=$BUDGET SEARCH_EXTRA="--search-to-peak --search-chunks fixed --search-max $OFF_MAX" \
               SEARCH_NAME=search_offload SEARCH_SECONDS=${OFFLOAD_SECONDS:-300} $S search "$W" ;;
    # The bisection the second H100 session left: 196608 fit, 221184 did not.
    lora) LORA_START=${LORA_START:-208896} SEARCH_GROWTH=1.0625 SEARCH_TOL=0.065 LORA_BUDGET=$LORA_BUDGET \
            LORA_SECONDS=${LORA_SECONDS:-150} $S lora_search "$W" ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
