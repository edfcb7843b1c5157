#!/usr/bin/env bash
# The Node example against a real server: it gets the same TrainStep loss as the C++ client
# on the same batch (two fresh servers, same model). Needs node and npm (npm install runs
# here, into a temporary copy); without them it says so and passes.
set -uo pipefail
server="$1"; cli="$2"; src="$3"
dir="$(mktemp -d)"; pids=()
trap 'for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done; rm -rf "$dir"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
if ! command -v node >/dev/null || ! command -v npm >/dev/null; then echo "node test: skipped (no node/npm)"; exit 0; fi
cp "$src/client/node/package.json" "$src/client/node/example.js" "$dir/"
if ! (cd "$dir" && timeout 300 npm install --silent --no-audit --no-fund >/dev/null 2>&1); then
  echo "node test: skipped (npm install failed: no registry?)"; exit 0
fi
start() {
  rm -f "$dir/$1.port"
  "$server" serve --listen 127.0.0.1:0 --port-file "$dir/$1.port" --dtype float64 > "$dir/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do [ -s "$dir/$1.port" ] && break; sleep 0.1; done
  [ -s "$dir/$1.port" ] || fail "server $1 did not start"
}
start a; start b
out="$(node "$dir/example.js" --server "127.0.0.1:$(cat "$dir/a.port")" --proto "$src/proto" --json)" || fail "node example: $out"
printf '{"tokens":[1,5,9,13,17,21,25,29,33,37],"loss_mask":[0,0,1,1,1,1,1,1,1,1]}\n{"prompt":[2,4,6],"completion":[8,10,12,14]}\n' > "$dir/batch.jsonl"
"$cli" train --server "127.0.0.1:$(cat "$dir/b.port")" --objective sft --data "$dir/batch.jsonl" --steps 1 > "$dir/cpp.out" 2>&1 \
  || fail "C++ client: $(cat "$dir/cpp.out")"
/usr/bin/python3 - "$out" "$dir/cpp.out" <<'PY' || fail "losses differ"
import json, re, sys
node = json.loads(sys.argv[1])
cpp = float(re.search(r"loss ([0-9.]+)", open(sys.argv[2]).read()).group(1))
assert node["policy_version"] == 1 and node["targets"] == 12, node
assert len(node["logprobs"]) == 4, node
assert abs(node["loss"] - cpp) <= 1e-6 * abs(cpp), (node["loss"], cpp)
print(f"node loss {node['loss']:.6f} == C++ client loss {cpp:.6f}")
PY
echo "node test: passed"
