#!/usr/bin/env bash
# The package's quickstart example against a real server gets the same TrainStep loss as the
# C++ client on the same batch (two fresh float64 servers, same model). Run by tests/node/run.sh
# in the package built by tests/node/setup.sh.
#
# usage: example_test.sh SERVER_BIN CLI_BIN
set -uo pipefail
server="$1"; cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/../cli/common.sh"
start() {
  "$server" serve --listen 127.0.0.1:0 --port-file "$dir/$1.port" --dtype float64 > "$dir/$1.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 600); do [ -s "$dir/$1.port" ] && break; sleep 0.1; done
  [ -s "$dir/$1.port" ] || fail "server $1 did not start"
}
start a; start b
out="$(node build/examples/quickstart.js --server "127.0.0.1:$(cat "$dir/a.port")" --json)" || fail "node example: $out"
printf '{"tokens":[1,5,9,13,17,21,25,29,33,37],"loss_mask":[0,0,1,1,1,1,1,1,1,1]}\n{"prompt":[2,4,6],"completion":[8,10,12,14]}\n' > "$dir/batch.jsonl"
"$cli" train --server "127.0.0.1:$(cat "$dir/b.port")" --objective sft --data "$dir/batch.jsonl" --steps 1 > "$dir/cpp.out" 2>&1 \
  || fail "C++ client: $(cat "$dir/cpp.out")"
node - "$out" "$dir/cpp.out" <<'JS' || fail "losses differ"
const fs = require('fs');
const node = JSON.parse(process.argv[2]);
const cpp = Number(/loss ([0-9.]+)/.exec(fs.readFileSync(process.argv[3], 'utf8'))[1]);
if (node.policy_version !== 1 || node.targets !== 12 || node.logprobs.length !== 4) throw new Error(JSON.stringify(node));
if (!(Math.abs(node.loss - cpp) <= 1e-6 * Math.abs(cpp))) throw new Error(`${node.loss} vs ${cpp}`);
console.log(`node loss ${node.loss.toFixed(6)} == C++ client loss ${cpp.toFixed(6)}`);
JS
echo "node example: passed"
