#!/usr/bin/env bash
# deploy/grafana/streambp.json, linted like the manifests and checked against a real server:
# the dashboard's structure (unique ids, a 24-column grid without overlaps, the datasource and
# session variables, balanced PromQL), every metric it queries registered by the server, and,
# on a server with sessions and sessions.metrics_label that trained two SFT steps in a session,
# the /metrics scrape carries each queried family, and the per-session panels' series carry
# that session's label.
set -uo pipefail
server="$1"
cli="$2"
repo="$3"
source "$(dirname "${BASH_SOURCE[0]}")/../cli/common.sh"

cat > "$dir/config.json" <<JSON
{"metrics": {"listen": "127.0.0.1:0"}, "checkpoint_dir": "$dir/ckpt",
 "sessions": {"enabled": true, "metrics_label": true}}
JSON
start_server main --config "$dir/config.json"
metrics_port=""
for _ in $(seq 1 100); do
  metrics_port="$(grep -o 'metrics on http://[0-9.]*:[0-9]*' "$dir/main.log" | sed 's/.*://')"
  [ -n "$metrics_port" ] && break
  sleep 0.1
done
[ -n "$metrics_port" ] || fail "no metrics port in the log"
python3 -c 'import json, random
r = random.Random(4)
for n in (40, 33, 27, 50):
    print(json.dumps({"tokens": [r.randrange(256) for _ in range(n)]}))' > "$dir/sft.jsonl"
"$cli" session create --server "127.0.0.1:$port" --name a > "$dir/create.log" 2>&1 || fail "session create"
"$cli" train --server "127.0.0.1:$port" --session a --objective sft --data "$dir/sft.jsonl" --steps 2 --batch-size 2 \
  > "$dir/train.log" 2>&1 || fail "train"
python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode())' \
  "$metrics_port" > "$dir/metrics.txt" || fail "scrape"

python3 - "$repo" "$dir/metrics.txt" <<'PY' || fail "dashboard checks"
import glob, json, re, sys

repo, scrape_path = sys.argv[1], sys.argv[2]
problems = []
d = json.load(open(f"{repo}/deploy/grafana/streambp.json"))
for key in ("title", "uid", "schemaVersion", "panels", "templating"):
    if key not in d:
        problems.append(f"no {key}")
variables = {v["name"]: v for v in d["templating"]["list"]}
if variables.get("datasource", {}).get("query") != "prometheus":
    problems.append("no prometheus datasource variable")
if "session" not in variables or variables["session"].get("allValue") != ".*":
    problems.append("the session variable must exist with allValue .* (series without the label then match too)")

# Grid: ids unique, inside 24 columns, no two panels on the same cells.
ids, cells = set(), {}
for p in d["panels"]:
    if p["id"] in ids:
        problems.append(f"panel id {p['id']} twice")
    ids.add(p["id"])
    g = p["gridPos"]
    if g["x"] < 0 or g["w"] < 1 or g["x"] + g["w"] > 24 or g["h"] < 1:
        problems.append(f"panel {p['title']}: gridPos {g} outside the 24-column grid")
    for x in range(g["x"], g["x"] + g["w"]):
        for y in range(g["y"], g["y"] + g["h"]):
            if (x, y) in cells:
                problems.append(f"panels {cells[(x, y)]!r} and {p['title']!r} overlap at {(x, y)}")
            cells[(x, y)] = p["title"]

# The metric names the server registers (its sources), and the families the scrape shows.
registered = set()
for path in glob.glob(f"{repo}/server/**/*.cpp", recursive=True):
    src = open(path).read()
    registered |= set(re.findall(r'(?:Name|AddGaugeCallback|AddGaugeSamples|AddCounterSamples|AddCounterCallback)\(\s*"([a-z_]+)"', src))
scrape = open(scrape_path).read()
families = set(re.findall(r"^# TYPE ([a-z_]+) ", scrape, re.M))
samples = [l for l in scrape.splitlines() if l and not l.startswith("#")]

queried, per_session = set(), set()
panels = [p for p in d["panels"] if p["type"] != "row"]
for p in panels:
    if p.get("datasource", {}).get("uid") != "${datasource}":
        problems.append(f"panel {p['title']}: datasource is not the ${{datasource}} variable")
    if not p.get("targets"):
        problems.append(f"panel {p['title']}: no query")
    refs = [t["refId"] for t in p.get("targets", [])]
    if len(set(refs)) != len(refs):
        problems.append(f"panel {p['title']}: refIds repeat")
    for t in p.get("targets", []):
        e = t["expr"]
        for a, b in ("()", "{}", "[]"):
            if e.count(a) != e.count(b):
                problems.append(f"panel {p['title']}: unbalanced {a}{b} in {e}")
        for name in re.findall(r"\b((?:streambp|grpc_server|process)_[a-z_]+)\b", e):
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name.endswith(("_bucket", "_sum", "_count")) else name
            queried.add(base)
            if 'session=~"$session"' in e:
                per_session.add(base)
for name in sorted(queried):
    if name not in registered:
        problems.append(f"the dashboard queries {name}, which the server does not register")
# GRPO's reward and KL exist once a GRPO step ran, per-session skipped steps once one was
# skipped; everything else is in this scrape.
for name in sorted(queried - families - {"streambp_reward_mean", "streambp_kl", "streambp_skipped_steps_total"}):
    problems.append(f"the dashboard queries {name}, absent from the scrape of a server that trained")
# The per-session series this run produced carry session="a".
for name in ("streambp_loss", "streambp_grad_norm", "streambp_learning_rate", "streambp_tokens_per_second",
             "streambp_steps_total", "streambp_policy_version"):
    if name not in per_session:
        problems.append(f"{name} is not filtered by $session")
    if not any(l.startswith(name + "{") and 'session="a"' in l for l in samples):
        problems.append(f"no {name} sample with session=\"a\" in the scrape")
if len(panels) < 15 or len(queried) < 20:
    problems.append(f"{len(panels)} panels over {len(queried)} metrics: expected the whole exposition covered")
for p in problems:
    print("FAIL:", p)
print(f"{len(panels)} panels, {len(queried)} metrics queried, {len(per_session)} per session; {len(problems)} problems")
sys.exit(1 if problems else 0)
PY
echo "PASS: the Grafana dashboard lints and queries what a training server exports"
