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

# OpenBLAS's kernels: with no OPENBLAS_CORETYPE the server runs kernels that use AVX2 wherever
# the CPU has AVX2 and FMA (it restarts itself where OpenBLAS fell back to older ones); a
# kernel set the operator names stands, and is said as theirs.
# (scripts/test.sh passes the server's choice to every test process; unset here, so this
# server makes the choice itself.)
env -u OPENBLAS_CORETYPE -u STREAMBP_OPENBLAS_FALLBACK "$server" --version > "$dir/version_own.out" 2>&1 ||
  fail "--version: $(cat "$dir/version_own.out")"
if grep -q "kernels" "$dir/version_own.out"; then
  core=$(sed -n 's/^BLAS .*(\([A-Za-z0-9_]*\) kernels.*/\1/p' "$dir/version_own.out")
  flags=$(grep -m1 '^flags' /proc/cpuinfo)
  if [[ " $flags " == *" avx2 "* && " $flags " == *" fma "* ]]; then
    case "$core" in
      Katmai|Coppermine|Northwood|Prescott|Banias|Core2|Penryn|Dunnington|Nehalem|Atom|Sandybridge|"")
        fail "an AVX2 CPU runs OpenBLAS's '$core' kernels: $(cat "$dir/version_own.out")";;
    esac
  fi
  env -u STREAMBP_OPENBLAS_FALLBACK OPENBLAS_CORETYPE=Nehalem "$server" --version > "$dir/version_env.out" 2>&1 ||
    fail "--version: $(cat "$dir/version_env.out")"
  grep -q "^BLAS .*(Nehalem kernels)$" "$dir/version_env.out" ||
    fail "OPENBLAS_CORETYPE=Nehalem was not kept as the operator's: $(cat "$dir/version_env.out")"
elif grep -qi "openblas" "$dir/version_own.out"; then
  fail "--version names OpenBLAS but not its kernels: $(cat "$dir/version_own.out")"
fi

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
assert 'grpc_server_handled_total{grpc_code="OK",grpc_method="GetInfo",grpc_service="streambp.v1.Trainer",grpc_type="unary"} 1' in body, "GetInfo not counted"
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

# The CLI as a user meets it: --version, defaults in --help, HOST:PORT checked, a clear
# message (exit 3) when nothing answers, exit 2 for a bad command line.
"$cli" --version > "$dir/cli_version.out" 2>&1 || fail "streambp --version: $(cat "$dir/cli_version.out")"
grep -q "^streambp [0-9]" "$dir/cli_version.out" || fail "streambp --version: $(cat "$dir/cli_version.out")"
"$cli" train --help > "$dir/help.out" 2>&1 || fail "train --help"
grep -q "4096" "$dir/help.out" || fail "--help does not show the default of --batch-tokens: $(cat "$dir/help.out")"
grep -q "Exit status" <("$cli" --help 2>&1) || fail "--help does not document the exit status"
"$cli" info --server localhost > "$dir/noport.out" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--server without a port: exit $rc, expected 2: $(cat "$dir/noport.out")"
grep -q "give HOST:PORT" "$dir/noport.out" || fail "--server without a port: $(cat "$dir/noport.out")"
"$cli" info --server localhost: > "$dir/noport2.out" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--server with an empty port: exit $rc, expected 2"
grep -q "(e.g. localhost:50051)" "$dir/noport2.out" || fail "--server localhost: example: $(cat "$dir/noport2.out")"
"$cli" info --server http://localhost:50051 > "$dir/scheme.out" 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--server with a scheme: exit $rc: $(cat "$dir/scheme.out")"
grep -q "without a scheme" "$dir/scheme.out" || fail "--server with a scheme: $(cat "$dir/scheme.out")"
"$cli" info --server "127.0.0.1:$port" --timeout 3 > "$dir/down.out" 2>&1; rc=$?
[ "$rc" -eq 3 ] || fail "no server: exit $rc, expected 3: $(cat "$dir/down.out")"
grep -q "no server at 127.0.0.1:$port" "$dir/down.out" || fail "no server message: $(cat "$dir/down.out")"
grep -q "streambp-server serve" "$dir/down.out" || fail "no server message: $(cat "$dir/down.out")"
# --wait: a client started before its server gets its answer once the server listens (the
# README starts `serve &` and runs the client on the next line), and gives up with exit 3 when
# none comes.
"$cli" info --server "127.0.0.1:$port" --wait 0.5 > "$dir/wait_none.out" 2>&1; rc=$?
[ "$rc" -eq 3 ] || fail "--wait with no server: exit $rc, expected 3: $(cat "$dir/wait_none.out")"
"$cli" info --server "127.0.0.1:$port" --wait 120 > "$dir/wait.out" 2>&1 &
wait_pid=$!
sleep 1.5
"$server" serve --listen "127.0.0.1:$port" > "$dir/wait_server.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
wait "$wait_pid" || fail "info --wait: the server came up but the client failed: $(cat "$dir/wait.out")"
grep -q "^policy: *version 0" "$dir/wait.out" || fail "info --wait: $(cat "$dir/wait.out")"
kill -TERM "$server_pid"
wait "$server_pid" || fail "the --wait test's server did not stop cleanly"
"$cli" info --server "127.0.0.1:$port" --wait -1 > /dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "--wait -1: exit $rc, expected 2"
"$cli" info --bogus > /dev/null 2>&1; rc=$?
[ "$rc" -eq 2 ] || fail "an unknown flag: exit $rc, expected 2"

# A config file's fields are checked with the flags laid over them: sessions need a
# checkpoint folder, which --checkpoint-dir gives.
echo '{"sessions": {"enabled": true}}' > "$dir/sessions.json"
if "$server" serve --config "$dir/sessions.json" --check-config > "$dir/nockpt.out" 2>&1; then
  fail "sessions without a checkpoint folder were accepted"
fi
grep -q "sessions.enabled needs checkpoint_dir" "$dir/nockpt.out" || fail "no checkpoint folder: $(cat "$dir/nockpt.out")"
"$server" serve --config "$dir/sessions.json" --checkpoint-dir "$dir/sckpt" --check-config > "$dir/ckpt_flag.out" 2>&1 \
  || fail "--checkpoint-dir did not complete the config file: $(cat "$dir/ckpt_flag.out")"

# JSON logs: one flat object per event, with fields (not a message string).
"$server" serve --listen 127.0.0.1:0 --port-file "$dir/port3" --log-format json > "$dir/json.log" 2>&1 &
server_pid=$!
pids+=("$server_pid")
wait_for "$dir/port3" "[0-9]"
echo '{"tokens":[1,2,3,4,5,6,7,8]}' > "$dir/one.jsonl"
"$cli" train --server "127.0.0.1:$(cat "$dir/port3")" --data "$dir/one.jsonl" > "$dir/json_train.out" 2>&1 \
  || fail "train against the JSON-logging server: $(cat "$dir/json_train.out")"
kill -TERM "$server_pid"; wait "$server_pid"
python3 - "$dir/json.log" <<'PY' || fail "JSON logs: $(cat "$dir/json.log")"
import json, sys
events = [json.loads(line) for line in open(sys.argv[1]) if line.strip()]
assert all("time" in e and "level" in e and "event" in e for e in events), events
req = [e for e in events if e["event"] == "request" and e["method"] in ("TrainStep", "TrainStepProgress")]
assert req and req[0]["code"] == "OK" and req[0]["tokens"] == 8 and req[0]["seconds"] > 0, req
fb = [e for e in events if e["event"] == "forward_backward"]
assert fb and isinstance(fb[0]["loss"], float) and fb[0]["tokens"] == 8, fb
opt = [e for e in events if e["event"] == "optim_step"]
assert opt and opt[0]["grad_norm"] > 0 and opt[0]["policy_version"] == 1, opt
assert any(e["event"] == "log" and "msg" in e for e in events), "plain messages are event log"
PY

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
