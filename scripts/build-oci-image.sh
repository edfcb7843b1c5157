#!/usr/bin/env bash
# Builds the CPU image of docker/Dockerfile without a Docker engine, offline from Debian
# packages: mmdebstrap makes the runtime stage's root filesystem, umoci makes an OCI image
# of it, written as an OCI image layout in a tar (the format of `skopeo copy oci-archive:`
# and `podman load`). Steps, each the counterpart of the Dockerfile's:
#
#   build stage    by default the binary already built in build/ on this machine: the build
#                  machines are Debian 12 with scripts/packages.txt installed, which is what
#                  the build stage installs (the fresh-machine proof runs that on a clean
#                  root). --build-stage instead builds in a fresh bookworm root as the build
#                  stage does (install-deps.sh, Release build without tests/bench; about
#                  8 min on 2 cores: 461 s measured, mmdebstrap and apt included). Either way: strip, then the build stage's check that
#                  docker/runtime-packages.txt still covers the binary.
#   runtime stage  mmdebstrap bookworm minbase with the path excludes of debian:bookworm-slim,
#                  the same archives (bookworm, -updates, -security), docker/runtime-packages.txt
#                  without Recommends, the user and group streambp (10001), /etc/streambp and
#                  /var/lib/streambp/checkpoints: layer 1. The binary and deploy/base/server.json
#                  at the Dockerfile's paths: layer 2. Then the image config: ENTRYPOINT, CMD,
#                  USER, WORKDIR, EXPOSE, STOPSIGNAL, PATH, OCI labels (version from the binary).
#                  An OCI config has no HEALTHCHECK (a Docker extension): not carried over.
#
# Needs root (mmdebstrap, chroot, file ownership) and a Debian mirror; installs mmdebstrap
# and umoci (scripts/packages.txt) if missing. Idempotent: the work folder is rebuilt each
# run and the image replaced only when complete. Exit 77 = cannot run here (not root, no
# mirror reachable): the ctest test docker.oci_image reports that as skipped.
#
#   sudo bash scripts/build-oci-image.sh [--binary PATH] [--out FILE.tar] [--build-stage]
#        [--mirror URL] [--security-mirror URL] [--keep-work]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
binary="$repo/build/server/streambp-server"
out="$repo/build/oci/streambp-server-cpu.tar"
mirror="${MIRROR:-http://deb.debian.org/debian}"
security_mirror="${SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
build_stage=0
keep=0
tag=cpu
usage="usage: $0 [--binary PATH] [--out FILE.tar] [--build-stage] [--mirror URL] [--security-mirror URL] [--keep-work]"
while [ $# -gt 0 ]; do
  case "$1" in
    --binary) binary="$(realpath "$2")"; shift ;;
    --out) out="$(realpath -m "$2")"; shift ;;
    --build-stage) build_stage=1 ;;
    --mirror) mirror="$2"; shift ;;
    --security-mirror) security_mirror="$2"; shift ;;
    --keep-work) keep=1 ;;
    *) echo "$usage" >&2; exit 2 ;;
  esac
  shift
done

t_start=$(date +%s)
say() { echo "[build-oci-image $(date -u +%H:%M:%S)] $*"; }
die() { echo "build-oci-image: ERROR: $*" >&2; exit 1; }
[ "$(id -u)" -eq 0 ] || { echo "build-oci-image: SKIP: needs root (mmdebstrap, chroot, file ownership)"; exit 77; }
[[ "$out" == *.tar ]] || die "--out must name a .tar file: $out"
missing=()
for tool in mmdebstrap umoci; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing ${missing[*]} (Debian packages, in scripts/packages.txt)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null ||
    { echo "build-oci-image: SKIP: cannot install ${missing[*]}"; exit 77; }
fi

work="${out%.tar}.work"
log="$work/build.log"
rootfs="$work/rootfs"         # the runtime stage's root, as mmdebstrap makes it
layout="$work/layout"         # the OCI image layout that becomes $out
bundle="$work/bundle"         # umoci's unpacked runtime bundle (bundle/rootfs)
build_root="$work/build-root" # --build-stage: the build stage's root
cleanup() {
  if [ "$keep" -eq 0 ] && [ -d "$work" ]; then rm -rf --one-file-system "$work"; fi
}
trap cleanup EXIT
rm -rf --one-file-system "$work"
mkdir -p "$work"
# Recorded in the log, shown on failure.
run() { "$@" >>"$log" 2>&1 || { echo "build-oci-image: ERROR: failed: $*; last lines of $log:" >&2; tail -n 25 "$log" >&2; exit 1; }; }
pkg_list() { sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' "$1"; }
# What debian:bookworm-slim (debuerreotype --slimify) leaves out of every package.
slim_opts=(--dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/groff/*'
  --dpkgopt='path-exclude=/usr/share/info/*' --dpkgopt='path-exclude=/usr/share/lintian/*'
  --dpkgopt='path-exclude=/usr/share/linda/*' --dpkgopt='path-exclude=/usr/share/locale/*')
sources=("deb $mirror bookworm main" "deb $mirror bookworm-updates main" "deb $security_mirror bookworm-security main")

# No mirror = cannot run here (77); a failure after this point is an error.
python3 - "$mirror/dists/bookworm/InRelease" <<'PY' >>"$log" 2>&1 || { echo "build-oci-image: SKIP: the Debian mirror $mirror is not reachable"; exit 77; }
import sys, urllib.request
urllib.request.urlopen(urllib.request.Request(sys.argv[1], method="HEAD"), timeout=20)
PY
say "work folder $work (log $log)"
step=1
steps=4
[ "$build_stage" -eq 1 ] && steps=5

# --- build stage --------------------------------------------------------------------------
if [ "$build_stage" -eq 1 ]; then
  say "$step/$steps build stage: a bookworm root, scripts/install-deps.sh, Release build (takes long)"
  t0=$(date +%s)
  run mmdebstrap --variant=minbase --mode=root --include=ca-certificates bookworm "$build_root" "${sources[@]}"
  mkdir -p "$build_root/src"
  (cd "$repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$build_root/src"
  cp /etc/resolv.conf "$build_root/etc/resolv.conf"
  printf '#!/bin/sh\nexit 101\n' > "$build_root/usr/sbin/policy-rc.d" && chmod +x "$build_root/usr/sbin/policy-rc.d"
  # The build stage's RUN lines (docker/Dockerfile), in the same order.
  cat > "$build_root/build-stage.sh" <<'STAGE'
set -e
cd /src
bash scripts/install-deps.sh && rm -rf /var/lib/apt/lists/*
rm -rf build
BUILD_JOBS="$(nproc)" bash scripts/build.sh -DSTREAMBP_BUILD_TESTS=OFF -DSTREAMBP_BUILD_BENCH=OFF
strip build/server/streambp-server
bash docker/runtime-packages.sh build/server/streambp-server | sed -e 's/#.*//' -e '/^ *$/d' -e 's/ //g' > /tmp/needed
sed -e 's/#.*//' -e '/^ *$/d' -e 's/ //g' docker/runtime-packages.txt | diff - /tmp/needed ||
  { echo "docker/runtime-packages.txt is out of date: regenerate it with docker/runtime-packages.sh" >&2; exit 1; }
STAGE
  # In a chroot with its own /proc, /sys, /dev, /tmp (a private mount namespace: nothing stays mounted).
  run unshare --mount --propagation private --fork bash -c '
    set -e
    r="$1"
    mount -t proc proc "$r/proc"
    mount -t sysfs sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs tmpfs "$r/tmp"
    exec chroot "$r" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 bash /build-stage.sh
  ' _ "$build_root"
  binary="$build_root/src/build/server/streambp-server"
  say "    built in $(( $(date +%s) - t0 )) s"
  step=$((step + 1))
fi

say "$step/$steps the binary: $binary"
[ -x "$binary" ] || die "no binary at $binary (build it first: bash scripts/build.sh, or use --build-stage)"
cp "$binary" "$work/streambp-server"
strip "$work/streambp-server"
# The build stage's check: the runtime list covers the binary (computed with this
# machine's dpkg database, so this machine must be the Debian 12 the binary was built on).
if [ "$build_stage" -eq 0 ]; then
  needed="$(bash "$repo/docker/runtime-packages.sh" "$work/streambp-server" | pkg_list /dev/stdin | sort)" ||
    die "docker/runtime-packages.sh failed on $binary"
  [ "$needed" = "$(pkg_list "$repo/docker/runtime-packages.txt" | sort)" ] ||
    die "docker/runtime-packages.txt is out of date: regenerate it with docker/runtime-packages.sh $binary"
fi
say "    $(du -k "$work/streambp-server" | cut -f1) KiB stripped; docker/runtime-packages.txt covers it"
step=$((step + 1))

# --- runtime stage ------------------------------------------------------------------------
mapfile -t runtime_pkgs < <(pkg_list "$repo/docker/runtime-packages.txt")
say "$step/$steps runtime root: mmdebstrap bookworm minbase (slim) + ${#runtime_pkgs[@]} packages of docker/runtime-packages.txt"
t0=$(date +%s)
# The runtime stage's RUN line: packages without Recommends, package lists removed (mmdebstrap's
# cleanup), then the user, group and folders.
mmdebstrap --variant=minbase --mode=root --format=directory "${slim_opts[@]}" \
  --include="$(IFS=,; echo "${runtime_pkgs[*]}")" \
  --customize-hook='chroot "$1" groupadd --system --gid 10001 streambp' \
  --customize-hook='chroot "$1" useradd --system --uid 10001 --gid 10001 --create-home --home-dir /var/lib/streambp streambp' \
  --customize-hook='mkdir -p "$1/etc/streambp" "$1/var/lib/streambp/checkpoints" && chown -R 10001:10001 "$1/var/lib/streambp"' \
  --customize-hook='rm -f "$1/etc/resolv.conf" "$1/etc/hostname"' \
  bookworm "$rootfs" "${sources[@]}" >>"$log" 2>&1 ||
  { echo "build-oci-image: ERROR: mmdebstrap failed; last lines of $log:" >&2; tail -n 25 "$log" >&2; exit 1; }
say "    done in $(( $(date +%s) - t0 )) s: $(chroot "$rootfs" dpkg-query -W | wc -l) packages, $(du -sm --one-file-system "$rootfs" | cut -f1) MiB"
# Versions differ from this machine's only if the archive moved on since it was updated.
drift="$(join <(chroot "$rootfs" dpkg-query -W "${runtime_pkgs[@]}" | sort) <(dpkg-query -W "${runtime_pkgs[@]}" 2>/dev/null | sort) |
  awk '$2 != $3 {printf " %s (image %s, here %s)", $1, $2, $3}')"
[ -z "$drift" ] || say "    note: newer in the archive than on this machine:$drift"
step=$((step + 1))

say "$step/$steps OCI image: umoci layout, layer 1 = the Debian root, layer 2 = the streambp files"
t0=$(date +%s)
run umoci init --layout "$layout"
run umoci new --image "$layout:$tag"
run umoci unpack --image "$layout:$tag" "$bundle"
# Replace the (empty) rootfs of the new image with the Debian root; keep ownership and modes.
rm -rf --one-file-system "$bundle/rootfs"
mv "$rootfs" "$bundle/rootfs"
run umoci repack --refresh-bundle --image "$layout:$tag" \
  --history.created_by "mmdebstrap bookworm minbase + docker/runtime-packages.txt; groupadd/useradd streambp (10001)" "$bundle"
# The Dockerfile's two COPY lines.
install -D -m 0755 -o 0 -g 0 "$work/streambp-server" "$bundle/rootfs/usr/local/bin/streambp-server"
install -D -m 0644 -o 0 -g 0 "$repo/deploy/base/server.json" "$bundle/rootfs/etc/streambp/config.json"
run umoci repack --image "$layout:$tag" \
  --history.created_by "COPY streambp-server /usr/local/bin/; COPY deploy/base/server.json /etc/streambp/config.json" "$bundle"
say "    layers packed in $(( $(date +%s) - t0 )) s"
step=$((step + 1))

say "$step/$steps image config: entrypoint, cmd, user, workdir, ports, labels"
# The version the binary reports, from inside the image's root: proves it loads its libraries there.
version_out="$(chroot --userspec=10001:10001 "$bundle/rootfs" /usr/local/bin/streambp-server --version 2>&1)" ||
  die "the binary does not run in the image's root: $version_out"
version="$(head -1 <<<"$version_out" | awk '{print $2}')"
revision="$(git -C "$repo" rev-parse HEAD 2>/dev/null || echo unknown)"
[ -z "$(git -C "$repo" status --porcelain --untracked-files=no 2>/dev/null)" ] || revision="$revision-dirty"
[ "$build_stage" -eq 1 ] || revision="$revision (binary from $binary)"
created="$(date -u +%Y-%m-%dT%H:%M:%SZ)"
run umoci config --image "$layout:$tag" --created "$created" --os linux --architecture "$(dpkg --print-architecture)" \
  --config.env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --config.user 10001:10001 --config.workingdir /var/lib/streambp \
  --config.exposedports 50051/tcp --config.exposedports 9464/tcp --config.stopsignal SIGTERM \
  --config.entrypoint /usr/local/bin/streambp-server --config.entrypoint serve \
  --config.cmd --config --config.cmd /etc/streambp/config.json \
  --config.label "org.opencontainers.image.title=streambp-server" \
  --config.label "org.opencontainers.image.description=StreamBP training service (gRPC), CPU, Debian 12" \
  --config.label "org.opencontainers.image.version=$version" \
  --config.label "org.opencontainers.image.revision=$revision" \
  --config.label "org.opencontainers.image.created=$created" \
  --config.label "org.opencontainers.image.base.name=debian:bookworm-slim (mmdebstrap minbase, slim excludes)" \
  --history.created_by "ENTRYPOINT/CMD/USER/WORKDIR/EXPOSE/STOPSIGNAL of docker/Dockerfile"
run umoci gc --layout "$layout"
mkdir -p "$(dirname "$out")"
tar -C "$layout" --sort=name -cf "$out.partial" .
mv -f "$out.partial" "$out"
step=$((step + 1))

layers="$(python3 - "$layout" "$tag" <<'PY'
import json, os, sys
layout, tag = sys.argv[1], sys.argv[2]
blob = lambda d: os.path.join(layout, "blobs", *d.split(":"))
index = json.load(open(os.path.join(layout, "index.json")))
m = next(m for m in index["manifests"] if m.get("annotations", {}).get("org.opencontainers.image.ref.name") == tag)
manifest = json.load(open(blob(m["digest"])))
print(" + ".join(f"{l['size'] / 2**20:.0f}" for l in manifest["layers"]) + " MiB compressed")
PY
)"
say "image $out: $(du -m "$out" | cut -f1) MiB (layers $layers), tag $tag, streambp-server $version"
say "done in $(( $(date +%s) - t_start )) s. Load it with: skopeo copy oci-archive:$out:$tag docker-daemon:streambp-server:cpu (or podman load -i $out)"
