#!/usr/bin/env bash
# docker/runtime-packages.txt (what the runtime image installs) still covers the binary:
# the packages computed from the built streambp-server equal the pinned list (names;
# versions are informational). Then every library the binary loads resolves (ldd).
set -euo pipefail
bin="$1"
repo="$2"
names() { sed -e 's/#.*//' -e 's/[[:space:]]//g' -e '/^$/d' | sort; }
computed="$(bash "$repo/docker/runtime-packages.sh" "$bin" | names)"
pinned="$(names < "$repo/docker/runtime-packages.txt")"
if [ "$computed" != "$pinned" ]; then
  echo "FAIL: docker/runtime-packages.txt is out of date; regenerate with"
  echo "  bash docker/runtime-packages.sh $bin > docker/runtime-packages.txt"
  diff <(echo "$pinned") <(echo "$computed") || true
  exit 1
fi
if ldd "$bin" | grep -q "not found"; then echo "FAIL: unresolved libraries"; ldd "$bin" | grep "not found"; exit 1; fi
echo "PASS: $(echo "$pinned" | wc -l) runtime packages cover $(readelf -d "$bin" | grep -c NEEDED) direct libraries"
