#!/usr/bin/env bash
# The first hour with the command-line programs (issue 29): a mistyped command gets a
# suggestion, the help shows no "=0" beside another default, sessions are named the same way
# in create/get/delete, a script run twice can get-or-create its session, an empty session
# list says what to do, counts read "1 example", and a model without a tokenizer samples from
# token ids.
set -uo pipefail
server="$1"
cli="$2"
source "$(dirname "${BASH_SOURCE[0]}")/common.sh"

expect_error() {  # expect_error CODE "substring" cmd...
  local want_rc="$1" want="$2"; shift 2
  local out rc
  out="$("$@" 2>&1)"; rc=$?
  [ "$rc" -eq "$want_rc" ] || fail "exit $rc (want $want_rc): $*: $out"
  grep -qF -- "$want" <<<"$out" || fail "expected '$want' in: $out"
}

# Mistyped commands, at the top and one level down, in both programs.
expect_error 2 "unknown command 'sesion': did you mean 'session'?" "$cli" sesion list
expect_error 2 "unknown command 'session lst': did you mean 'session list'?" "$cli" session lst
expect_error 109 "unknown command 'verfy': did you mean 'verify'?" "$server" --threads 1 verfy
expect_error 109 "(commands: init-model, tokenize" "$server" frobnicate
"$cli" --help > /dev/null || fail "--help"

# No "=0" where 0 stands for a default the text names.
for cmd in "logprobs" "session create" "info"; do
  help="$("$cli" $cmd --help)"
  ! grep -E -- "--(temperature|timeout|lr|lora-alpha|groups-per-step) [A-Z:]*=0" <<<"$help" \
    || fail "'$cmd --help' shows =0 beside a named default: $(grep -E -- '=0' <<<"$help")"
done

# serve --help shows the defaults the flags fall back to (the config's).
help="$("$server" serve --help)"
for want in "(default 127.0.0.1:50051)" "learning rate (default 1e-05)" "(default stream)" "(default 32768)"; do
  grep -qF -- "$want" <<<"$help" || fail "serve --help lacks '$want'"
done

start_server sessions --preset tiny --dtype float32 --checkpoint-dir "$dir/ckpt" --config <(
  echo '{"sessions": {"enabled": true}, "trainer": {"optimizer": {"name": "adamw", "lr": 0.001}}}')
addr="127.0.0.1:$port"

out="$("$cli" session list --server "$addr" 2>&1)" || fail "session list"
grep -q "no sessions yet" <<<"$out" || fail "empty list: $out"
grep -q "streambp session create NAME" <<<"$out" || fail "empty list says what to do: $out"

# Positional or --name, the same in create, get and delete.
[ "$("$cli" session create alpha --server "$addr" --lora-rank 2)" = alpha ] || fail "create NAME"
[ "$("$cli" session create --name beta --server "$addr" --lora-rank 2)" = beta ] || fail "create --name NAME"
"$cli" session get alpha --server "$addr" | grep -q "^alpha" || fail "get NAME"
"$cli" session get --name beta --server "$addr" | grep -q "^beta" || fail "get --name NAME"
expect_error 2 "give the session's name: streambp session get NAME" "$cli" session get --server "$addr"
# A script run again: ALREADY_EXISTS, unless --exist-ok (get-or-create).
expect_error 1 "ALREADY_EXISTS" "$cli" session create alpha --server "$addr" --lora-rank 2
out="$("$cli" session create alpha --exist-ok --server "$addr" --lora-rank 2 2>&1)" || fail "--exist-ok: $out"
grep -q "exists already: used as it is" <<<"$out" || fail "--exist-ok says so: $out"
out="$("$cli" session list --server "$addr" 2>&1)"
grep -q "^2 sessions (the server holds up to" <<<"$out" || fail "list count: $out"
"$cli" session delete --name beta --server "$addr" | grep -q "deleted beta" || fail "delete --name"
out="$("$cli" session list --server "$addr" 2>&1)"
grep -q "^1 session (the server holds" <<<"$out" || fail "one session: $out"

# Server messages that speak of the API get this command line's words beside them.
expect_error 1 "(on this command line: --lora-rank)" "$cli" session create gamma --server "$addr" --lora-rank 0
# The flag reaches the server: a dense model has no router to train.
expect_error 1 "modules_to_save has 'gate' (the mixture-of-experts router), but this model has no" \
  "$cli" session create gamma --server "$addr" --lora-rank 2 --lora-modules-to-save gate
echo '{"tokens": [1, 2, 3, 4, 5, 6]}' > "$dir/one.jsonl"
expect_error 1 "give --session NAME" "$cli" train --server "$addr" --objective sft --data "$dir/one.jsonl"
# "1 example, ... 1 batch per pass ... 1 step".
out="$("$cli" train --server "$addr" --session alpha --objective sft --data "$dir/one.jsonl" --batch-size 1)" \
  || fail "train: $out"
grep -q "1 example, 6 tokens; 1 batch per pass (1 example per step); 1 step" <<<"$out" || fail "counts: $out"

# The embedded model has no tokenizer: sample from ids.
expect_error 2 "--prompt-ids 1,5,9" "$cli" sample --server "$addr" --session alpha
out="$("$cli" sample --server "$addr" --session alpha --prompt-ids 1,5,9 -n 2 --max-tokens 4 --seed 3 2>&1)" \
  || fail "sample --prompt-ids: $out"
[ "$(grep -cE '^[0-9]+(,[0-9]+){3}$' <<<"$out")" -eq 2 ] || fail "two completions of 4 ids each: $out"

# Sampler snapshots: save, sample from it while the session trains on (same ids), list, export, delete.
"$cli" snapshot save v1 --server "$addr" --session alpha | grep -q "^v1 .*step 1 " || fail "snapshot save"
sample_v1() { "$cli" sample --server "$addr" --session alpha --snapshot v1 --prompt-ids 1,5,9 -n 2 --max-tokens 4 --seed 3; }
before="$(sample_v1)" || fail "sample --snapshot: $before"
"$cli" train --server "$addr" --session alpha --objective sft --data "$dir/one.jsonl" --batch-size 1 >/dev/null \
  || fail "train after the snapshot"
[ "$(sample_v1)" = "$before" ] || fail "the snapshot samples the same after the session trained"
out="$("$cli" snapshot list --server "$addr" --session alpha 2>&1)" || fail "snapshot list: $out"
grep -q "^v1 " <<<"$out" && grep -q "^1 snapshot (a session holds up to 8" <<<"$out" || fail "snapshot list: $out"
"$cli" export-weights --server "$addr" --session alpha --snapshot v1 --out "$dir/v1" >/dev/null \
  && [ -f "$dir/v1/adapter_model.safetensors" ] || fail "export-weights --snapshot"
expect_error 1 "ALREADY_EXISTS" "$cli" snapshot save v1 --server "$addr" --session alpha
"$cli" snapshot delete v1 --server "$addr" --session alpha | grep -q "deleted v1" || fail "snapshot delete"
expect_error 1 "NOT_FOUND" "$cli" sample --server "$addr" --session alpha --snapshot v1 --prompt-ids 1,5 --max-tokens 2
echo "PASS"
