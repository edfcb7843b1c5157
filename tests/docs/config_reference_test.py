#!/usr/bin/python3
"""docs/operations.md documents every configuration key, with the default the server uses.

The keys and defaults come from the server itself: `streambp-server serve --check-config`
prints the effective configuration with every default filled in. Every key (objects
flattened to dotted paths; an object that defaults to {} is one key) must have a row in a
table of docs/operations.md whose first cell is the key in backticks, and the row's default
(second cell) must equal the server's; every documented key must exist (keys of list items,
written `list[].key`, excepted). A key added to the config without documentation fails here.

usage: config_reference_test.py STREAMBP_SERVER_BINARY REPO_ROOT
"""
import json
import math
import os
import re
import subprocess
import sys

server_bin, repo = sys.argv[1], sys.argv[2]
doc_path = os.path.join(repo, "docs", "operations.md")
failures = []

r = subprocess.run([server_bin, "serve", "--check-config"], capture_output=True, text=True)
if r.returncode != 0 or "config OK" not in r.stderr:
    sys.exit(f"FAIL: streambp-server serve --check-config: {r.stderr.strip()}")
effective = json.loads(r.stdout)


def flatten(node, prefix=""):
    if isinstance(node, dict) and node:
        for k, v in node.items():
            yield from flatten(v, f"{prefix}.{k}" if prefix else k)
    else:
        yield prefix, node


keys = dict(flatten(effective))

# Rows of the documentation's tables: | `key` | default | meaning |
documented = {}
for line in open(doc_path, encoding="utf-8"):
    cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
    m = re.fullmatch(r"`([a-z_][\w.\[\]]*)`", cells[0]) if cells else None
    if m and len(cells) >= 3:
        documented[m.group(1)] = cells[1]


def parse_default(text):
    """`"tiny"` -> "tiny", 67108864 (64 MiB) -> 67108864, [0.9, 0.999] -> list, {} -> {}."""
    t = text.replace("`", "").strip()
    t = re.sub(r"\s+\(.*\)$", "", t)
    for parse in (json.loads, float):
        try:
            return parse(t)
        except ValueError:
            pass
    return t


def same(doc, actual):
    if isinstance(actual, bool) or isinstance(doc, bool):
        return doc is actual
    if isinstance(actual, (int, float)) and isinstance(doc, (int, float)):
        return math.isclose(doc, actual, rel_tol=1e-12, abs_tol=0)
    if isinstance(actual, list) and isinstance(doc, list):
        return len(doc) == len(actual) and all(same(a, b) for a, b in zip(doc, actual))
    return doc == actual


for key, value in keys.items():
    if key not in documented:
        failures.append(f"config key {key} (default {json.dumps(value)}) has no row in docs/operations.md")
    elif not same(parse_default(documented[key]), value):
        failures.append(f"docs/operations.md: {key} is documented with default {documented[key]!r}, "
                        f"the server's is {json.dumps(value)}")
for key in documented:
    if "[]." not in key and key not in keys and not any(k.startswith(key + ".") for k in keys):
        failures.append(f"docs/operations.md documents {key}, which the server's config does not have")

if failures:
    print("FAIL:\n  " + "\n  ".join(failures))
    sys.exit(1)
print(f"PASS: docs/operations.md documents all {len(keys)} configuration keys with the server's defaults")
