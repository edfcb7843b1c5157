#!/usr/bin/env bash
# Installs what is missing, builds, and runs the test suite (without the `slow` label;
# pass -L slow to run only those, or any other ctest arguments).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/build.sh"
build="${BUILD_DIR:-$root/build}"
if [ $# -eq 0 ]; then set -- -LE slow; fi
ctest --test-dir "$build" --output-on-failure -j "$(nproc)" "$@"
