#!/usr/bin/env bash
# `grad --context-parallel P` as P processes on loopback (Gloo): rank 0 writes every
# parameter's gradient, equal in float64 to one process's (1e-10 relative, tensor by tensor),
# for SFT on a packed batch and DPO, with 2 and 3 ranks, and with 4 ranks as 2 data x 2
# context; `train` and `verify` the same way; a launch without the environment is a clear error.
set -uo pipefail
server="$1"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

# compare A B: every tensor of the safetensors file B equals A's to 1e-10 relative (float64).
compare() {
  /usr/bin/python3 - "$1" "$2" <<'PY'  # exit 1 when they differ (the caller fails)
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        assert t["dtype"] == "F64", (name, t["dtype"])
        s, e = t["data_offsets"]
        out[name] = struct.unpack("<%dd" % ((e - s) // 8), data[8 + n + s:8 + n + e])
    return out, header.get("__metadata__", {})
a, ma = read(sys.argv[1])
b, mb = read(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))
worst = 0.0
for name in a:
    scale = max(max(abs(x) for x in a[name]), 1e-300)
    worst = max(worst, max(abs(x - y) for x, y in zip(a[name], b[name])) / scale)
loss_a, loss_b = float(ma.get("loss", 0)), float(mb.get("loss", 0))
print("max relative difference %.3g over %d tensors; loss %.17g vs %.17g" % (worst, len(a), loss_a, loss_b))
sys.exit(0 if worst <= 1e-10 and abs(loss_a - loss_b) <= 1e-12 * max(1.0, abs(loss_a)) else 1)
PY
}

# cp_run RANKS NAME TOOL ARGS...: `TOOL --context-parallel RANKS ARGS` as RANKS processes (WORLD
# processes when WORLD is set: data parallel x context parallel), logs $dir/NAME-rank<r>.log.
cp_run() {
  local ranks="$1" name="$2" tool="$3"; shift 3
  local world="${WORLD:-$ranks}"
  local master; master="$(free_port)"
  local procs=()
  for r in $(seq 0 $((world - 1))); do
    env MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE="$world" RANK="$r" STREAMBP_DIST_TIMEOUT=60 \
      "$server" "$tool" --context-parallel "$ranks" "$@" > "$dir/$name-rank$r.log" 2>&1 &
    procs+=($!); pids+=($!)
  done
  for p in "${procs[@]}"; do wait "$p" || fail "$name: a rank exited non-zero"; done
}
cp_grad() { local ranks="$1" name="$2"; shift 2; cp_run "$ranks" "$name" grad "$@" --out "$dir/$name.safetensors"; }

"$server" init-model --family qwen3 --dtype float64 --seed 4 --out "$dir/qwen3" > /dev/null || fail "init-model qwen3"
"$server" init-model --family gemma3 --dtype float64 --seed 4 --out "$dir/gemma3" > /dev/null || fail "init-model gemma3"
printf '{"tokens":[1,5,9,13,17,21,25,29,33,37,41]}\n{"prompt":[2,4,6],"completion":[8,10,12,14,16,18,20]}\n{"tokens":[3,6,9,12,15,18,21,24]}\n' > "$dir/sft.jsonl"
printf '{"prompt":[1,2,3],"chosen":[4,5,6,7],"rejected":[6,7,8]}\n{"prompt":[9,10],"chosen":[10,11,12],"rejected":[11,12,13,14,15]}\n' > "$dir/dpo.jsonl"

for model in qwen3 gemma3; do
  common=(--model "$dir/$model" --dtype float64 --data "$dir/sft.jsonl" --layout packed --chunk 2 --logits-chunk 3 --key-chunk 2)
  "$server" grad "${common[@]}" --out "$dir/$model-one.safetensors" > "$dir/$model-one.log" 2>&1 || fail "grad $model"
  for ranks in 2 3; do
    cp_grad "$ranks" "$model-cp$ranks" "${common[@]}"
    grep -q "context parallel: $ranks ranks" "$dir/$model-cp$ranks-rank0.log" || fail "rank 0 does not report the split"
    # 4 query heads over 2 kv heads split over 2 ranks (heads exchanged), not over 3.
    exchange="heads exchanged"; [ "$ranks" = 3 ] && exchange="K/V gathered"
    grep -q "), $exchange;" "$dir/$model-cp$ranks-rank0.log" || fail "$model, $ranks ranks: not $exchange"
    ! grep -q "gradients written" "$dir/$model-cp$ranks-rank1.log" || fail "rank 1 reports writing gradients too"
    out="$(compare "$dir/$model-one.safetensors" "$dir/$model-cp$ranks.safetensors")" || fail "$model sft, $ranks ranks: $out"
    echo "$model sft, $ranks ranks ($exchange): $out"
  done
  # K/V gathered where the heads would split.
  cp_grad 2 "$model-cp2kv" "${common[@]}" --context-exchange kv
  grep -q "), K/V gathered;" "$dir/$model-cp2kv-rank0.log" || fail "$model --context-exchange kv: not K/V gathered"
  out="$(compare "$dir/$model-one.safetensors" "$dir/$model-cp2kv.safetensors")" || fail "$model sft, 2 ranks, kv: $out"
  echo "$model sft, 2 ranks (K/V gathered): $out"
done

dpo=(--model "$dir/qwen3" --dtype float64 --data "$dir/dpo.jsonl" --objective dpo --chunk 2 --logits-chunk 3)
"$server" grad "${dpo[@]}" --out "$dir/dpo-one.safetensors" > "$dir/dpo-one.log" 2>&1 || fail "grad dpo"
cp_grad 2 dpo-cp2 "${dpo[@]}"
grep -q "rewards/margins" "$dir/dpo-cp2-rank0.log" || fail "dpo over 2 ranks prints no metrics"
out="$(compare "$dir/dpo-one.safetensors" "$dir/dpo-cp2.safetensors")" || fail "qwen3 dpo, 2 ranks: $out"
echo "qwen3 dpo, 2 ranks: $out"

# Data parallel x context parallel: 4 processes, 2 data ranks (each computing its share of the
# sequences) x 2 context ranks (each holding half of every position); rank 0 writes the sum.
WORLD=4 cp_grad 2 sft-dp2cp2 --model "$dir/qwen3" --dtype float64 --data "$dir/sft.jsonl" --layout packed --chunk 2 \
  --logits-chunk 3 --key-chunk 2
grep -q "data x context parallel: 2 x 2 ranks" "$dir/sft-dp2cp2-rank0.log" || fail "rank 0 does not report DP x CP"
out="$(compare "$dir/qwen3-one.safetensors" "$dir/sft-dp2cp2.safetensors")" || fail "qwen3 sft, 2 x 2 ranks: $out"
echo "qwen3 sft, data 2 x context 2 ranks: $out"
WORLD=4 cp_grad 2 dpo-dp2cp2 "${dpo[@]}"
out="$(compare "$dir/dpo-one.safetensors" "$dir/dpo-dp2cp2.safetensors")" || fail "qwen3 dpo, 2 x 2 ranks: $out"
echo "qwen3 dpo, data 2 x context 2 ranks: $out"

# train: three AdamW steps with clipping; rank 0's checkpoint holds one process's weights.
train=(--model "$dir/qwen3" --dtype float64 --data "$dir/sft.jsonl" --steps 3 --lr 0.01 --chunk 2 --logits-chunk 3)
"$server" train "${train[@]}" --save "$dir/train-one" > "$dir/train-one.log" 2>&1 || fail "train"
cp_run 2 train-cp2 train "${train[@]}" --save "$dir/train-cp2"
grep -q "context parallel: 2 ranks" "$dir/train-cp2-rank0.log" || fail "train over 2 ranks does not say so"
[ ! -s "$dir/train-cp2-rank1.log" ] || fail "rank 1 of train printed: $(cat "$dir/train-cp2-rank1.log")"
out="$(compare "$dir/train-one/model.safetensors" "$dir/train-cp2/model.safetensors")" || fail "qwen3 train, 2 ranks: $out"
echo "qwen3 train, 2 ranks: $out"
WORLD=4 cp_run 2 train-dp2cp2 train "${train[@]}" --save "$dir/train-dp2cp2"
grep -q "data parallel: 2 ranks" "$dir/train-dp2cp2-rank0.log" || fail "train over 2 x 2 ranks does not say so"
out="$(compare "$dir/train-one/model.safetensors" "$dir/train-dp2cp2/model.safetensors")" || fail "qwen3 train, 2 x 2 ranks: $out"
echo "qwen3 train, data 2 x context 2 ranks: $out"
# ZeRO-2 over the data groups: the same weights, and rank 0's checkpoint holds the whole
# optimizer state (every data rank's share, gathered), equal to one process's.
STREAMBP_ZERO_STAGE=2 WORLD=4 cp_run 2 train-zero2 train "${train[@]}" --save "$dir/train-zero2"
out="$(compare "$dir/train-one/model.safetensors" "$dir/train-zero2/model.safetensors")" || fail "qwen3 train, 2 x 2 ranks, ZeRO-2: $out"
/usr/bin/python3 - "$dir/train-one/optimizer.safetensors" "$dir/train-zero2/optimizer.safetensors" <<'PY' \
  || fail "the ZeRO-2 checkpoint's optimizer state differs from one process's"
import json, struct, sys
def read(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: (v["dtype"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items() if k != "__metadata__"}
a, b = read(sys.argv[1]), read(sys.argv[2])
assert a.keys() == b.keys(), sorted(set(a) ^ set(b))[:5]
worst = 0.0
for k, (dtype, raw) in a.items():
    if k == "rng_state" or dtype != "F64":
        continue
    x = struct.unpack("<%dd" % (len(raw) // 8), raw)
    y = struct.unpack("<%dd" % (len(b[k][1]) // 8), b[k][1])
    scale = max(max(abs(v) for v in x), 1e-300)
    worst = max(worst, max(abs(p - q) for p, q in zip(x, y)) / scale)
assert worst <= 1e-10, worst
print("optimizer state: %d tensors, worst relative difference %.1e" % (len(a), worst))
PY
echo "qwen3 train, data 2 x context 2 ranks, ZeRO-2: $out"

# verify: the split stream engine is one more row, against full's gradients (float64), with a
# Gemma3 model (sliding windows) over 2 ranks; rank 0 prints it, rank 1 nothing.
cp_run 2 verify-cp2 verify --model "$dir/gemma3" --dtype float64 --seq-len 24 --batch 2 --layout packed
grep -q "^stream cp2 " "$dir/verify-cp2-rank0.log" || fail "verify prints no split row: $(cat "$dir/verify-cp2-rank0.log")"
grep -q "PASS: all engines" "$dir/verify-cp2-rank0.log" || fail "verify over 2 ranks did not pass"
[ ! -s "$dir/verify-cp2-rank1.log" ] || fail "rank 1 of verify printed: $(cat "$dir/verify-cp2-rank1.log")"
echo "verify over 2 ranks: $(grep "^stream cp2 " "$dir/verify-cp2-rank0.log")"

# --context-parallel 1 (the default) is one process even inside a job that exports WORLD_SIZE:
# no rendezvous (MASTER_PORT 1 would refuse it), the gradient of one process.
WORLD_SIZE=2 RANK=1 MASTER_PORT=1 STREAMBP_DIST_TIMEOUT=5 "$server" grad "${dpo[@]}" --out "$dir/dpo-env.safetensors" \
  > "$dir/dpo-env.log" 2>&1 || fail "grad without --context-parallel inside a WORLD_SIZE=2 environment"
out="$(compare "$dir/dpo-one.safetensors" "$dir/dpo-env.safetensors")" || fail "grad in a WORLD_SIZE environment: $out"

# Without the processes' environment: the error says what to set, and nothing is written.
out="$(env -u WORLD_SIZE -u RANK "$server" grad --context-parallel 2 --model "$dir/qwen3" --data "$dir/sft.jsonl" \
  --out "$dir/none.safetensors" 2>&1)" && fail "grad --context-parallel 2 without WORLD_SIZE succeeded"
grep -q "runs as D x 2 processes (D data-parallel groups of 2) with RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set; WORLD_SIZE is 1" <<<"$out" \
  || fail "unclear error: $out"
[ ! -e "$dir/none.safetensors" ] || fail "a refused run wrote a file"
echo "PASS"
