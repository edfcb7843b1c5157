#!/usr/bin/env bash
# Builds the Node package client/node for the node.* tests (the ctest fixture node.setup):
#   OUT/proto/, OUT/client/node/   a copy of proto/ and the package's sources, so that the
#                                  package's relative paths (../../proto) hold as in the repo
#   OUT/client/node/node_modules/  `npm ci` of package-lock.json (redone only when the lock changes)
#   OUT/client/node/dist/, build/  `npm run build` (the package) and `npm run build:dev` (examples, tests)
#   OUT/COMPLETE                   written last
# When node, npm or the npm registry is missing: with CI=true this fails; otherwise it writes
# OUT/UNAVAILABLE with the reason and the node.* tests skip, saying so (tests/node/run.sh).
#
# usage: setup.sh SOURCE_DIR OUT_DIR
set -uo pipefail
src="$1"; out="$2"
pkg="$out/client/node"
mkdir -p "$pkg"
rm -f "$out/COMPLETE" "$out/UNAVAILABLE"

what="Node package"
source "$src/tests/npm_fixture.sh"
start=$SECONDS
require_node

# 1. The sources (everything but what npm and the builds make), fresh each time.
find "$pkg" -mindepth 1 -maxdepth 1 ! -name node_modules ! -name .lock-digest -exec rm -rf {} +
rm -rf "$out/proto" && cp -r "$src/proto" "$out/proto"
(cd "$src/client/node" && tar cf - --exclude=./node_modules --exclude=./dist --exclude=./build --exclude=./proto .) \
  | (cd "$pkg" && tar xf -) || fail "cannot copy client/node"

# 2. npm ci, cached by the lock file's digest.
npm_ci_cached "$pkg"

# 3. The package, then the examples and tests against it (type errors fail here too).
t=$SECONDS
(cd "$pkg" && npm run --silent build && npm run --silent build:dev) > "$out/build.log" 2>&1 \
  || fail "building the package: $(grep -v 'npm warn' "$out/build.log" | tail -30)"
echo "npm run build: $((SECONDS - t)) s"

touch "$out/COMPLETE"
echo "Node package ready in $pkg ($((SECONDS - start)) s)"
