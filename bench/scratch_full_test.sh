#!/usr/bin/env bash
# A max-length search whose offloaded probes outgrow the second tier counts them as out of
# memory and goes on (bench/measure.cpp): each such probe fails before it computes (the
# scratch file's space is reserved up front) naming the folder and what to do, and the search
# bisects to the longest length whose layer inputs fit. The full disk is a file-size limit
# here (ulimit -f, with SIGXFSZ ignored so the reservation fails with EFBIG instead of the
# signal ending the process): 512 KiB.
set -euo pipefail
BENCH=${1:?streambp-bench}; OUT=${2:-$(mktemp -d)}; mkdir -p "$OUT/scratch"
( trap '' XFSZ; ulimit -f 512
  exec "$BENCH" --quick --no-sweep --ablation-seq-len 0 --engines stream:offload --search-align 32 \
    --scratch-dir "$OUT/scratch" --json "$OUT/search.json" ) > "$OUT/search.log"
python3 - "$OUT/search.json" <<'PY'
import json, sys
(s,) = json.load(open(sys.argv[1]))["max_seq_len"]
limit = 512 * 1024
fits = [r for r in s["runs"] if not r["oom"]]
full = [r for r in s["runs"] if r["oom"]]
assert fits and full, "the search should have probes that fit and probes the scratch folder cannot hold"
for r in full:
    assert "the scratch folder is full" in r["oom_message"] and "scratch_dir" in r["oom_message"], r["oom_message"]
for r in fits:
    assert 0 < r["offloaded_bytes"] <= limit, (r["seq_len"], r["offloaded_bytes"])
per_position = fits[-1]["offloaded_bytes"] // fits[-1]["seq_len"]
assert s["max_seq_len"] == max(r["seq_len"] for r in fits) and s["first_oom_seq_len"] > s["max_seq_len"], s
assert s["max_seq_len"] * per_position <= limit < s["first_oom_seq_len"] * per_position, (s["max_seq_len"], per_position)
print(f'max {s["max_seq_len"]} ({s["max_seq_len"] * per_position} bytes offloaded), first OOM {s["first_oom_seq_len"]}: '
      f'{len(full)} probes refused by a full scratch folder')
PY
