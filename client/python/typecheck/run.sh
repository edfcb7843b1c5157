#!/usr/bin/env bash
# The type check of the Python SDK (test python.typecheck): pyright, pinned by
# package-lock.json and installed with `npm ci` into CACHE (redone only when the lock
# changes), over the package and the examples (client/python/pyrightconfig.json), against
# PYTHON's site packages (Debian's grpcio and protobuf; pyright's bundled typeshed stubs).
# Without node/npm or the npm registry: fails when CI=true, else exits 77 (ctest: skipped).
#
# usage: run.sh CACHE [PYTHON]
set -uo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
cache="$1"; python="${2:-/usr/bin/python3}"

unavailable() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL (CI=true): $*" >&2; exit 1; fi
  echo "SKIPPED: $*"
  exit 77
}

command -v node >/dev/null && command -v npm >/dev/null || unavailable "node and npm are not installed"
digest="$(sha256sum "$here/package-lock.json" | cut -d' ' -f1)"
if [ "$(cat "$cache/.lock-digest" 2>/dev/null)" != "$digest" ] || [ ! -x "$cache/node_modules/.bin/pyright" ]; then
  rm -rf "$cache"; mkdir -p "$cache"
  cp "$here/package.json" "$here/package-lock.json" "$cache/"
  if ! (cd "$cache" && timeout 300 npm ci --prefer-offline --no-audit --no-fund --loglevel=error) > "$cache/npm.log" 2>&1; then
    unavailable "npm ci of pyright failed (is the npm registry reachable?): $(grep -m 3 -E 'code|errno|reason' "$cache/npm.log" | tr '\n' ' ')"
  fi
  echo "$digest" > "$cache/.lock-digest"
fi
exec "$cache/node_modules/.bin/pyright" -p "$here/.." --pythonpath "$python"
