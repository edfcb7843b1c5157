#!/usr/bin/env bash
# streambp-server serve as an operator runs it, with the streambp CLI as the client:
# config checking, JSON logs, a SIGTERM that arrives during a step (the step completes,
# the server exits 0, the shutdown checkpoint loads), export/serve round trip, and a
# stock reflection client (buf curl) when npm can fetch it.
set -uo pipefail
server="$1"
cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

cat > "$dir/config.json" <<JSON
{"checkpoint_dir": "$dir/ckpt", "shutdown": {"checkpoint_on_exit": true, "grace_seconds": 120},
 "log": {"format": "json"}, "trainer": {"optimizer": {"name": "adamw", "lr": 0.001}}}
JSON
"$server" serve --config "$dir/config.json" --check-config > "$dir/check.out" 2>&1 || fail "--check-config: $(cat "$dir/check.out")"
grep -q "config OK" "$dir/check.out" || fail "--check-config did not say OK"
echo '{"limits": {"queue_depht": 3}}' > "$dir/bad.json"
if "$server" serve --config "$dir/bad.json" --check-config > "$dir/bad.out" 2>&1; then fail "a bad config was accepted"; fi
grep -q "unknown key 'limits.queue_depht'" "$dir/bad.out" || fail "bad config message: $(cat "$dir/bad.out")"

start_server main --config "$dir/config.json"
"$cli" info --server "127.0.0.1:$port" > "$dir/info.out" || fail "info"
grep -q "Qwen3ForCausalLM" "$dir/info.out" || fail "info output: $(cat "$dir/info.out")"

# A step long enough (~ seconds) that SIGTERM lands while it runs.
python3 -c 'import json; print(json.dumps({"tokens": [i % 256 for i in range(7000)]}))' > "$dir/long.jsonl"
"$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/long.jsonl" --steps 1 --batch-tokens 8000 \
  > "$dir/train.log" 2>&1 &
train_pid=$!
sleep 1.5
kill -TERM "$server_pid"
wait "$train_pid" || fail "the step running at SIGTERM did not complete for its client"
wait "$server_pid"; rc=$?
[ "$rc" -eq 0 ] || fail "server exited $rc after SIGTERM"
grep -q "policy v1" "$dir/train.log" || fail "train output: $(cat "$dir/train.log")"
# The log is one JSON object per line, and the step finished after the signal.
python3 - "$dir/main.log" <<'PY' || fail "the JSON log is not JSON, or the step was not logged after SIGTERM"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
assert all("time" in l and "level" in l and "event" in l for l in lines), lines
sig = next(i for i, l in enumerate(lines) if l["event"] == "log" and "SIGTERM" in l["msg"])
step = next(i for i, l in enumerate(lines)
            if l["event"] == "request" and l["method"] in ("TrainStep", "TrainStepProgress"))
assert step > sig and lines[step]["code"] == "OK", (sig, step)
PY
[ -f "$dir/ckpt/shutdown-1/manifest.json" ] || fail "no shutdown checkpoint"
"$server" verify --model "$dir/ckpt/shutdown-1" --seq-len 16 > "$dir/verify.out" || fail "the shutdown checkpoint does not load"

# A new server resumes from the newest checkpoint; its exported weights serve again, identical.
start_server second --checkpoint-dir "$dir/ckpt"
# It starts a fresh model (no --resume): the first run's history is moved aside, not continued.
ls "$dir"/ckpt/metrics-*.jsonl > /dev/null 2>&1 || fail "the first run's metrics.jsonl was not kept: $(ls "$dir/ckpt")"
grep -q '"policy_version":1' "$dir"/ckpt/metrics-*.jsonl || fail "first run's history: $(cat "$dir"/ckpt/metrics-*.jsonl)"
"$cli" history --server "127.0.0.1:$port" > "$dir/history0.out" 2>&1 || fail "history: $(cat "$dir/history0.out")"
grep -q "no steps recorded yet" "$dir/history0.out" || fail "history of a fresh server: $(cat "$dir/history0.out")"
"$cli" load --server "127.0.0.1:$port" > "$dir/load.out" || fail "load: $(cat "$dir/load.out")"
grep -q "shutdown-1" "$dir/load.out" || fail "load output: $(cat "$dir/load.out")"
"$cli" export-weights --server "127.0.0.1:$port" --out "$dir/exported" > "$dir/export.out" || fail "export-weights"
cmp -s "$dir/exported/model.safetensors" "$dir/ckpt/shutdown-1/model.safetensors" || fail "exported weights differ from the checkpoint"
second_pid=$server_pid
start_server third --model "$dir/exported"
"$cli" export-weights --server "127.0.0.1:$port" --out "$dir/again" > /dev/null || fail "export from the reloaded server"
cmp -s "$dir/exported/model.safetensors" "$dir/again/model.safetensors" || fail "serve --model <export> changed the weights"

# A stock reflection client lists and calls the service (needs npm and the registry).
if command -v npm >/dev/null 2>&1 && (cd "$dir" && timeout 180 npm install --silent --no-audit --no-fund @bufbuild/buf >/dev/null 2>&1); then
  buf="$dir/node_modules/.bin/buf"
  "$buf" curl --protocol grpc --http2-prior-knowledge --list-services "http://127.0.0.1:$port" > "$dir/buf.out" 2>&1 \
    || fail "buf curl --list-services: $(cat "$dir/buf.out")"
  grep -q "^streambp.v1.Trainer$" "$dir/buf.out" || fail "reflection does not list the service: $(cat "$dir/buf.out")"
  "$buf" curl --protocol grpc --http2-prior-knowledge -d '{}' "http://127.0.0.1:$port/streambp.v1.Trainer/GetInfo" \
    > "$dir/buf.out" 2>&1 || fail "buf curl GetInfo: $(cat "$dir/buf.out")"
  grep -q '"architecture": "Qwen3ForCausalLM"' "$dir/buf.out" || fail "buf curl GetInfo output: $(cat "$dir/buf.out")"
  echo "buf curl: listed and called the service through reflection"
else
  echo "buf curl: skipped (npm or the npm registry not available)"
fi
third_pid=$server_pid

# streambp history: a line per step, and as JSON lines the server's metrics.jsonl itself.
start_server fourth --checkpoint-dir "$dir/ckpt4" --history-tensorboard
printf '{"tokens":[1,2,3,4,5,6,7,8]}\n{"tokens":[9,8,7,6,5,4]}\n' > "$dir/small.jsonl"
"$cli" train --server "127.0.0.1:$port" --data "$dir/small.jsonl" --steps 3 --batch-size 1 > "$dir/small.out" 2>&1 \
  || fail "train: $(cat "$dir/small.out")"
"$cli" history --server "127.0.0.1:$port" > "$dir/history.out" 2>"$dir/history.err" || fail "history"
[ "$(grep -c ' train ' "$dir/history.out")" -eq 3 ] || fail "history table: $(cat "$dir/history.out")"
grep -q "3 steps (newest index 3)" "$dir/history.err" || fail "history summary: $(cat "$dir/history.err")"
"$cli" history --server "127.0.0.1:$port" --jsonl --after 1 > "$dir/history.jsonl" || fail "history --jsonl"
python3 - "$dir/history.jsonl" "$dir/ckpt4/metrics.jsonl" <<'PY' || fail "history --jsonl differs from metrics.jsonl"
import json, sys
got = [json.loads(l) for l in open(sys.argv[1])]
want = [json.loads(l) for l in open(sys.argv[2])][1:]
assert [r["index"] for r in got] == [2, 3], got
assert got == want, (got, want)
PY
ls "$dir"/ckpt4/tensorboard/events.out.tfevents.* > /dev/null 2>&1 || fail "no TensorBoard event file: $(ls -R "$dir/ckpt4")"
expect_error() {  # expect_error "substring" cmd...
  local want="$1"; shift
  local out
  if out="$("$@" 2>&1)"; then fail "expected failure: $*"; fi
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' in: $out"
}
expect_error "--after: must be a record index >= 0, got -1" "$cli" history --server "127.0.0.1:$port" --after -1
kill -TERM "$server_pid" "$second_pid" "$third_pid"
wait "$server_pid" "$second_pid" "$third_pid" 2>/dev/null
echo "serve tests: all passed"
