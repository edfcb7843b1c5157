#!/usr/bin/env bash
# The first command a user runs and the ports an operator exposes:
# - `serve` with a model it cannot load (missing folder, unknown architecture, a CUDA device on
#   this build, a dtype the CPU cannot train in) exits 2 with the loader's message, never a
#   crash; --check-config reports the same;
# - the soft limit on open files is raised to the hard one at start;
# - a flood of idle connections that uses up every descriptor does not end the gRPC service
#   for good: once the flood ends the port answers again;
# - the metrics port answers scrapes while hundreds of idle and slow-header connections are
#   open, and a request with thousands of Range headers gets the plain answer.
set -uo pipefail
server="$1"
cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

# --- A model that does not load: exit 2, the reason named --------------------------------------
expect_refusal() {  # expect_refusal NAME PATTERN ARGS...
  local name="$1" pattern="$2"; shift 2
  timeout 60 "$server" serve --listen 127.0.0.1:0 "$@" > "$dir/$name.out" 2>&1
  local rc=$?
  [ "$rc" -eq 2 ] || fail "$name: exit $rc (expected 2): $(tail -5 "$dir/$name.out")"
  grep -qE "$pattern" "$dir/$name.out" || fail "$name: the message does not say '$pattern': $(tail -5 "$dir/$name.out")"
  if grep -qiE "segmentation|core dumped|terminate called" "$dir/$name.out"; then fail "$name crashed"; fi
}
expect_refusal missing "$dir/no-such-model does not exist" --model "$dir/no-such-model"
mkdir -p "$dir/alien"
echo '{"architectures": ["AlienForCausalLM"], "model_type": "alien", "hidden_size": 64}' > "$dir/alien/config.json"
expect_refusal architecture "AlienForCausalLM" --model "$dir/alien"
expect_refusal cuda "CUDA" --device cuda
expect_refusal float16 "float16" --dtype float16
timeout 60 "$server" serve --device cuda --check-config > "$dir/check_cuda.out" 2>&1
rc=$?
[ "$rc" -eq 2 ] || fail "--check-config with --device cuda: exit $rc: $(tail -3 "$dir/check_cuda.out")"
if grep -q "config OK" "$dir/check_cuda.out"; then fail "--check-config said OK for cuda on a CPU build"; fi
# A config meant for a GPU node is checked here with --no-model-check: keys and values only.
timeout 60 "$server" serve --device cuda --model /models --check-config --no-model-check > "$dir/check_pod.out" 2>&1 ||
  fail "--check-config --no-model-check refused a config for a GPU pod: $(tail -3 "$dir/check_pod.out")"
grep -q "config OK" "$dir/check_pod.out" || fail "--no-model-check: no 'config OK'"
if timeout 60 "$server" serve --device cuda --engine nonsense --check-config --no-model-check > "$dir/check_bad.out" 2>&1; then
  fail "--no-model-check accepted --engine nonsense"
fi
if timeout 60 "$server" serve --no-model-check > "$dir/no_check.out" 2>&1; then
  fail "--no-model-check without --check-config started a server"
fi

echo '{"metrics": {"listen": "127.0.0.1:0"}}' > "$dir/metrics.json"
start_server() {  # start_server NAME PRLIMIT ARGS... ; sets port, metrics_port, server_pid
  local name="$1" limit="$2"; shift 2
  rm -f "$dir/$name.port"
  prlimit --nofile="$limit" "$server" serve --listen 127.0.0.1:0 --port-file "$dir/$name.port" \
    --config "$dir/metrics.json" "$@" > "$dir/$name.log" 2>&1 &
  server_pid=$!
  pids+=("$server_pid")
  for _ in $(seq 1 300); do
    [ -s "$dir/$name.port" ] && break
    kill -0 "$server_pid" 2>/dev/null || fail "server $name did not start"
    sleep 0.1
  done
  port="$(cat "$dir/$name.port")"
  metrics_port="$(grep -oE 'metrics on http://[0-9.]+:[0-9]+' "$dir/$name.log" | grep -oE '[0-9]+$' | head -1)"
  [ -n "$metrics_port" ] || fail "no metrics port in the log"
}

# --- The soft limit is raised to the hard one --------------------------------------------------
start_server raise 1024:4096
max_fds="$(python3 -c "import urllib.request,sys; print(urllib.request.urlopen('http://127.0.0.1:$metrics_port/metrics', timeout=10).read().decode())" | grep '^process_max_fds ' | awk '{print $2}')"
[ "${max_fds%.*}" = "4096" ] || fail "process_max_fds is $max_fds, expected 4096 (the hard limit)"
kill -9 "$server_pid"

# --- Descriptors used up by idle connections: the port comes back -------------------------------
start_server flood 192:192
CLI="$cli" python3 - "$port" "$metrics_port" <<'PY' || fail "flood: the server did not answer again"
import socket, subprocess, sys, time, urllib.request
grpc_port, metrics_port = int(sys.argv[1]), int(sys.argv[2])
held = []
for _ in range(400):  # more than the 192 descriptors the server may open
    try:
        s = socket.create_connection(("127.0.0.1", grpc_port), timeout=2)
        held.append(s)
    except OSError:
        break
time.sleep(2)
for s in held:
    s.close()
print(f"held {len(held)} connections", flush=True)
# The service answers again within a bounded time.
deadline = time.time() + 45
while True:
    try:
        out = subprocess.run(["/bin/sh", "-c", f"exec \"$CLI\" info --server 127.0.0.1:{grpc_port} --timeout 5"],
                             capture_output=True, text=True, timeout=20)
        if out.returncode == 0:
            print("info answered", flush=True)
            break
    except subprocess.TimeoutExpired:
        pass
    if time.time() > deadline:
        sys.exit("the gRPC port did not answer within 45 s after the flood ended")
    time.sleep(1)
PY
grep -q "Failed accept4" "$dir/flood.log" || fail "the flood did not use up the descriptors (no accept failure in the log): the test proves nothing"
grep -q "listening again on port" "$dir/flood.log" || fail "the listener was not rebuilt"
kill -9 "$server_pid"

# --- The metrics port under idle, slow and Range-amplifying clients ----------------------------
start_server metrics 4096:4096
python3 - "$metrics_port" <<'PY' || fail "metrics: scrapes were not answered under the flood"
import socket, sys, time, urllib.request
port = int(sys.argv[1])
def scrape():
    t = time.time()
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read()
    return body, time.time() - t
plain, _ = scrape()
idle = [socket.create_connection(("127.0.0.1", port), timeout=2) for _ in range(500)]
slow = []
for _ in range(30):  # headers that never end
    s = socket.create_connection(("127.0.0.1", port), timeout=2)
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n")
    slow.append(s)
for i in range(4):
    body, seconds = scrape()
    assert b"process_open_fds" in body, body[:200]
    assert seconds < 3, f"scrape {i} took {seconds:.1f} s under the flood"
# 2000 overlapping ranges: the answer is the page, once.
ranges = ",".join(f"0-{100000 + i}" for i in range(2000))
s = socket.create_connection(("127.0.0.1", port), timeout=5)
s.sendall(f"GET /metrics HTTP/1.1\r\nHost: x\r\nRange: bytes={ranges}\r\n\r\n".encode())
got = b""
while True:
    chunk = s.recv(1 << 16)
    if not chunk:
        break
    got += chunk
assert len(got) < 2 * len(plain) + 4096, f"{len(got)} bytes answered for a {len(plain)}-byte page"
assert got.startswith(b"HTTP/1.1 431") or got.startswith(b"HTTP/1.1 200"), got[:80]
for s in idle + slow:
    s.close()
print("metrics answered under the flood")
PY
echo "PASS: cli.hardening"
