#!/usr/bin/env bash
# The README's text example, as a user runs it: a tiny model around the real Qwen3 tokenizer,
# SFT from a TRL `messages` JSONL file, text sampled back; the shell tools tokenize and
# render; the exported folder carries the tokenizer.
# usage: text_test.sh STREAMBP_SERVER STREAMBP_CLI SOURCE_DIR TEXT_REFERENCE_DIR
set -uo pipefail
server="$1"; cli="$2"; src="$3"; ref="$4"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
if [ ! -e "$ref/COMPLETE" ]; then
  echo "text reference unavailable: $(cat "$ref/UNAVAILABLE" 2>/dev/null)"; exit 0
fi
tok="$ref/models/qwen3"

"$server" init-model --preset tiny --tokenizer "$tok" --out "$dir/model" > "$dir/init.out" 2>&1 \
  || fail "init-model --tokenizer: $(cat "$dir/init.out")"
grep -q "tokenizer of" "$dir/init.out" || fail "init-model output: $(cat "$dir/init.out")"
for f in tokenizer.json tokenizer_config.json config.json model.safetensors; do
  [ -e "$dir/model/$f" ] || fail "init-model did not write $f"
done
python3 - "$dir/model/config.json" <<'PY' || fail "config.json of the model around the tokenizer"
import json, sys
c = json.load(open(sys.argv[1]))
assert c["vocab_size"] == 151680 and c["vocab_size"] % 64 == 0, c["vocab_size"]
assert c["eos_token_id"] == 151645, c["eos_token_id"]
PY

# The shell tools: the tokenizer's ids and the chat format's rendering.
out="$(echo '{"text": "Hello world"}' | "$server" tokenize --model "$dir/model")" || fail "tokenize: $out"
[ "$out" = '{"ids":[9707,1879]}' ] || fail "tokenize Hello world: $out"
out="$(echo '{"messages":[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"}]}' \
       | "$server" render --model "$dir/model")" || fail "render: $out"
python3 - "$out" <<'PY' || fail "render output: $out"
import json, sys
r = json.loads(sys.argv[1])
assert r["format"] == "qwen3" and r["text"].startswith("<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"), r
assert len(r["ids"]) == len(r["loss_mask"]) and 0 < sum(r["loss_mask"]) < len(r["ids"]), r
PY
if echo '{"messages":[{"role":"bot","content":"x"}]}' | "$server" render --model "$dir/model" > "$dir/bad.out" 2>&1; then
  fail "render accepted role bot"
fi
grep -q "role 'bot'" "$dir/bad.out" || fail "bad role message: $(cat "$dir/bad.out")"

# Serve it, train on chat data, sample text back.
"$server" serve --model "$dir/model" --listen 127.0.0.1:0 --port-file "$dir/port" --lr 1e-2 \
  --checkpoint-dir "$dir/ckpt" > "$dir/server.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 300); do [ -s "$dir/port" ] && break; sleep 0.1; done
[ -s "$dir/port" ] || fail "the server did not start"
addr="127.0.0.1:$(cat "$dir/port")"
"$cli" info --server "$addr" > "$dir/info.out" || fail "info"
"$cli" train --server "$addr" --data "$src/examples/chat_sft.jsonl" --steps 6 --batch-size 4 > "$dir/train.out" 2>&1 \
  || fail "train from messages: $(cat "$dir/train.out")"
grep -q "summary: 6 steps" "$dir/train.out" || fail "train summary: $(cat "$dir/train.out")"
first="$(sed -n 's/.*first loss \([0-9.]*\), last loss \([0-9.]*\).*/\1/p' "$dir/train.out")"
last="$(sed -n 's/.*first loss \([0-9.]*\), last loss \([0-9.]*\).*/\2/p' "$dir/train.out")"
python3 -c "import sys; sys.exit(0 if float('$last') < float('$first') else 1)" \
  || fail "the loss did not fall: $first -> $last"
"$cli" sample --server "$addr" --system "Answer in one short sentence." --user "What is 2 + 2?" \
  --max-tokens 8 --temperature 0 --json > "$dir/sample.out" 2>&1 || fail "sample: $(cat "$dir/sample.out")"
python3 - "$dir/sample.out" <<'PY' || fail "sample output: $(cat "$dir/sample.out")"
import json, sys
c = json.loads(open(sys.argv[1]).read().splitlines()[0])
assert isinstance(c["text"], str) and len(c["tokens"]) <= 8 and c["finish_reason"] in ("stop", "length"), c
PY
# Text the server cannot accept: a clear error naming the field.
echo '{"messages":[{"role":"user","content":"hi"}]}' > "$dir/no_assistant.jsonl"
if "$cli" train --server "$addr" --data "$dir/no_assistant.jsonl" > "$dir/bad_train.out" 2>&1; then
  fail "a conversation without an assistant turn was trained"
fi
grep -q "no assistant message" "$dir/bad_train.out" || fail "no-assistant message: $(cat "$dir/bad_train.out")"

# The exported folder loads as a model folder with its tokenizer.
"$cli" export-weights --server "$addr" --out "$dir/export" > "$dir/export.out" 2>&1 || fail "export: $(cat "$dir/export.out")"
cmp -s "$dir/export/tokenizer.json" "$tok/tokenizer.json" || fail "the export lacks the tokenizer"
out="$(echo '{"text": "Hello world"}' | "$server" tokenize --model "$dir/export")" || fail "tokenize the export: $out"
[ "$out" = '{"ids":[9707,1879]}' ] || fail "tokenize the export: $out"
echo "text cli tests: all passed"
