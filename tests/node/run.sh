#!/usr/bin/env bash
# Runs one node.* test in the package built by setup.sh: `run.sh OUT_DIR COMMAND...` runs
# COMMAND in OUT_DIR/client/node. Exit 77 (ctest: skipped) when setup.sh found no node, npm
# or registry, with the reason.
set -uo pipefail
out="$1"; shift
if [ -f "$out/UNAVAILABLE" ]; then echo "skipped: $(cat "$out/UNAVAILABLE")"; exit 77; fi
[ -f "$out/COMPLETE" ] || { echo "FAIL: the Node package was not built (the fixture node.setup failed)"; exit 1; }
cd "$out/client/node" && exec "$@"
