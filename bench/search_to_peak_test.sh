#!/usr/bin/env bash
# --search-to-peak finds what full probes find: the same maximum lengths, the same first OOM,
# and at every length both probed the same peak (the CPU's tracking allocator is exact), so
# a step's memory does not rise after the cut (bench/measure.cpp: Context::stop_after_peak).
set -euo pipefail
BENCH=${1:?streambp-bench}; OUT=${2:-$(mktemp -d)}; mkdir -p "$OUT"
common=(--quick --no-sweep --ablation-seq-len 0 --engines stream,checkpoint --search-align 32)  # --search-align: the GPU script uses it
"$BENCH" "${common[@]}" --json "$OUT/full.json" > "$OUT/full.log"
"$BENCH" "${common[@]}" --search-to-peak --json "$OUT/to_peak.json" > "$OUT/to_peak.log"
# --search-growth (the GPU script's searches from just under the estimate): 1.25x per probe.
"$BENCH" "${common[@]}" --search-to-peak --search-growth 1.25 --json "$OUT/growth.json" > "$OUT/growth.log"
grep -q -- "--search-to-peak: each probe stops" "$OUT/to_peak.log"
python3 - "$OUT/full.json" "$OUT/to_peak.json" <<'PY'
import json, sys
full, cut = (json.load(open(p))["max_seq_len"] for p in sys.argv[1:3])
assert [s["label"] for s in full] == [s["label"] for s in cut] and len(full) == 4, (full, cut)
compared = stopped = bounded = 0
for f, c in zip(full, cut):
    assert (f["max_seq_len"], f["first_oom_seq_len"]) == (c["max_seq_len"], c["first_oom_seq_len"]), \
        (f["label"], f["max_seq_len"], f["first_oom_seq_len"], c["max_seq_len"], c["first_oom_seq_len"])
    assert f["max_seq_len"] > 0 and (f["capped"] or f["first_oom_seq_len"] > 0), f["label"]
    bounded += not f["capped"]
    assert not f["to_peak"] and c["to_peak"]
    peaks = {p["seq_len"]: p for p in f["runs"] if not p["oom"]}
    for p in c["runs"]:
        if p["oom"]:
            continue
        assert p["to_peak"], (c["label"], p["seq_len"])  # every fitting probe was cut
        stopped += 1
        q = peaks.get(p["seq_len"])
        if q is not None:
            assert not q["to_peak"]
            assert q["activation_bytes"] == p["activation_bytes"], (c["label"], p["seq_len"], q["activation_bytes"], p["activation_bytes"])
            compared += 1
    print(f'{c["label"]}: max {c["max_seq_len"]}, first OOM {c["first_oom_seq_len"]} with and without the cut')
assert compared >= 3 and stopped >= 3 and bounded >= 3, (compared, stopped, bounded)
print(f"{compared} lengths with equal peaks, {stopped} probes cut after their peak")
PY
python3 - "$OUT/full.json" "$OUT/growth.json" <<'PY'
import json, sys
full, grown = (json.load(open(p))["max_seq_len"] for p in sys.argv[1:3])
bracketed = 0
for f, g in zip(full, grown):
    assert g["growth"] == 1.25 and f["growth"] == 2, (f["growth"], g["growth"])
    lens = [p["seq_len"] for p in g["runs"]]
    first_oom = next((i for i, p in enumerate(g["runs"]) if p["oom"]), len(lens))
    growing = lens[:first_oom + 1]
    for a, b in zip(growing, growing[1:]):  # before the first OOM: 1.25x per probe (aligned to 32)
        assert a < b <= 1.25 * a + 32, (g["label"], growing)
    if f["capped"] or g["capped"]:
        continue
    # Both bracket the same true maximum: [max, first OOM) of each overlap.
    assert g["max_seq_len"] < f["first_oom_seq_len"] and f["max_seq_len"] < g["first_oom_seq_len"], (f, g)
    bracketed += 1
    print(f'{g["label"]}: 1.25x per probe finds [{g["max_seq_len"]}, {g["first_oom_seq_len"]}), doubling [{f["max_seq_len"]}, {f["first_oom_seq_len"]})')
assert bracketed >= 3, bracketed
PY
