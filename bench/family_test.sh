#!/usr/bin/env bash
# --family: the embedded preset in another family's config.json (here Gemma3: four norms per
# layer, sliding layers, tied head) runs the quick sweep with the usual checks (memory ordered
# stream < checkpoint < full), and the report names the family it ran; a family it does not know is
# refused before any model is built.
set -euo pipefail
BENCH=${1:?streambp-bench}; OUT=${2:-$(mktemp -d)}; mkdir -p "$OUT"
"$BENCH" --quick --family gemma3 --no-search --ablation-seq-len 0 --check --json "$OUT/gemma3.json" > "$OUT/gemma3.log"
grep -q "preset tiny as gemma3" "$OUT/gemma3.log"
python3 - "$OUT/gemma3.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["model"]["family"] == "gemma3", r["model"]["family"]
c = r["model"]["config"]
assert c["architectures"] == ["Gemma3ForCausalLM"] and c["model_type"] == "gemma3_text", c
assert c["sliding_window"] == 512, c
engines = {x["variant"] if "variant" in x else x["label"] for x in r["runs"]}
assert {"full", "checkpoint", "stream"} <= {e.split(":")[0].split("+")[0] for e in engines}, engines
print("gemma3 preset:", sorted(engines))
PY
if "$BENCH" --quick --family gemma4 > "$OUT/refused.log" 2>&1; then echo "an unknown family was accepted"; exit 1; fi
grep -q "unknown model family 'gemma4'" "$OUT/refused.log"
echo "refused: $(grep -o "unknown model family[^)]*)" "$OUT/refused.log" | head -1)"
