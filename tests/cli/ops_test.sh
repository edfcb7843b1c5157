#!/usr/bin/env bash
# Operations as an operator meets them: --version, the Prometheus endpoint of `serve`
# (metrics.listen), the log level at runtime with SIGHUP (re-read from --config, or
# toggled to debug without one), and a clean exit on SIGTERM.
set -uo pipefail
server="$1"
cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"
wait_for() {  # wait_for FILE PATTERN: up to 10 s
  for _ in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  fail "no '$2' in $1"
}

# --version: version, LibTorch, BLAS, CUDA or not.
"$server" --version > "$dir/version.out" 2>&1 || fail "--version exited non-zero: $(cat "$dir/version.out")"
for word in "streambp-server [0-9]" "LibTorch [0-9]" "BLAS " "CUDA"; do
  grep -q "$word" "$dir/version.out" || fail "--version lacks '$word': $(cat "$dir/version.out")"
done

write_config() {  # write_config LEVEL
  cat > "$dir/config.json" <<JSON
{"listen": "127.0.0.1:0", "metrics": {"listen": "127.0.0.1:0"}, "log": {"level": "$1"}}
JSON
}
write_config warn
"$server" serve --config "$dir/config.json" --check-config > "$dir/check.out" 2>&1 || fail "--check-config: $(cat "$dir/check.out")"
echo '{"log": {"level": "verbose"}}' > "$dir/bad.json"
if "$server" serve --config "$dir/bad.json" --check-config > "$dir/bad.out" 2>&1; then fail "log.level verbose was accepted"; fi

# A server at level warn: requests are not logged, metrics are served on their own port.
write_config info
"$server" serve --config "$dir/config.json" --port-file "$dir/port" > "$dir/main.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
wait_for "$dir/main.log" "metrics on http://"
write_config warn  # the file now says warn; a SIGHUP applies it
kill -HUP "$server_pid"
wait_for "$dir/main.log" "SIGHUP: log level warn from"
wait_for "$dir/port" "[0-9]"
port="$(cat "$dir/port")"
metrics_port="$(grep -o 'metrics on http://[0-9.]*:[0-9]*' "$dir/main.log" | sed 's/.*://')"
[ "$metrics_port" != "$port" ] || fail "metrics share the gRPC port"
"$cli" info --server "127.0.0.1:$port" > "$dir/info.out" || fail "info"
if grep -q "GetInfo" "$dir/main.log"; then fail "a request was logged at level warn"; fi
python3 - "$metrics_port" > "$dir/metrics.out" <<'PY' || fail "scrape: $(cat "$dir/metrics.out")"
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
print(body)
assert 'streambp_requests_total{code="OK",method="GetInfo"} 1' in body, "GetInfo not counted"
PY

# Back to info: requests are logged again.
write_config info
kill -HUP "$server_pid"
wait_for "$dir/main.log" "SIGHUP: log level info from"
"$cli" info --server "127.0.0.1:$port" > /dev/null || fail "info"
wait_for "$dir/main.log" "GetInfo"
# A broken file keeps the level.
echo '{"log": ' > "$dir/config.json"
kill -HUP "$server_pid"
wait_for "$dir/main.log" "SIGHUP: kept log level info"
# The health subcommand (container HEALTHCHECK / exec probe): SERVING, then down.
"$server" health --server "127.0.0.1:$port" > "$dir/health.out" 2>&1 || fail "health: $(cat "$dir/health.out")"
grep -q "SERVING" "$dir/health.out" || fail "health output: $(cat "$dir/health.out")"
kill -TERM "$server_pid"
wait "$server_pid"; rc=$?
[ "$rc" -eq 0 ] || fail "server exited $rc after SIGTERM"
if "$server" health --server "127.0.0.1:$port" --timeout 1 > "$dir/health2.out" 2>&1; then
  fail "health passed on a stopped server"
fi

# Without --config, SIGHUP toggles debug.
"$server" serve --listen 127.0.0.1:0 --port-file "$dir/port2" > "$dir/toggle.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
wait_for "$dir/port2" "[0-9]"
kill -HUP "$server_pid"
wait_for "$dir/toggle.log" "SIGHUP: log level debug (toggled)"
kill -HUP "$server_pid"
wait_for "$dir/toggle.log" "SIGHUP: log level info (toggled)"
kill -TERM "$server_pid"
wait "$server_pid" || fail "server exited non-zero"
echo "PASS: --version, metrics port, SIGHUP log level (file and toggle), health, SIGTERM"
