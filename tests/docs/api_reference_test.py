#!/usr/bin/python3
"""docs/api.md is the API reference generated from proto/ by scripts/gen_api_docs.py.

1. Drift: a fresh rendering (the generator run with the build's protoc into a temporary
   file) must equal the committed docs/api.md; the failure says how to regenerate it.
2. Coverage, independently of the generator: every service, rpc, message and enum declared
   in proto/**/*.proto (read here with a small tokenizer of its own, comments and strings
   removed) appears in docs/api.md as a `code` name.

usage: api_reference_test.py PROTOC REPO_ROOT
"""
import difflib
import os
import re
import subprocess
import sys
import tempfile

protoc, repo = sys.argv[1], sys.argv[2]
api_md = os.path.join(repo, "docs", "api.md")
regenerate = "/usr/bin/python3 scripts/gen_api_docs.py"
failures = []

if not os.path.exists(api_md):
    sys.exit(f"FAIL: {api_md} does not exist; generate it with `{regenerate}` (in {repo}) and commit it")
committed = open(api_md).read()

# --- 1. drift ---------------------------------------------------------------------------
with tempfile.TemporaryDirectory() as tmp:
    fresh_path = os.path.join(tmp, "api.md")
    r = subprocess.run([sys.executable, os.path.join(repo, "scripts", "gen_api_docs.py"), "--protoc", protoc,
                        "--out", fresh_path], capture_output=True, text=True)
    if r.returncode != 0:
        sys.exit(f"FAIL: scripts/gen_api_docs.py failed:\n{r.stdout}{r.stderr}")
    fresh = open(fresh_path).read()
if fresh != committed:
    diff = list(difflib.unified_diff(committed.splitlines(), fresh.splitlines(), "docs/api.md (committed)",
                                     "docs/api.md (from proto/ now)", lineterm="", n=1))
    shown = "\n".join(diff[:80]) + (f"\n... {len(diff) - 80} more diff lines" if len(diff) > 80 else "")
    failures.append("docs/api.md is out of date with proto/. Regenerate and commit it:\n"
                    f"    cd {repo} && {regenerate}\n{shown}")

# --- 2. every declared name appears -----------------------------------------------------
TOKEN = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|//[^\n]*|/\*.*?\*/', re.S)
DECL = re.compile(r"\b(service|rpc|message|enum)\s+([A-Za-z_]\w*)\s*[({]")
declared = []
for dirpath, dirs, files in os.walk(os.path.join(repo, "proto")):
    for name in sorted(files):
        if name.endswith(".proto"):
            path = os.path.join(dirpath, name)
            code = TOKEN.sub(lambda m: " " if m.group(0)[0] == "/" else '""', open(path).read())
            declared += [(os.path.relpath(path, repo), kind, ident) for kind, ident in DECL.findall(code)]
kinds = {k for _, k, _ in declared}
if not {"service", "rpc", "message"} <= kinds:
    failures.append(f"found no service/rpc/message declarations under proto/ (found kinds {sorted(kinds)})")
for path, kind, ident in declared:
    if not re.search(r"`(?:[\w.]*\.)?" + re.escape(ident) + "`", committed):
        failures.append(f"{path}: {kind} {ident} does not appear in docs/api.md (regenerate: {regenerate})")

if failures:
    print("FAIL:\n" + "\n".join(failures))
    sys.exit(1)
counts = {k: sum(1 for _, kk, _ in declared if kk == k) for k in ("service", "rpc", "message", "enum")}
print(f"PASS: docs/api.md equals a fresh rendering of proto/; it names every declaration ({counts})")
