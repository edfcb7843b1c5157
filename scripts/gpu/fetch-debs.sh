#!/usr/bin/env bash
# On a Debian 12 machine with apt, from the repository root: downloads the packages of
# scripts/gpu/packages.txt into .gpu/debs (git-ignored through .git/info/exclude) and the
# tokenizer of the server check into .gpu/tokenizer, so that a GPU machine without apt gets
# them beside the working tree (docs/gpu.md).
set -euo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
cd "$root"
exclude=$(git rev-parse --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.gpu/' "$exclude" 2>/dev/null || echo '/.gpu/' >> "$exclude"
mkdir -p .gpu/debs .gpu/tokenizer
[ -n "$(ls /var/lib/apt/lists/*Packages 2>/dev/null)" ] || apt-get update -qq
(cd .gpu/debs && apt-get download -qq $(grep -v '^#' "$root/scripts/gpu/packages.txt"))
# The server check serves a tiny model with a real tokenizer (the Qwen3 one of the text tests).
tok=${TOKENIZER_DIR:-build/text_reference/models/qwen3}
if [ -f "$tok/tokenizer.json" ]; then cp "$tok"/tokenizer*.json .gpu/tokenizer/; else
  echo "fetch-debs: no tokenizer at $tok (build the tests first: the text_reference fixture)"; fi
du -sh .gpu
