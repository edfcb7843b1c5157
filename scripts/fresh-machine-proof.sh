#!/usr/bin/env bash
# The fresh-machine proof: is the README true? Makes a clean Debian 12 (bookworm) root
# filesystem with mmdebstrap (only Debian's archive is needed), copies the repository in
# (the committed HEAD, or the working tree with --worktree), and runs exactly the README's
# two commands inside it, as root, in a chroot under a private mount namespace:
#
#   bash scripts/main.sh     builds, checks the engines, then serves until Ctrl-C: the proof
#                            waits for grpc health SERVING, runs the README's client example
#                            against it, sends SIGTERM (= Ctrl-C: drain, stop) and expects exit 0
#   bash scripts/test.sh
#
# If 127.0.0.1:50051 is taken on this machine (the chroot shares its network), main.sh
# gets STREAMBP_LISTEN (which it reads) with a free port instead.
#
# Takes long: the whole project is built from nothing on this machine's cores. Needs root
# (mmdebstrap, chroot, mounts) and access to a Debian mirror. Prints a summary and exits 0
# only when both commands succeed. Exit 77 = cannot run here (not root / no mmdebstrap /
# no mirror): ctest reports that as skipped.
#
#   sudo bash scripts/fresh-machine-proof.sh [--worktree] [--keep] [--dir DIR] [--mirror URL]
set -euo pipefail
root_repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
mirror="${MIRROR:-http://deb.debian.org/debian}"
work=""
keep=0
worktree=0
while [ $# -gt 0 ]; do
  case "$1" in
    --worktree) worktree=1 ;;
    --keep) keep=1 ;;
    --dir) work="$2"; shift ;;
    --mirror) mirror="$2"; shift ;;
    *) echo "usage: $0 [--worktree] [--keep] [--dir DIR] [--mirror URL]" >&2; exit 2 ;;
  esac
  shift
done

if [ "$(id -u)" -ne 0 ]; then echo "fresh-machine-proof: SKIP: needs root (mmdebstrap, chroot, mounts)"; exit 77; fi
if ! command -v mmdebstrap >/dev/null; then
  echo "fresh-machine-proof: installing mmdebstrap (Debian package)"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends mmdebstrap >/dev/null ||
    { echo "fresh-machine-proof: SKIP: cannot install mmdebstrap"; exit 77; }
fi

work="${work:-$(mktemp -d /var/tmp/streambp-fresh.XXXXXX)}"
rootfs="$work/rootfs"
log="$work/proof.log"
mkdir -p "$work"
cleanup() {
  if [ "$keep" -eq 0 ]; then rm -rf --one-file-system "$rootfs"; fi
}
trap cleanup EXIT
say() { echo "[$(date -u +%H:%M:%S)] $*" | tee -a "$log"; }

say "fresh-machine-proof: work dir $work (log $log)"
say "1/4 mmdebstrap: a minimal Debian 12 from $mirror"
t0=$(date +%s)
# minbase + what `apt-get install` from a root shell needs; nothing of the project's list.
if ! mmdebstrap --variant=minbase --include=ca-certificates bookworm "$rootfs" \
    "deb $mirror bookworm main" "deb $mirror bookworm-updates main" >>"$log" 2>&1; then
  say "fresh-machine-proof: SKIP: mmdebstrap failed (no Debian mirror reachable?); see $log"
  exit 77
fi
say "    done in $(( $(date +%s) - t0 )) s: $(chroot "$rootfs" dpkg-query -W | wc -l) packages"

say "2/4 copying the repository to /src ($([ $worktree -eq 1 ] && echo "working tree" || echo "git HEAD $(git -C "$root_repo" rev-parse --short HEAD)"))"
mkdir -p "$rootfs/src"
if [ "$worktree" -eq 1 ]; then
  (cd "$root_repo" && git ls-files -z --cached --others --exclude-standard | tar --null -T - -cf -) | tar -xf - -C "$rootfs/src"
else
  git -C "$root_repo" archive --format=tar HEAD | tar -xf - -C "$rootfs/src"
fi
cp /etc/resolv.conf "$rootfs/etc/resolv.conf"
# What the Debian installer (and every container runtime) writes and a bare mmdebstrap
# root lacks: without it "localhost" does not resolve (the TLS tests connect to it).
printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' > "$rootfs/etc/hosts"
echo streambp-fresh > "$rootfs/etc/hostname"
# A chroot has no init: keep packages (prometheus) from starting daemons in it, as every
# container image does.
printf '#!/bin/sh\nexit 101\n' > "$rootfs/usr/sbin/policy-rc.d"
chmod +x "$rootfs/usr/sbin/policy-rc.d"

# The README's two commands, verbatim, in a chroot with its own /proc, /dev, /sys, /tmp
# and /dev/shm (a private mount namespace: nothing stays mounted afterwards).
run_in_chroot() {  # run_in_chroot "COMMAND"
  unshare --mount --propagation private --fork bash -c '
    set -e
    r="$1"
    mount -t proc proc "$r/proc"
    mount -t sysfs sys "$r/sys"
    mount --rbind /dev "$r/dev"
    mount -t tmpfs tmpfs "$r/dev/shm"
    mount -t tmpfs tmpfs "$r/tmp"
    exec chroot "$r" /usr/bin/env -i HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 \
      bash -c "cd /src && $2"
  ' _ "$rootfs" "$1"
}

status=0
port=50051
listen_env=""
if (exec 3<>/dev/tcp/127.0.0.1/$port) 2>/dev/null; then
  port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  listen_env="STREAMBP_LISTEN=127.0.0.1:$port "
  say "    127.0.0.1:50051 is taken here: main.sh listens on $port (STREAMBP_LISTEN)"
fi

say "3/4 \$ ${listen_env}bash scripts/main.sh"
t0=$(date +%s)
rm -f "$rootfs/src/.main.pid"
# `exec` keeps one PID from this shell through main.sh to the server it execs.
run_in_chroot "echo \$\$ > /src/.main.pid; ${listen_env}exec bash scripts/main.sh" >>"$log" 2>&1 &
main_job=$!
serving=0
while kill -0 "$main_job" 2>/dev/null; do
  if [ -x "$rootfs/src/build/server/streambp-server" ] &&
     run_in_chroot "build/server/streambp-server health --server 127.0.0.1:$port --timeout 2" >/dev/null 2>&1; then
    serving=1
    break
  fi
  sleep 10
done
if [ "$serving" -eq 1 ]; then
  say "    serving on 127.0.0.1:$port after $(( $(date +%s) - t0 )) s; the README's client example:"
  set +e
  run_in_chroot "printf '{\"tokens\":[1,5,9,13,17,21,25,29,33,37,41,45]}\\n' > /tmp/sft.jsonl && \
    build/client/streambp train --server 127.0.0.1:$port --objective sft --data /tmp/sft.jsonl --steps 20" \
    2>&1 | tee -a "$log" | tail -n 4 | sed 's/^/    | /'
  [ "${PIPESTATUS[0]}" -eq 0 ] || { say "    the client example failed"; status=1; }
  set -e
  kill -TERM "$(cat "$rootfs/src/.main.pid")"  # what Ctrl-C does (SIGINT is ignored in background jobs)
fi
set +e
wait "$main_job"
rc=$?
set -e
grep -A6 "engines must agree" "$log" | sed 's/^/    | /' || true
if [ "$serving" -eq 1 ] && [ "$rc" -eq 0 ]; then
  say "    main.sh: built, verified, served, stopped cleanly on SIGTERM after $(( $(date +%s) - t0 )) s"
else
  say "    main.sh: FAILED (serving=$serving, exit $rc) after $(( $(date +%s) - t0 )) s"
  tail -n 30 "$log" | sed 's/^/    | /'
  status=1
fi

say "4/4 \$ bash scripts/test.sh"
t0=$(date +%s)
set +e
run_in_chroot "bash scripts/test.sh" 2>&1 | tee -a "$log" | sed -u 's/^/    | /' | tail -n 40
rc=${PIPESTATUS[0]}
set -e
say "    exit $rc after $(( $(date +%s) - t0 )) s"
[ "$rc" -eq 0 ] || status=1

if [ "$status" -eq 0 ]; then
  say "fresh-machine-proof: PASS: on a clean Debian 12, 'bash scripts/main.sh' and 'bash scripts/test.sh' succeed"
else
  say "fresh-machine-proof: FAIL: see $log"
fi
exit "$status"
