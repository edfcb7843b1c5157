# Shared by the setup scripts of the ctest fixtures that install npm packages
# (tests/text/reference/setup.sh, tests/node/setup.sh). Source it with $out (the fixture's
# folder) and $what (what it makes, for messages) set. Gives:
#   unavailable REASON   with CI=true: fail; otherwise write $out/UNAVAILABLE (the fixture's
#                        tests skip, saying why) and exit 0
#   fail MESSAGE         exit 1
#   require_node         unavailable unless node and npm are installed
#   npm_ci_cached DIR    `npm ci` in DIR (package.json + package-lock.json), skipped when
#                        DIR/node_modules was installed from this same lock file; log in $out/npm.log
unavailable() {
  if [ "${CI:-}" = "true" ]; then echo "FAIL (CI=true): $*" >&2; exit 1; fi
  echo "$*" > "$out/UNAVAILABLE"
  echo "$what unavailable, its tests will skip: $*"
  exit 0
}
fail() { echo "FAIL: $*" >&2; exit 1; }
require_node() {
  command -v node >/dev/null && command -v npm >/dev/null || unavailable "node and npm are not installed"
}
npm_ci_cached() {
  local dir="$1" digest t=$SECONDS
  digest="$(sha256sum < "$dir/package-lock.json" | cut -d' ' -f1)"
  if [ "$(cat "$dir/.lock-digest" 2>/dev/null)" = "$digest" ] && [ -d "$dir/node_modules" ]; then return 0; fi
  rm -f "$dir/.lock-digest"
  if ! (cd "$dir" && timeout 300 npm ci --prefer-offline --no-audit --no-fund --loglevel=error) > "$out/npm.log" 2>&1; then
    unavailable "npm ci failed (is the npm registry reachable?): $(grep -m 3 -E 'code|errno|reason' "$out/npm.log" | tr '\n' ' ')"
  fi
  echo "$digest" > "$dir/.lock-digest"
  echo "npm ci: $((SECONDS - t)) s"
}
