#!/usr/bin/env bash
# A 2-process context-parallel server on loopback (Gloo): every sequence's positions split
# over the ranks (parallel.context_parallel / --context-parallel). A client trains through
# rank 0; the weights (and a LoRA session's adapter) equal one process's to 1e-10 in float64
# and are bit-identical on both ranks, and so with 4 ranks as 2 data x 2 context; EstimateMemory answers per rank; bad layouts fail at
# start with what to change; killing rank 1 makes rank 0 answer UNAVAILABLE in time.
set -uo pipefail
server="$1"; cli="$2"
grid_pids=()
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
sdk="$(dirname "${BASH_SOURCE[0]}")/../../client/python"

# Sequences of 9 to 23 tokens, a prompt/completion pair among them: each is split 2 ways.
cat > "$dir/sft.jsonl" <<'JSONL'
{"tokens":[1,5,9,13,17,21,25,29,33,37,41,45,49,53,57,61,65]}
{"prompt":[2,4,6,8,10],"completion":[12,14,16,18,20,22,24]}
{"tokens":[3,6,9,12,15,18,21,24,27]}
{"tokens":[7,14,21,28,35,42,49,56,63,70,77,84,91,98,105,112,119,126,133,140,147,154,161]}
JSONL

config() {  # NAME CONTEXT_PARALLEL [SESSIONS]
  cat > "$dir/$1.json" <<JSON
{"model": {"dtype": "float64"}, "checkpoint_dir": "$dir/$1-ckpt", "shutdown": {"checkpoint_on_exit": true},
 "sessions": {"enabled": ${3:-false}}, "parallel": {"context_parallel": $2},
 "trainer": {"optimizer": {"name": "adamw", "lr": 0.01}}, "log": {"level": "info"}}
JSON
}
wait_port() {  # FILE WHAT
  for _ in $(seq 1 600); do [ -s "$1" ] && break; sleep 0.1; done
  [ -s "$1" ] || fail "$2 did not start"
}
launch_cp() {  # NAME TIMEOUT [RANK1_CONFIG]: rank 1 (the layout by flag) then rank 0 (by its config); sets port pid0 pid1
  local name="$1" timeout="$2" rank1="${3:-$1}" master; master="$(free_port)"
  local common=(MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=2 STREAMBP_DIST_TIMEOUT="$timeout")
  env "${common[@]}" RANK=1 "$server" serve --config "$dir/$rank1.json" --context-parallel 2 --listen 127.0.0.1:0 \
    > "$dir/$name-rank1.log" 2>&1 &
  pid1=$!; pids+=("$pid1")
  env "${common[@]}" RANK=0 "$server" serve --config "$dir/$name.json" --listen 127.0.0.1:0 \
    --port-file "$dir/$name.port" > "$dir/$name-rank0.log" 2>&1 &
  pid0=$!; pids+=("$pid0")
  wait_port "$dir/$name.port" "rank 0 of $name"
  port="$(cat "$dir/$name.port")"
}
compare() {  # A B WHAT MODE: MODE exact (bit for bit) or a relative tolerance
  /usr/bin/python3 - "$1" "$2" "$3" "$4" "$sdk" <<'PY' || fail "$3"
import sys
sys.path.insert(0, sys.argv[5])
from streambp.safetensors import load_safetensors
a, b = load_safetensors(sys.argv[1]), load_safetensors(sys.argv[2])
what, mode = sys.argv[3], sys.argv[4]
assert sorted(a) == sorted(b) and a, (what, sorted(a)[:3], sorted(b)[:3])
worst = 0.0
for name, t in a.items():
    if mode == "exact":
        assert t.values == b[name].values, f"{what}: {name} differs"
        continue
    scale = max(max(abs(v) for v in b[name].values), 1e-30)
    worst = max(worst, max(abs(x - y) for x, y in zip(t.values, b[name].values)) / scale)
assert mode == "exact" or worst <= float(mode), f"{what}: {worst:.3e} > {mode}"
print(f"{what}: {len(a)} tensors, " + ("bit-identical" if mode == "exact" else f"worst relative difference {worst:.1e}"))
PY
}

# --- Bad layouts fail at start, on the rank that sees them, with what to change.
config bad 2
"$server" serve --config "$dir/bad.json" --listen 127.0.0.1:0 > "$dir/bad1.out" 2>&1 && fail "context parallel 2 started alone"
grep -q "parallel.context_parallel 2 needs a multiple of 2 ranks.*WORLD_SIZE=1" "$dir/bad1.out" || fail "no layout message: $(cat "$dir/bad1.out")"
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" WORLD_SIZE=3 RANK=0 STREAMBP_DIST_TIMEOUT=5 \
  "$server" serve --config "$dir/bad.json" --listen 127.0.0.1:0 > "$dir/bad2.out" 2>&1 && fail "context parallel 2 of 3 ranks started"
grep -q "needs a multiple of 2 ranks (WORLD_SIZE = data parallel x context parallel.*got WORLD_SIZE=3" "$dir/bad2.out" \
  || fail "no DP x CP message: $(cat "$dir/bad2.out")"
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" WORLD_SIZE=2 RANK=1 STREAMBP_ZERO_STAGE=1 STREAMBP_DIST_TIMEOUT=5 \
  "$server" serve --config "$dir/bad.json" --listen 127.0.0.1:0 > "$dir/bad3.out" 2>&1 && fail "context parallel with ZeRO started"
grep -q "STREAMBP_ZERO_STAGE=0" "$dir/bad3.out" || fail "no ZeRO message: $(cat "$dir/bad3.out")"
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$(free_port)" WORLD_SIZE=2 RANK=0 STREAMBP_DIST_TIMEOUT=5 \
  "$server" serve --config "$dir/bad.json" --engine checkpoint --listen 127.0.0.1:0 > "$dir/bad4.out" 2>&1 \
  && fail "context parallel with the checkpoint engine started"
grep -q "runs the stream engine only; the configured engine is checkpoint" "$dir/bad4.out" \
  || fail "no engine message: $(cat "$dir/bad4.out")"
# Ranks started with different P (rank 0 data parallel, rank 1 context parallel): both refuse
# once the group forms, instead of training with mismatched layouts.
config mixed 1
master="$(free_port)"
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=2 RANK=1 STREAMBP_DIST_TIMEOUT=20 \
  "$server" serve --config "$dir/mixed.json" --context-parallel 2 --listen 127.0.0.1:0 > "$dir/mixed1.out" 2>&1 &
mixed1=$!; pids+=("$mixed1")
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=2 RANK=0 STREAMBP_DIST_TIMEOUT=20 \
  "$server" serve --config "$dir/mixed.json" --listen 127.0.0.1:0 > "$dir/mixed0.out" 2>&1 && fail "rank 0 started with P=1 beside P=2"
wait "$mixed1" && fail "rank 1 started with P=2 beside P=1"
for r in 0 1; do
  grep -q "the ranks disagree on parallel.context_parallel (from 1 to 2)" "$dir/mixed$r.out" \
    || fail "rank $r: no disagreement message: $(cat "$dir/mixed$r.out")"
done
"$server" serve --config "$dir/bad.json" --context-parallel 3 --check-config > "$dir/check.out" 2> /dev/null \
  || fail "--check-config with --context-parallel 3"
grep -q '"context_parallel": 3' "$dir/check.out" || fail "--check-config does not show parallel.context_parallel"
echo "bad layouts: refused at start with what to change"

# --- One process: the reference.
config single 1
"$server" serve --config "$dir/single.json" --listen 127.0.0.1:0 --port-file "$dir/single.port" > "$dir/single.log" 2>&1 &
single_pid=$!; pids+=("$single_pid")
wait_port "$dir/single.port" "the single-process server"
sport="$(cat "$dir/single.port")"
"$cli" train --server "127.0.0.1:$sport" --objective sft --data "$dir/sft.jsonl" --steps 3 --batch-size 4 \
  > "$dir/single-train.log" 2>&1 || fail "training one process"
"$cli" estimate --server "127.0.0.1:$sport" --seq-len 32768 > "$dir/single-estimate.out" || fail "estimate, one process"
"$cli" estimate --server "127.0.0.1:$sport" --seq-len 16384 > "$dir/single-half.out" || fail "estimate, one process, T/2"
kill -TERM "$single_pid"; wait "$single_pid" || fail "the single-process server did not exit 0"

# --- Context parallel over 2 ranks: the same 3 steps. Rank 1 has a checkpoint folder of its
# own: only rank 0 of the group writes checkpoints and the history (rank 1 its replica file).
config cp 2
config cp1 2
launch_cp cp 30 cp1
"$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/sft.jsonl" --steps 3 --batch-size 4 \
  > "$dir/cp-train.log" 2>&1 || fail "training through rank 0 of a context-parallel server"
# EstimateMemory: one rank's peak, below one process's at the same length (for this tiny model
# only a little: its whole-sequence K/V and batch tensors weigh as much as its layer inputs;
# tests/unit/chunks_test.cpp checks the formula), with the chunks of the rank's T/2 positions.
"$cli" estimate --server "127.0.0.1:$port" --seq-len 32768 > "$dir/cp-estimate.out" || fail "estimate, context parallel"
chunks() { grep -o "(chunk .*)" "$1"; }
[ "$(chunks "$dir/cp-estimate.out")" = "$(chunks "$dir/single-half.out")" ] \
  || fail "per-rank chunks $(chunks "$dir/cp-estimate.out") are not those of 16384 positions $(chunks "$dir/single-half.out")"
activation() { sed -n 's/^activations: *\([0-9.]*\) \([KMG]\)iB.*/\1 \2/p' "$1" | awk '{m=$2=="K"?1:$2=="M"?1024:1048576; print $1*m}'; }
one="$(activation "$dir/single-estimate.out")"; two="$(activation "$dir/cp-estimate.out")"
[ -n "$one" ] && [ -n "$two" ] || fail "no activation line: $(cat "$dir/single-estimate.out" "$dir/cp-estimate.out")"
awk -v a="$two" -v b="$one" 'BEGIN { exit !(a < 0.95 * b) }' \
  || fail "per-rank activation estimate $two KiB is not below one process's $one KiB"
echo "EstimateMemory at 32768 tokens: activations ${one} KiB in one process, ${two} KiB per rank of 2"
# A request for another engine is refused before it reaches the ranks.
"$cli" estimate --server "127.0.0.1:$port" --seq-len 64 --engine checkpoint > "$dir/cp-engine.out" 2>&1 \
  && fail "the checkpoint engine was accepted by a context-parallel server"
grep -q "INVALID_ARGUMENT.*runs the stream engine only" "$dir/cp-engine.out" || fail "engine refusal: $(cat "$dir/cp-engine.out")"
kill -TERM "$pid0"
wait "$pid0" || fail "rank 0 did not exit 0"
wait "$pid1" || fail "rank 1 did not exit 0 after rank 0 stopped"
compare "$dir/cp-ckpt/shutdown-3/model.safetensors" "$dir/single-ckpt/shutdown-3/model.safetensors" \
  "context parallel 2 vs one process, 3 AdamW steps" 1e-10
compare "$dir/cp-ckpt/shutdown-3/model.safetensors" "$dir/cp1-ckpt/replica-1.safetensors" "rank 0 vs rank 1" exact
[ "$(ls -A "$dir/cp1-ckpt")" = "replica-1.safetensors" ] \
  || fail "rank 1 wrote checkpoints or history: $(ls -A "$dir/cp1-ckpt" | tr '\n' ' ')"
# The history records each step's exchange (K/V bytes per layer: 2 gathers + 1 reduce-scatter),
# and the objective's metrics of the whole step (both ranks' positions), as one process's.
/usr/bin/python3 - "$dir/cp-ckpt/metrics.jsonl" "$dir/single-ckpt/metrics.jsonl" <<'PY' \
  || fail "the history lacks the context-parallel metrics: $(head -c 600 "$dir/cp-ckpt/metrics.jsonl")"
import json, sys
records = [json.loads(line) for line in open(sys.argv[1])]
single = [json.loads(line) for line in open(sys.argv[2])]
values = [r["context_parallel_kv_bytes_per_layer"] for r in records]
assert len(values) == 3 and all(v > 0 for v in values), values
print(f"history: context_parallel_kv_bytes_per_layer {values}")
assert len(single) == 3, single
for i, (r, s) in enumerate(zip(records, single)):
    for name in ("token_accuracy", "loss"):
        assert abs(r[name] - s[name]) <= 1e-10 * max(1.0, abs(s[name])), (i, name, r[name], s[name])
print("history: token_accuracy " + str([round(r["token_accuracy"], 4) for r in records]) + " as one process's")
PY
[ -z "$(ls -A "$dir/cp-ckpt/.staging" 2>/dev/null)" ] || fail "a save left staging folders: $(ls -A "$dir/cp-ckpt/.staging")"

# --- Data parallel x context parallel: 4 ranks, 2 data x 2 context (WORLD_SIZE 4 with
# parallel.context_parallel 2); the same 3 steps give one process's weights on every rank.
config grid 2
config grid1 2
master="$(free_port)"
for r in 3 2 1; do
  env MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=4 STREAMBP_DIST_TIMEOUT=30 RANK=$r \
    "$server" serve --config "$dir/grid1.json" --context-parallel 2 --listen 127.0.0.1:0 > "$dir/grid-rank$r.log" 2>&1 &
  pids+=($!); grid_pids+=($!)
done
env MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=4 STREAMBP_DIST_TIMEOUT=30 RANK=0 \
  "$server" serve --config "$dir/grid.json" --listen 127.0.0.1:0 --port-file "$dir/grid.port" > "$dir/grid-rank0.log" 2>&1 &
pid0=$!; pids+=("$pid0")
wait_port "$dir/grid.port" "rank 0 of the 2 x 2 server"
grep -q "context parallel 2 x data parallel 2" "$dir/grid-rank0.log" || fail "rank 0 does not log the layout: $(cat "$dir/grid-rank0.log")"
"$cli" train --server "127.0.0.1:$(cat "$dir/grid.port")" --objective sft --data "$dir/sft.jsonl" --steps 3 --batch-size 4 \
  > "$dir/grid-train.log" 2>&1 || fail "training through rank 0 of a 2 x 2 server"
kill -TERM "$pid0"
wait "$pid0" || fail "rank 0 of the 2 x 2 server did not exit 0"
for p in "${grid_pids[@]}"; do wait "$p" || fail "a rank of the 2 x 2 server did not exit 0"; done
compare "$dir/grid-ckpt/shutdown-3/model.safetensors" "$dir/single-ckpt/shutdown-3/model.safetensors" \
  "data 2 x context 2 vs one process, 3 AdamW steps" 1e-10
for r in 1 2 3; do
  compare "$dir/grid-ckpt/shutdown-3/model.safetensors" "$dir/grid1-ckpt/replica-$r.safetensors" "rank 0 vs rank $r of 2 x 2" exact
done

# --- A LoRA session under context parallel: the adapter equals one process's.
train_session() {  # ADDR NAME
  "$cli" session create --server "$1" --name a --lora-rank 4 --seed 3 > /dev/null || fail "$2: create a"
  "$cli" train --server "$1" --session a --objective sft --data "$dir/sft.jsonl" --steps 2 --batch-size 4 \
    > "$dir/$2-a.log" 2>&1 || fail "$2: train a"
  "$cli" export-weights --server "$1" --session a --out "$dir/$2-a" > /dev/null || fail "$2: export a"
}
config ssingle 1 true
"$server" serve --config "$dir/ssingle.json" --listen 127.0.0.1:0 --port-file "$dir/ssingle.port" > "$dir/ssingle.log" 2>&1 &
single_pid=$!; pids+=("$single_pid")
wait_port "$dir/ssingle.port" "the single-process session server"
train_session "127.0.0.1:$(cat "$dir/ssingle.port")" ssingle
kill -TERM "$single_pid"; wait "$single_pid"
config scp 2 true
launch_cp scp 30
train_session "127.0.0.1:$port" scp
kill -TERM "$pid0"
wait "$pid0" || fail "rank 0 with sessions did not exit 0"
wait "$pid1" || fail "rank 1 with sessions did not exit 0"
compare "$dir/scp-a/adapter_model.safetensors" "$dir/ssingle-a/adapter_model.safetensors" \
  "LoRA session, context parallel 2 vs one process" 1e-10
compare "$dir/scp-a/adapter_model.safetensors" "$dir/scp-ckpt/replica-1-a.safetensors" "LoRA session, rank 0 vs rank 1" exact

# --- A rank that dies: rank 0 answers UNAVAILABLE within the timeout, nothing applied.
config dead 2
launch_cp dead 4
kill -9 "$pid1"
start=$(date +%s)
"$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/sft.jsonl" --steps 1 > "$dir/dead.out" 2>&1 \
  && fail "a step succeeded with a dead rank"
grep -q "UNAVAILABLE" "$dir/dead.out" || fail "expected UNAVAILABLE, got: $(cat "$dir/dead.out")"
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -lt 60 ] || fail "took ${elapsed}s to notice the dead rank"
# Nothing applied: rank 0 still at version 0 (or, once it marked itself broken, UNAVAILABLE).
if "$cli" info --server "127.0.0.1:$port" > "$dir/dead-info.out" 2>&1; then
  grep -q "^policy: *version 0, step 0," "$dir/dead-info.out" || fail "a step was applied: $(cat "$dir/dead-info.out")"
else
  grep -q "UNAVAILABLE" "$dir/dead-info.out" || fail "info after the dead rank: $(cat "$dir/dead-info.out")"
fi
echo "dead rank: rank 0 answered UNAVAILABLE after ${elapsed}s"
kill -TERM "$pid0"; wait "$pid0"
echo "context-parallel serve tests: all passed"
