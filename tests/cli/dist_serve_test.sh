#!/usr/bin/env bash
# A 2-process data-parallel server on loopback (Gloo): a client trains through rank 0;
# both ranks end with identical weights; killing rank 1 makes rank 0 answer UNAVAILABLE
# within the timeout instead of hanging.
set -uo pipefail
server="$1"; cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
free_port() { /usr/bin/python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

launch() {  # launch NAME ZERO_STAGE TIMEOUT ; starts rank 1 then rank 0, sets port, pid0, pid1
  local name="$1" zero="$2" timeout="$3" master; master="$(free_port)"
  cat > "$dir/$name.json" <<JSON
{"model": {"dtype": "float64"}, "checkpoint_dir": "$dir/$name-ckpt", "shutdown": {"checkpoint_on_exit": true},
 "trainer": {"optimizer": {"name": "adamw", "lr": 0.01}}, "log": {"level": "info"}}
JSON
  local common=(MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=2 STREAMBP_ZERO_STAGE="$zero" STREAMBP_DIST_TIMEOUT="$timeout")
  env "${common[@]}" RANK=1 "$server" serve --config "$dir/$name.json" --listen 127.0.0.1:0 > "$dir/$name-rank1.log" 2>&1 &
  pid1=$!; pids+=("$pid1")
  env "${common[@]}" RANK=0 "$server" serve --config "$dir/$name.json" --listen 127.0.0.1:0 \
    --port-file "$dir/$name.port" > "$dir/$name-rank0.log" 2>&1 &
  pid0=$!; pids+=("$pid0")
  for _ in $(seq 1 600); do [ -s "$dir/$name.port" ] && break; sleep 0.1; done
  [ -s "$dir/$name.port" ] || fail "rank 0 of $name did not start"
  port="$(cat "$dir/$name.port")"
}

printf '{"tokens":[1,5,9,13,17,21,25,29]}\n{"prompt":[2,4,6],"completion":[8,10,12,14]}\n{"tokens":[3,6,9,12,15]}\n{"tokens":[7,14,21,28,35,42]}\n' > "$dir/sft.jsonl"
for zero in 0 1; do
  launch "z$zero" "$zero" 30
  "$cli" info --server "127.0.0.1:$port" > "$dir/info.out" || fail "info"
  grep -q "world size 2" "$dir/info.out" || fail "GetInfo does not report world size 2: $(cat "$dir/info.out")"
  "$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/sft.jsonl" --steps 4 --batch-size 4 \
    > "$dir/z$zero-train.log" 2>&1 || fail "training through rank 0 (zero $zero)"
  kill -TERM "$pid0"
  wait "$pid0" || fail "rank 0 did not exit 0"
  wait "$pid1" || fail "rank 1 did not exit 0 after rank 0 stopped"
  cmp -s "$dir/z$zero-ckpt/shutdown-4/model.safetensors" "$dir/z$zero-ckpt/replica-1.safetensors" \
    || fail "the ranks' weights differ (zero $zero)"
  echo "zero stage $zero: 4 steps through rank 0; both ranks hold identical weights"
done

# Sessions under data parallel: two LoRA sessions trained through rank 0; rank 1 holds the same
# adapters bit for bit, and they equal a single process's (float64, 1e-10: the ranks sum
# gradients in another order).
sessions_config() {  # NAME
  cat > "$dir/$1.json" <<JSON
{"model": {"dtype": "float64"}, "checkpoint_dir": "$dir/$1-ckpt", "sessions": {"enabled": true},
 "trainer": {"optimizer": {"name": "adamw", "lr": 0.01}}}
JSON
}
train_sessions() {  # ADDR NAME
  "$cli" session create --server "$1" --name a --lora-rank 4 --seed 3 > /dev/null || fail "$2: create a"
  "$cli" session create --server "$1" --name b --lora-rank 2 --seed 5 > /dev/null || fail "$2: create b"
  "$cli" train --server "$1" --session a --objective sft --data "$dir/sft.jsonl" --steps 3 --batch-size 4 \
    > "$dir/$2-a.log" 2>&1 || fail "$2: train a: $(cat "$dir/$2-a.log")"
  "$cli" train --server "$1" --session b --objective sft --data "$dir/sft.jsonl" --steps 2 --batch-size 2 \
    > "$dir/$2-b.log" 2>&1 || fail "$2: train b: $(cat "$dir/$2-b.log")"
  for s in a b; do
    "$cli" export-weights --server "$1" --session $s --out "$dir/$2-$s" > /dev/null || fail "$2: export $s"
  done
}
sessions_config single
"$server" serve --config "$dir/single.json" --listen 127.0.0.1:0 --port-file "$dir/single.port" > "$dir/single.log" 2>&1 &
single_pid=$!; pids+=("$single_pid")
for _ in $(seq 1 300); do [ -s "$dir/single.port" ] && break; sleep 0.1; done
train_sessions "127.0.0.1:$(cat "$dir/single.port")" single
kill -TERM "$single_pid"; wait "$single_pid"
master="$(free_port)"
sessions_config dps
dist_env=(MASTER_ADDR=127.0.0.1 MASTER_PORT="$master" WORLD_SIZE=2 STREAMBP_DIST_TIMEOUT=30)
env "${dist_env[@]}" RANK=1 "$server" serve --config "$dir/dps.json" --listen 127.0.0.1:0 > "$dir/dps-rank1.log" 2>&1 &
pid1=$!; pids+=("$pid1")
env "${dist_env[@]}" RANK=0 "$server" serve --config "$dir/dps.json" --listen 127.0.0.1:0 --port-file "$dir/dps.port" \
  > "$dir/dps-rank0.log" 2>&1 &
pid0=$!; pids+=("$pid0")
for _ in $(seq 1 600); do [ -s "$dir/dps.port" ] && break; sleep 0.1; done
[ -s "$dir/dps.port" ] || fail "rank 0 with sessions did not start"
train_sessions "127.0.0.1:$(cat "$dir/dps.port")" dps
# A deleted session leaves no copy on rank 1 (rank 1 writes one whenever rank 0 drops a session).
"$cli" session create --server "127.0.0.1:$(cat "$dir/dps.port")" --name gone --lora-rank 2 > /dev/null || fail "create gone"
"$cli" session delete --server "127.0.0.1:$(cat "$dir/dps.port")" gone > /dev/null || fail "delete gone"
kill -TERM "$pid0"
wait "$pid0" || fail "rank 0 with sessions did not exit 0"
wait "$pid1" || fail "rank 1 with sessions did not exit 0: $(tail -3 "$dir/dps-rank1.log")"
[ ! -e "$dir/dps-ckpt/replica-1-gone.safetensors" ] || fail "rank 1 kept a copy of the deleted session 'gone'"
[ -e "$dir/dps-ckpt/replica-1-a.safetensors" ] || fail "rank 1 wrote no copy of session a"
/usr/bin/python3 - "$dir" "$(dirname "${BASH_SOURCE[0]}")/../../client/python" <<'PY' || fail "sessions under data parallel"
import sys
sys.path.insert(0, sys.argv[2])
from streambp.safetensors import load_safetensors
d = sys.argv[1]
for s in "ab":
    rank0 = load_safetensors(f"{d}/dps-{s}/adapter_model.safetensors")
    rank1 = load_safetensors(f"{d}/dps-ckpt/replica-1-{s}.safetensors")
    single = load_safetensors(f"{d}/single-{s}/adapter_model.safetensors")
    assert sorted(rank0) == sorted(rank1) == sorted(single) and rank0, (s, sorted(rank0)[:3], sorted(rank1)[:3])
    worst = 0.0
    for name, t in rank0.items():
        assert t.values == rank1[name].values, f"session {s}: {name} differs between the ranks"
        scale = max(max(abs(v) for v in single[name].values), 1e-30)
        worst = max(worst, max(abs(a - b) for a, b in zip(t.values, single[name].values)) / scale)
    assert worst <= 1e-10, f"session {s}: data parallel vs one process: {worst:.3e}"
    print(f"session {s}: {len(rank0)} adapter tensors, ranks bit-identical, vs one process {worst:.1e}")
PY
echo "sessions under data parallel: both ranks hold the same adapters, equal to one process's"

launch dead 0 4
kill -9 "$pid1"
start=$(date +%s)
"$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/sft.jsonl" --steps 1 > "$dir/dead.out" 2>&1 && fail "a step succeeded with a dead rank"
grep -q "UNAVAILABLE" "$dir/dead.out" || fail "expected UNAVAILABLE, got: $(cat "$dir/dead.out")"
elapsed=$(( $(date +%s) - start ))
[ "$elapsed" -lt 60 ] || fail "took ${elapsed}s to notice the dead rank"
echo "dead rank: rank 0 answered UNAVAILABLE after ${elapsed}s: $(grep -o 'UNAVAILABLE.*' "$dir/dead.out" | head -c 160)"
kill -TERM "$pid0"; wait "$pid0"
echo "distributed serve tests: all passed"
