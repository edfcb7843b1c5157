#!/usr/bin/env bash
# The main job: install what is missing, build, and start streambp-server on the embedded
# default model (a tiny Qwen3-architecture model made from a seed; nothing is downloaded),
# listening on 127.0.0.1:50051 until Ctrl-C. Arguments go to `streambp-server serve`
# (e.g. --model DIR --listen 0.0.0.0:50051 --config FILE.json).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
server="${BUILD_DIR:-$root/build}/server/streambp-server"
echo "main: first, the three engines must agree on this machine (float64):"
"$server" verify --dtype float64 --layout packed --seq-len 96 --batch 4
echo
echo "main: starting the server (Ctrl-C drains and stops it); train against it with"
echo "  build/client/streambp train --server 127.0.0.1:50051 --objective sft --data FILE.jsonl"
# The embedded demo model learns visibly at lr 1e-3 (the trainer's default, 1e-5, is for real
# models); a --model, --config or --lr of the caller's decides instead.
demo=(--lr 1e-3)
for arg in "$@"; do
  case "$arg" in --model|--model=*|--config|--config=*|--lr|--lr=*) demo=() ;; esac
done
exec "$server" serve --listen "${STREAMBP_LISTEN:-127.0.0.1:50051}" "${demo[@]}" "$@"
