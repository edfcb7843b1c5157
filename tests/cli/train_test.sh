#!/usr/bin/env bash
# `streambp-server train` as a user runs it: the embedded tiny model learns a repeating
# token pattern (the loss falls by more than 80% in 50 steps), --save writes a checkpoint
# folder that is also a model folder `verify` accepts, and bad input gives a clear error.
set -uo pipefail
server="$1"
dir="$(mktemp -d)"
trap 'rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

# 8 sequences of 32 tokens cycling through 10..25, each starting elsewhere in the cycle.
for i in 0 1 2 3 4 5 6 7; do
  toks=""
  for t in $(seq 0 31); do toks+="${toks:+,}$((10 + (i + t) % 16))"; done
  echo "{\"tokens\":[$toks]}"
done > "$dir/pattern.jsonl"

out="$("$server" train --data "$dir/pattern.jsonl" --objective sft --steps 50 --lr 3e-3 \
  --batch-size 4 --save "$dir/ckpt" 2>&1)" || fail "train: $out"
[ "$(grep -c '^step ' <<<"$out")" -eq 50 ] || fail "expected 50 step lines in: $out"
grep -q '^step 1/50  loss [0-9.]*  tok/s [0-9]*  grad_norm [0-9.e+-]*  lr 3.000e-03  .*token_accuracy=' <<<"$out" \
  || fail "step line format: $(grep -m1 '^step ' <<<"$out")"
summary="$(grep '^summary:' <<<"$out")" || fail "no summary line in: $out"
fall="$(sed -n 's/.*fell by \(-\{0,1\}[0-9.]*\)%.*/\1/p' <<<"$summary")"
awk -v f="$fall" 'BEGIN { exit !(f > 80) }' || fail "loss fell by only ${fall}%: $summary"

for f in config.json model.safetensors optimizer.safetensors trainer_state.json manifest.json; do
  [ -f "$dir/ckpt/$f" ] || fail "checkpoint lacks $f"
done
grep -q '"step": 50' "$dir/ckpt/trainer_state.json" || fail "trainer_state.json step"
verify="$("$server" verify --model "$dir/ckpt" --seq-len 16 2>&1)" || fail "verify of the checkpoint: $verify"
grep -q PASS <<<"$verify" || fail "verify did not pass: $verify"

# Bad input: a clear error and exit status 2, no checkpoint written.
if out="$("$server" train --data <(echo '{"tokens":[1,999]}') --steps 1 --save "$dir/bad" 2>&1)"; then
  fail "train accepted a token outside the vocabulary"
fi
grep -qF "tokens[1] = 999 is outside the vocabulary" <<<"$out" || fail "bad token message: $out"
[ ! -e "$dir/bad" ] || fail "a failed train wrote a checkpoint"
out="$("$server" train --data "$dir/pattern.jsonl" --steps 2 --schedule linear --objective-options '{"nope":1}' 2>&1)"
[ $? -eq 2 ] || fail "expected exit status 2 for a bad objective option: $out"
grep -q "unknown option 'nope'" <<<"$out" || fail "bad objective option message: $out"
echo "train cli tests: all passed"
