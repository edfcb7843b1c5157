#!/usr/bin/env bash
# The main job: install what is missing, build, and prove on the embedded default model
# that the three engines give the same loss and gradients (float64 and float32).
# Arguments are passed to `streambp-server verify` (e.g. --model DIR --data FILE.jsonl).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
server="${BUILD_DIR:-$root/build}/server/streambp-server"
if [ $# -gt 0 ]; then
  exec "$server" verify "$@"
fi
"$server" verify --dtype float64 --layout packed --seq-len 192 --batch 4
echo
"$server" verify --dtype float32 --layout left --seq-len 256 --batch 2
