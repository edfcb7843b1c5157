# Shared by the shell tests here; source it after `set -uo pipefail`. Gives a temporary
# folder $dir removed at exit, an array pids of background processes killed at exit, and
# fail MESSAGE, which prints the tail of every *.log in $dir before exiting 1.
dir="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  rm -rf "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do
    [ -e "$f" ] || continue
    echo "--- $f"
    tail -20 "$f"
  done
  exit 1
}
