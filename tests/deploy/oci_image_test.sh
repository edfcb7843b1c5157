#!/usr/bin/env bash
# docker.oci_image (label slow): the CPU image, built without a Docker engine by
# scripts/build-oci-image.sh (mmdebstrap + umoci), runs. Builds the image (or reuses one newer
# than its inputs), checks its config (entrypoint, cmd, user, workdir, ports, version label)
# and the runtime bundle umoci derives from it, then runs the image's entrypoint from the
# image's root filesystem as a container runtime would: user 10001:10001, cwd = WORKDIR, the
# image's PATH only, its own /proc, a minimal /dev and /dev/shm, in a private mount namespace
# (the network is the host's: loopback). From the host: grpc health, `streambp info`, one
# training step, a /metrics scrape; then SIGTERM -> exit 0 and a shutdown checkpoint written
# by the non-root user. Needs root and a Debian mirror (when the image must be built);
# exit 77 (skipped) where it cannot run.
#   oci_image_test.sh STREAMBP_SERVER STREAMBP_CLI REPO
set -uo pipefail
server="$(realpath "$1")"
cli="$(realpath "$2")"
repo="$(realpath "$3")"
image="$(realpath -m "$(dirname "$server")/../oci/streambp-server-cpu.tar")"
tag=cpu
[ "$(id -u)" -eq 0 ] || { echo "SKIP: needs root (chroot, mounts)"; exit 77; }
dir="$(mktemp -d /var/tmp/streambp-oci-test.XXXXXX)"
server_pid=""
runner_pid=""
cleanup() {
  [ -z "$server_pid" ] || kill -9 "$server_pid" 2>/dev/null
  [ -z "$runner_pid" ] || wait "$runner_pid" 2>/dev/null
  # The mounts live in the runner's private namespace and go with it; unmount anything that
  # leaked anyway before removing the folder (never across a mount: --one-file-system).
  findmnt -rn -o TARGET | grep "^$dir/" | sort -r | while read -r m; do umount -l "$m"; done
  rm -rf --one-file-system "$dir"
}
trap cleanup EXIT
fail() {
  echo "FAIL: $*"
  for f in "$dir"/*.log; do [ -f "$f" ] && { echo "--- $f"; tail -n 25 "$f"; }; done
  exit 1
}
say() { echo "[oci_image_test $(date -u +%H:%M:%S)] $*"; }
t_start=$(date +%s)

# 1. The image: reuse it when newer than everything it is made of.
fresh=1
for input in "$server" "$repo/docker/runtime-packages.txt" "$repo/deploy/base/server.json" "$repo/scripts/build-oci-image.sh"; do
  [ "$image" -nt "$input" ] || fresh=0
done
if [ "$fresh" -eq 1 ]; then
  say "reusing $image (newer than the binary, the package list, the config and the script)"
else
  say "building $image with scripts/build-oci-image.sh"
  t0=$(date +%s)
  bash "$repo/scripts/build-oci-image.sh" --binary "$server" --out "$image" 2>&1 | tee "$dir/build-image.log" | sed 's/^/    /'
  rc=${PIPESTATUS[0]}
  [ "$rc" -ne 77 ] || exit 77
  [ "$rc" -eq 0 ] || fail "scripts/build-oci-image.sh exited $rc"
  say "image built in $(( $(date +%s) - t0 )) s"
fi
command -v umoci >/dev/null || fail "umoci is not installed (scripts/packages.txt)"

# 2. The image's config, from its blobs, and the runtime bundle umoci makes of it.
mkdir -p "$dir/layout"
tar -xf "$image" -C "$dir/layout" || fail "cannot unpack $image"
umoci stat --image "$dir/layout:$tag" > "$dir/stat.out" 2>&1 || fail "umoci stat: $(cat "$dir/stat.out")"
umoci unpack --image "$dir/layout:$tag" "$dir/bundle" > "$dir/unpack.log" 2>&1 || fail "umoci unpack"
rootfs="$dir/bundle/rootfs"
version="$("$server" --version | head -1 | awk '{print $2}')"
python3 - "$dir/layout" "$tag" "$dir/bundle/config.json" "$version" <<'PY' || fail "image config"
import json, os, sys
layout, tag, spec_file, version = sys.argv[1:]
blob = lambda d: json.load(open(os.path.join(layout, "blobs", *d.split(":"))))
index = json.load(open(os.path.join(layout, "index.json")))
manifest = blob(next(m["digest"] for m in index["manifests"]
                     if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag))
image = blob(manifest["config"]["digest"])
c = image["config"]
want = {  # docker/Dockerfile's runtime stage
    "Entrypoint": ["/usr/local/bin/streambp-server", "serve"],
    "Cmd": ["--config", "/etc/streambp/config.json"],
    "User": "10001:10001",
    "WorkingDir": "/var/lib/streambp",
    "ExposedPorts": {"50051/tcp": {}, "9464/tcp": {}},
    "StopSignal": "SIGTERM",
}
for key, value in want.items():
    assert c.get(key) == value, f"{key}: {c.get(key)!r}, want {value!r}"
assert c["Labels"]["org.opencontainers.image.version"] == version, c["Labels"]
assert image["os"] == "linux" and len(manifest["layers"]) == 2, (image["os"], manifest["layers"])
# What a runtime would execute (the OCI runtime spec umoci derived from the image).
p = json.load(open(spec_file))["process"]
assert p["args"] == want["Entrypoint"] + want["Cmd"], p["args"]
assert (p["user"]["uid"], p["user"]["gid"], p["cwd"]) == (10001, 10001, "/var/lib/streambp"), p
print(f"image config: entrypoint {' '.join(p['args'])}, user 10001:10001, version {version}, "
      f"{len(manifest['layers'])} layers")
PY
[ "$(stat -c %u:%g "$rootfs/var/lib/streambp/checkpoints")" = "10001:10001" ] || fail "checkpoints/ is not owned by 10001"
grep -q '^streambp:x:10001:10001:' "$rootfs/etc/passwd" || fail "no user streambp (10001) in the image"
path_env="$(python3 -c 'import json,sys; print(next(e for e in json.load(open(sys.argv[1]))["process"]["env"] if e.startswith("PATH=")))' "$dir/bundle/config.json")"

# 3. Run in the image's root as its user. in_image PIDFILE COMMAND...: PIDFILE gets the PID of
# COMMAND (bash execs chroot, chroot execs env, env execs COMMAND).
in_image() {
  unshare --mount --propagation private --fork bash -c '
    set -e
    r="$1" pidfile="$2" path_env="$3"; shift 3
    mount -t proc proc "$r/proc"
    mount -t sysfs -o ro sysfs "$r/sys"
    mount -t tmpfs -o mode=755,nosuid tmpfs "$r/dev"
    for d in null zero full random urandom tty; do touch "$r/dev/$d"; mount --bind "/dev/$d" "$r/dev/$d"; done
    mkdir "$r/dev/shm" && mount -t tmpfs -o mode=1777,nosuid,nodev tmpfs "$r/dev/shm"
    ln -s /proc/self/fd "$r/dev/fd"
    echo $$ > "$pidfile"
    exec chroot --userspec=10001:10001 --groups= "$r" \
      /usr/bin/env -i -C /var/lib/streambp "$path_env" HOME=/var/lib/streambp "$@"
  ' _ "$rootfs" "$dir/pid" "$path_env" "$@"
}
in_image streambp-server --version > "$dir/version.out" 2>&1 || fail "--version in the image: $(cat "$dir/version.out")"
grep -q "libopenblas" "$dir/version.out" || fail "LibTorch does not call OpenBLAS in the image: $(cat "$dir/version.out")"
# The shipped config (CMD) passes --check-config inside the image.
in_image /usr/local/bin/streambp-server serve --config /etc/streambp/config.json --check-config > "$dir/check.out" 2>&1 ||
  fail "the image's config: $(cat "$dir/check.out")"
grep -q "config OK" "$dir/check.out" || fail "--check-config output: $(cat "$dir/check.out")"
# A model written by the image's user in its home (the PVC mount point in deploy/).
in_image streambp-server init-model --preset tiny --out /var/lib/streambp/model > "$dir/init.log" 2>&1 || fail "init-model in the image"
[ "$(stat -c %u "$rootfs/var/lib/streambp/model")" = 10001 ] || fail "the model is not owned by 10001"
# The shipped config with loopback ports picked by the server (a ConfigMap would replace it).
python3 - "$rootfs/etc/streambp/config.json" "$rootfs/etc/streambp/test.json" <<'PY' || fail "test config"
import json, sys
c = json.load(open(sys.argv[1]))
c["listen"] = "127.0.0.1:0"
c["metrics"]["listen"] = "127.0.0.1:0"
c["model"] = {"dir": "/var/lib/streambp/model", "dtype": "float32", "device": "cpu"}
json.dump(c, open(sys.argv[2], "w"), indent=1)
PY

say "starting the image's entrypoint: streambp-server serve --config /etc/streambp/test.json"
rm -f "$dir/pid"
in_image /usr/local/bin/streambp-server serve --config /etc/streambp/test.json --port-file /var/lib/streambp/port \
  > "$dir/server.log" 2>&1 &
runner_pid=$!
for _ in $(seq 1 600); do
  [ -s "$rootfs/var/lib/streambp/port" ] && break
  kill -0 "$runner_pid" 2>/dev/null || fail "the server did not start"
  sleep 0.1
done
[ -s "$rootfs/var/lib/streambp/port" ] || fail "no port after 60 s"
server_pid="$(cat "$dir/pid")"
port="$(cat "$rootfs/var/lib/streambp/port")"
uids="$(awk '/^Uid:/ {print $2, $3, $4, $5}' "/proc/$server_pid/status")"
[ "$uids" = "10001 10001 10001 10001" ] || fail "the server runs as uid $uids, not 10001"
[ "$(readlink "/proc/$server_pid/root")" = "$rootfs" ] || fail "the server's root is $(readlink "/proc/$server_pid/root")"
say "serving on 127.0.0.1:$port as uid 10001 (pid $server_pid, root = the image's rootfs)"

# 4. Called from the host, with the host's tools.
timeout 30 "$server" health --server "127.0.0.1:$port" --timeout 10 > "$dir/health.out" 2>&1 || fail "health: $(cat "$dir/health.out")"
grep -q "SERVING" "$dir/health.out" || fail "health output: $(cat "$dir/health.out")"
# The Dockerfile's HEALTHCHECK command, run inside the image.
in_image /usr/local/bin/streambp-server health --server "127.0.0.1:$port" --timeout 4 > "$dir/health-in.out" 2>&1 ||
  fail "health inside the image: $(cat "$dir/health-in.out")"
timeout 30 "$cli" info --server "127.0.0.1:$port" > "$dir/info.out" 2>&1 || fail "info: $(cat "$dir/info.out")"
grep -q "Qwen3ForCausalLM" "$dir/info.out" || fail "info output: $(cat "$dir/info.out")"
printf '{"tokens":[1,5,9,13,17,21,25,29,33,37,41,45]}\n' > "$dir/sft.jsonl"
timeout 120 "$cli" train --server "127.0.0.1:$port" --objective sft --data "$dir/sft.jsonl" --steps 1 > "$dir/train.out" 2>&1 ||
  fail "train: $(cat "$dir/train.out")"
grep -q "policy v1" "$dir/train.out" || fail "train output: $(cat "$dir/train.out")"
metrics_port="$(grep -o 'metrics on http://[0-9.]*:[0-9]*' "$dir/server.log" | head -1 | sed 's/.*://')"
[ -n "$metrics_port" ] || fail "the server did not log its metrics port"
python3 - "$metrics_port" > "$dir/metrics.out" 2>&1 <<'PY' || fail "metrics: $(tail -5 "$dir/metrics.out")"
import sys, urllib.request
body = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
assert "streambp_steps_total 1" in body, body
PY
say "health SERVING, info, one training step ($(grep -o 'loss [0-9.]*' "$dir/train.out" | head -1)), /metrics: all from the host"

# 5. SIGTERM (the image's STOPSIGNAL): drain, checkpoint on exit (the shipped config), exit 0.
kill -TERM "$server_pid"
for _ in $(seq 1 600); do kill -0 "$runner_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$runner_pid" 2>/dev/null && fail "the server did not stop within 60 s of SIGTERM"
wait "$runner_pid"
rc=$?
runner_pid=""
server_pid=""
[ "$rc" -eq 0 ] || fail "the server exited $rc after SIGTERM"
ckpt="$(ls -d "$rootfs"/var/lib/streambp/checkpoints/shutdown-* 2>/dev/null | head -1)"
[ -n "$ckpt" ] && [ -f "$ckpt/manifest.json" ] || fail "no shutdown checkpoint in /var/lib/streambp/checkpoints"
[ "$(stat -c %u "$ckpt/manifest.json")" = 10001 ] || fail "the shutdown checkpoint is not owned by 10001"
say "SIGTERM: exit 0, $(basename "$ckpt") written by uid 10001"
echo "PASS: the OCI image ($(du -m "$image" | cut -f1) MiB) runs streambp-server as 10001:10001 from its own root and serves; $(( $(date +%s) - t_start )) s"
