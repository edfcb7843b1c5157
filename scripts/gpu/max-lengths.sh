#!/usr/bin/env bash
# The maximum lengths the first H100 session left open (docs/gpu.md), in one or two device calls:
# stream run to its first OOM, LoRA r=16 on the frozen bf16 base, the layer inputs offloaded to
# pinned host memory, plain checkpoint; before them the families beside Qwen3 (Gemma3, Mistral,
# with sliding windows) on CUDA against the CPU's float64. Every search starts just under the
# estimate's prediction and grows 1.125x per probe (--search-growth), probes cut at their peak
# (--search-to-peak) with the chunks the engine would use (--search-chunks fixed): a probe of a
# 200K-token sequence of an 8B model takes about a minute.
#   GPU_DEADLINE=$(( $(date +%s) + 570 )) bash scripts/gpu/max-lengths.sh OUT
# PARTS picks and orders the parts (default: exact stream lora offload checkpoint); PACK=1 packs the
# binaries; with
# GPU_BIN (the binaries of an earlier call, `pack`) nothing is built.
# A dry run on a CPU build: GPU_DEVICE=cpu GPU_BIN=DIR SEARCH_PRESET=tiny SEARCH_BUDGET=8MiB
# LORA_BUDGET=16MiB STREAM_START=512 LORA_START=512 OFFLOAD_LEN=1024 CKPT_START=128 GEMM_N=256.
set -uo pipefail
W=${1:-${OUT:-$PWD/gpu-out}}; mkdir -p "$W"
export GPU_DEADLINE=${GPU_DEADLINE:-$(( $(date +%s) + 570 ))}
S="bash scripts/gpu/check.sh"
first=probe,build; [ "${PACK:-0}" = 1 ] && first=$first,pack  # the binaries for a later, cold machine (GPU_BIN)
GPU_TARGETS=${GPU_TARGETS:-"streambp-server streambp-bench"} $S $first "$W" || exit 1
# The budgets are an H100's on a larger GPU (an H200 lent instead): 48.67 GiB of activations past
# the statics of full fine-tuning (what the first H100 session had), 79 GiB in all for LoRA.
MEM=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
BUDGET=${SEARCH_BUDGET:-device}; LORA_BUDGET=${LORA_BUDGET:-device}
if [ "${MEM:-0}" -gt 90000 ]; then
  [ -z "${SEARCH_BUDGET:-}" ] && BUDGET=49836MiB
  LORA_BUDGET=81079MiB
fi
echo "device memory ${MEM:-?} MiB: search budget $BUDGET, LoRA total budget $LORA_BUDGET" | tee -a "$W/steps.log"
search() {  # engine name start growth tol [extra...]
  local e=$1 name=$2 start=$3 growth=$4 tol=$5; shift 5
  SEARCH_ENGINES=$e SEARCH_START=$start SEARCH_GROWTH=$growth SEARCH_TOL=$tol SEARCH_BUDGET=$BUDGET \
    SEARCH_EXTRA="--search-to-peak --search-chunks fixed $*" SEARCH_NAME=$name SEARCH_SECONDS=${SEARCH_SECONDS:-300} \
    $S search "$W"
}
for part in ${PARTS:-exact stream lora offload checkpoint}; do
  case $part in
    # Qwen3 without a window (bfloat16 in the fused flash kernel), Gemma3 and Mistral with one.
    exact) EXACT_FAMILIES=${EXACT_FAMILIES:-"qwen3 gemma3 mistral"} $S exact_models "$W" ;;
    # 131072 fit (40.7 GiB at its peak) and the estimate predicts 172064.
    stream) search stream search_stream ${STREAM_START:-147456} 1.125 0.065 ;;
    # The frozen base has no gradients: about 15 GiB more for activations.
    lora) LORA_START=${LORA_START:-196608} SEARCH_GROWTH=1.125 SEARCH_TOL=0.065 LORA_BUDGET=$LORA_BUDGET \
            LORA_SECONDS=${LORA_SECONDS:-300} $S lora_search "$W" ;;
    # One probe: the layer inputs of 256K positions (72 GiB) in pinned host memory.
    offload) search stream:offload search_offload ${OFFLOAD_LEN:-262144} 2 0.065 --search-max ${OFFLOAD_LEN:-262144} ;;
    # Plain checkpointing (materialized scores and logits): 4096 fit on the H200, 16384 did not.
    checkpoint) search checkpoint:materialized search_checkpoint ${CKPT_START:-4096} 1.25 0.065 ;;
    *) echo "unknown part $part"; exit 2 ;;
  esac
done
