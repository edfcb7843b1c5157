#!/usr/bin/env bash
# The user-facing commands of streambp-server, run as a user would: init-model writes an HF
# folder, grad writes gradients that load back, verify passes and fails when it should,
# and bad input gives a clear error and a non-zero exit.
set -uo pipefail
server="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
expect_error() {  # expect_error "substring" cmd...
  local want="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then fail "expected failure: $*"; fi
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' in: $out"
}

"$server" init-model --preset tiny --seed 7 --out "$dir/model" >/dev/null || fail "init-model"
[ -f "$dir/model/config.json" ] && [ -f "$dir/model/model.safetensors" ] || fail "init-model wrote no HF folder"
grep -q '"Qwen3ForCausalLM"' "$dir/model/config.json" || fail "config.json architecture"
# Deterministic: the same seed writes the same bytes.
"$server" init-model --preset tiny --seed 7 --out "$dir/model2" >/dev/null
cmp -s "$dir/model/model.safetensors" "$dir/model2/model.safetensors" || fail "init-model is not deterministic"

printf '{"tokens":[1,2,3,4,5,6,7,8,9]}\n{"prompt":[10,11,12],"completion":[13,14,15,16]}\n' > "$dir/data.jsonl"
for engine in full checkpoint stream; do
  "$server" grad --model "$dir/model" --data "$dir/data.jsonl" --engine $engine --dtype float64 \
    --chunk 3 --logits-chunk 2 --out "$dir/g_$engine.safetensors" > "$dir/g_$engine.txt" || fail "grad $engine"
  grep -q "over 12 target tokens" "$dir/g_$engine.txt" || fail "grad $engine output: $(cat "$dir/g_$engine.txt")"
done
# The sizes the step ran with: the given chunk and logits chunk, the key tile from the rule.
grep -Eq "\(stream engine, chunks 3/2/[0-9]+, [0-9.]+ s\)" "$dir/g_stream.txt" \
  || fail "grad stream does not say its chunk sizes: $(cat "$dir/g_stream.txt")"
out="$("$server" verify --model "$dir/model" --data "$dir/data.jsonl" --dtype float64 --layout packed)" \
  || fail "verify float64: $out"
grep -q "PASS" <<<"$out" || fail "verify did not say PASS"
# --keep-attention (selective recompute): the same gradient file, byte for byte; verify runs
# it as its stream row; other engines refuse it by name.
"$server" grad --model "$dir/model" --data "$dir/data.jsonl" --engine stream --dtype float64 --chunk 3 \
  --logits-chunk 2 --keep-attention --out "$dir/g_keep.safetensors" > "$dir/g_keep.txt" || fail "grad --keep-attention"
cmp -s "$dir/g_stream.safetensors" "$dir/g_keep.safetensors" || fail "grad --keep-attention wrote other gradients"
out="$("$server" verify --model "$dir/model" --data "$dir/data.jsonl" --dtype float64 --keep-attention)" \
  || fail "verify --keep-attention: $out"
grep -q "^stream:keep " <<<"$out" && grep -q "PASS" <<<"$out" || fail "verify --keep-attention: $out"
expect_error "keep_attention needs the stream engine" "$server" grad --model "$dir/model" --data "$dir/data.jsonl" \
  --engine checkpoint --keep-attention --out "$dir/x.safetensors"
# Every family as a folder with no download: init-model --family writes it, grad and verify
# (engines against each other in float64) run on it; windows narrowed to 5 tokens so that
# the 24-token rows slide past them (qwen3_moe: a window switched on).
for family in llama qwen2 mistral gemma3 qwen3_moe; do
  "$server" init-model --preset tiny --family $family --seed 3 --out "$dir/m_$family" >/dev/null || fail "init-model $family"
  python3 - "$dir/m_$family/config.json" <<'PY' || fail "edit $family config.json"
import json, sys
path = sys.argv[1]
c = json.load(open(path))
if c.get("sliding_window"):
    c["sliding_window"] = 5
if c["model_type"] == "qwen3_moe":
    c.update(use_sliding_window=True, sliding_window=5)
json.dump(c, open(path, "w"))
PY
  "$server" grad --model "$dir/m_$family" --data "$dir/data.jsonl" --engine stream --dtype float64 \
    --chunk 3 --logits-chunk 2 --out "$dir/g_$family.safetensors" >/dev/null || fail "grad $family"
  out="$("$server" verify --model "$dir/m_$family" --dtype float64 --seq-len 24 --batch 3 --layout packed)" \
    || fail "verify $family: $out"
  grep -q "PASS" <<<"$out" || fail "verify $family did not say PASS"
done
grep -q '"Gemma3ForCausalLM"' "$dir/m_gemma3/config.json" || fail "gemma3 config.json architecture"
grep -q '"Qwen3MoeForCausalLM"' "$dir/m_qwen3_moe/config.json" || fail "qwen3_moe config.json architecture"
expect_error "--family: gpt2 not in" "$server" init-model --family gpt2 --out "$dir/x"
# DPO and GRPO, synthetic and from files, with options.
for args in "--objective dpo" "--objective dpo --objective-options {\"loss_type\":\"ipo\"}" \
            "--objective grpo" "--objective grpo --objective-options {\"beta\":0.04,\"importance_sampling_level\":\"sequence\"}"; do
  # shellcheck disable=SC2086
  out="$("$server" verify --dtype float64 --seq-len 24 --batch 3 --layout packed $args)" || fail "verify $args: $out"
  grep -q "PASS" <<<"$out" || fail "verify $args did not pass"
done
printf '{"prompt":[1,2,3],"chosen":[4,5],"rejected":[6,7,8]}\n{"prompt":[9],"chosen":[10],"rejected":[11,12],"ref_chosen_logp":-3.5,"ref_rejected_logp":-6.0}\n' > "$dir/dpo.jsonl"
"$server" grad --model "$dir/model" --data "$dir/dpo.jsonl" --objective dpo --out "$dir/g_dpo.safetensors" \
  | grep -q "rewards/margins" || fail "grad dpo prints no metrics"
printf '{"prompt":[1,2],"completions":[{"tokens":[3,4],"reward":1.0,"logprobs":[-5.5,-5.6]},{"tokens":[5],"reward":0.0,"logprobs":[-5.4]}]}\n' > "$dir/grpo.jsonl"
"$server" grad --model "$dir/model" --data "$dir/grpo.jsonl" --objective grpo --out "$dir/g_grpo.safetensors" \
  | grep -q "is_ratio/mean" || fail "grad grpo does not apply the importance-sampling correction"
expect_error "alone in its group" "$server" grad --model "$dir/model" --objective grpo --out "$dir/x.safetensors" \
  --data <(echo '{"prompt":[1],"completions":[{"tokens":[3],"reward":1}]}')
expect_error "unknown option 'betta'" "$server" verify --objective dpo --objective-options '{"betta":1}'
# Tinker's losses from files (one sampler log-prob and advantage per token after the first)
# and synthetic in verify (the engines agree in float64), with options.
printf '{"tokens":[1,2,3,4],"logprobs":[-5.5,-5.6,-5.4],"advantages":[1.0,-0.5,0.25]}\n{"tokens":[5,6,7],"logprobs":[-5.1,-5.9],"advantages":[-1.0,2.0],"loss_mask":[0,0,1]}\n' > "$dir/ppo.jsonl"
"$server" grad --model "$dir/model" --data "$dir/ppo.jsonl" --objective ppo --objective-options '{"clip_low_threshold":0.9}' \
  --out "$dir/g_ppo.safetensors" > "$dir/g_ppo.txt" || fail "grad ppo: $(cat "$dir/g_ppo.txt")"
grep -q "over 4 target tokens" "$dir/g_ppo.txt" && grep -q "clip_fraction" "$dir/g_ppo.txt" \
  || fail "grad ppo output: $(cat "$dir/g_ppo.txt")"
for args in "--objective importance_sampling" "--objective cispo" "--objective dro --objective-options {\"beta\":0.5}" \
            "--objective cross_entropy"; do
  # shellcheck disable=SC2086
  out="$("$server" verify --dtype float64 --seq-len 24 --batch 3 --layout packed $args)" || fail "verify $args: $out"
  grep -q "PASS" <<<"$out" || fail "verify $args did not pass"
done
expect_error "advantages has 1 entries; it needs 2" "$server" grad --model "$dir/model" --objective dro \
  --out "$dir/x.safetensors" --data <(echo '{"tokens":[1,2,3],"logprobs":[-1,-2],"advantages":[1]}')
expect_error "unknown option 'beta'" "$server" verify --objective ppo --objective-options '{"beta":1}'

# A tolerance nothing can meet must fail (the check can fail).
if "$server" verify --model "$dir/model" --dtype float32 --seq-len 16 --tolerance 1e-300 >/dev/null; then
  fail "verify passed an impossible tolerance"
fi

expect_error "tokens[1] = 999 is outside the vocabulary" \
  "$server" grad --model "$dir/model" --data <(echo '{"tokens":[1,999]}') --out "$dir/x.safetensors"
expect_error ":2: not valid JSON" \
  "$server" grad --model "$dir/model" --data <(printf '{"tokens":[1,2]}\n{oops\n') --out "$dir/x.safetensors"
expect_error "does not exist" "$server" verify --model "$dir/nope"
expect_error "unknown objective 'dpx'" \
  "$server" grad --model "$dir/model" --data "$dir/data.jsonl" --objective dpx --out "$dir/x.safetensors"
expect_error "float16 is not supported on the CPU" "$server" verify --dtype float16
# --device (docs/gpu.md): a CUDA device on this CPU build is refused before anything loads.
if ! "$server" --version | grep -q "device available"; then
  expect_error "no CUDA device to use" "$server" grad --device cuda --data "$dir/data.jsonl" --out "$dir/x.safetensors"
  expect_error "no CUDA device to use" "$server" verify --device cuda:0
fi
expect_error "is not a device" "$server" verify --device tpu
head -c 100 "$dir/model/model.safetensors" > "$dir/model2/model.safetensors"
expect_error "model.safetensors" "$server" verify --model "$dir/model2"
[ ! -e "$dir/x.safetensors" ] || fail "a failed grad left an output file"
# LoRA: train an adapter on the frozen base, write the PEFT folder and the merged model; the
# gradients of grad --adapter are named exactly as adapter_model.safetensors; the merged
# model gives the loss of base + adapter; verify --adapter passes.
"$server" init-model --preset tiny --seed 7 --dtype float64 --out "$dir/base64" >/dev/null || fail "init-model f64"
base_sum="$(sha256sum < "$dir/base64/model.safetensors")"
"$server" train --model "$dir/base64" --dtype float64 --data "$dir/data.jsonl" --steps 4 --lr 0.01 --lora-rank 4 \
  --save-adapter "$dir/adapter" --save-merged "$dir/merged" > "$dir/lora.txt" || fail "train --lora-rank: $(cat "$dir/lora.txt")"
grep -q "adapter: LoRA r 4" "$dir/lora.txt" || fail "train output: $(cat "$dir/lora.txt")"
[ "$(sha256sum < "$dir/base64/model.safetensors")" = "$base_sum" ] || fail "training an adapter changed the base"
"$server" grad --model "$dir/base64" --dtype float64 --adapter "$dir/adapter" --data "$dir/data.jsonl" \
  --out "$dir/ga.safetensors" > "$dir/ga.txt" || fail "grad --adapter: $(cat "$dir/ga.txt")"
"$server" grad --model "$dir/merged" --dtype float64 --data "$dir/data.jsonl" --out "$dir/gm.safetensors" \
  > "$dir/gm.txt" || fail "grad merged"
# A safetensors file's JSON header, for the two checks below.
cat > "$dir/st_header.py" <<'PY'
import json, struct
def header(path):
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8:8 + n])
PY
python3 - "$dir" <<'PY' || fail "adapter gradients or merged loss"
import json, sys
d = sys.argv[1]
sys.path.insert(0, d)
from st_header import header
grads, adapter = header(f"{d}/ga.safetensors"), header(f"{d}/adapter/adapter_model.safetensors")
names = lambda h: sorted(k for k in h if k != "__metadata__")
assert names(grads) == names(adapter), (names(grads)[:3], names(adapter)[:3])
assert all(k.startswith("base_model.model.model.layers.") for k in names(grads)), names(grads)[:3]
la, lm = float(grads["__metadata__"]["loss"]), float(header(f"{d}/gm.safetensors")["__metadata__"]["loss"])
assert abs(la - lm) <= 1e-12 * abs(lm), (la, lm)
cfg = json.load(open(f"{d}/adapter/adapter_config.json"))
assert cfg["peft_type"] == "LORA" and cfg["r"] == 4 and cfg["task_type"] == "CAUSAL_LM", cfg
print(f"adapter gradients named as adapter_model.safetensors ({len(names(grads))}); merged loss {lm} == {la}")
PY
"$server" verify --model "$dir/base64" --dtype float64 --adapter "$dir/adapter" --seq-len 16 > "$dir/va.txt" \
  || fail "verify --adapter: $(cat "$dir/va.txt")"
expect_error "give --adapter (start from an adapter) or --lora-rank, not both" \
  "$server" train --model "$dir/base64" --data "$dir/data.jsonl" --steps 1 --lora-rank 2 --adapter "$dir/adapter"
# A mixture of experts: --lora-modules-to-save gate trains every router as a full copy in the
# adapter (PEFT's names and adapter_config.json), grad --adapter names its gradient the same,
# and the merged model (the router copy folded in) gives the adapter's loss.
"$server" init-model --preset tiny --family qwen3_moe --seed 7 --dtype float64 --out "$dir/moe" >/dev/null \
  || fail "init-model qwen3_moe"
"$server" train --model "$dir/moe" --dtype float64 --data "$dir/data.jsonl" --steps 2 --lr 0.01 --lora-rank 2 \
  --lora-targets q_proj --lora-modules-to-save gate --save-adapter "$dir/moe-adapter" --save-merged "$dir/moe-merged" \
  > "$dir/moe.txt" || fail "train --lora-modules-to-save gate: $(cat "$dir/moe.txt")"
"$server" grad --model "$dir/moe" --dtype float64 --adapter "$dir/moe-adapter" --data "$dir/data.jsonl" \
  --out "$dir/gma.safetensors" > /dev/null || fail "grad --adapter (router)"
"$server" grad --model "$dir/moe-merged" --dtype float64 --data "$dir/data.jsonl" --out "$dir/gmm.safetensors" \
  > /dev/null || fail "grad merged (router)"
python3 - "$dir" <<'PY' || fail "router adapter"
import json, sys
d = sys.argv[1]
sys.path.insert(0, d)
from st_header import header
grads, adapter = header(f"{d}/gma.safetensors"), header(f"{d}/moe-adapter/adapter_model.safetensors")
names = lambda h: sorted(k for k in h if k != "__metadata__")
routers = [k for k in names(adapter) if k.endswith(".mlp.gate.weight")]
assert routers and names(grads) == names(adapter), (routers, names(grads)[:3])
assert json.load(open(f"{d}/moe-adapter/adapter_config.json"))["modules_to_save"] == ["gate"]
la, lm = float(grads["__metadata__"]["loss"]), float(header(f"{d}/gmm.safetensors")["__metadata__"]["loss"])
assert abs(la - lm) <= 1e-12 * abs(lm), (la, lm)
print(f"router copies trained in the adapter ({len(routers)}); merged loss {lm} == {la}")
PY
expect_error "modules_to_save has 'lm_head'" \
  "$server" train --model "$dir/moe" --data "$dir/data.jsonl" --steps 1 --lora-rank 2 --lora-modules-to-save lm_head
echo "cli tests: all passed"
