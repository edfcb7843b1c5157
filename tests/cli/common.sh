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

# start_server NAME ARGS...: `streambp-server serve` ($server) on a free loopback port, logging
# to $dir/NAME.log; sets port and server_pid (killed at exit).
start_server() {
  local name="$1"; shift
  rm -f "$dir/$name.port"
  "$server" serve --listen 127.0.0.1:0 --port-file "$dir/$name.port" "$@" > "$dir/$name.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 1 300); do
    [ -s "$dir/$name.port" ] && break
    kill -0 "$server_pid" 2>/dev/null || fail "server $name did not start"
    sleep 0.1
  done
  port="$(cat "$dir/$name.port")"
}
