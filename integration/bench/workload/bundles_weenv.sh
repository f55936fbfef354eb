#!/usr/bin/env bash
# Converts the workload's static bundles (bundles/TASK:H) to weenv (bundles-weenv/TASK:H) in
# the workload's registry storage, for the rollout benchmark's "bundles lazily via weenv" mode,
# records them in out/workload.json and refreshes out/table1.md. Idempotent: a bundle already
# converted is skipped. Each conversion converts the shared base layer again (same output,
# stored once). The same as build.sh with BUNDLES_WEENV=1, without rebuilding the rest.
# Needs docker-registry, python3 and weenv-convert (WEENV_BIN, default target/debug).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${WEENV_BIN:-$(cd "$HERE/../../.." && pwd)/target/debug}
CACHE=${CACHE:-/var/tmp/weenv-workload}
OUT="$CACHE/out"
[ -f "$OUT/workload.json" ] || { echo "no workload in $CACHE: run build.sh" >&2; exit 2; }
[ -x "$BIN/weenv-convert" ] || { echo "missing $BIN/weenv-convert" >&2; exit 2; }
. "$HERE/../lib.sh"
bench_workdir weenv-bw
local_registry "$CACHE/registry"
PY="python3 $HERE/workload.py"
for t in $(python3 -c 'import json,sys; print(" ".join(t["id"] for t in json.load(open(sys.argv[1]))["tasks"]))' "$OUT/workload.json"); do
    for h in v1 v2; do
        if curl -sf -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$REG/v2/bundles-weenv/$t/manifests/$h"; then
            continue
        fi
        "$BIN/weenv-convert" --plain-http "$REG" image --jobs 1 "$REG/bundles/$t:$h" "$REG/bundles-weenv/$t:$h" >"$W/convert.log" 2>&1 ||
            { cat "$W/convert.log" >&2; exit 1; }
        log "converted bundles/$t:$h"
    done
done
python3 - "$OUT/workload.json" <<'EOC'
import json, sys
p = sys.argv[1]
w = json.load(open(p))
w["bundles_weenv"] = {t["id"]: {h: f"bundles-weenv/{t['id']}:{h}" for h in sorted(w["harnesses"])} for t in w["tasks"]}
json.dump(w, open(p, "w"), indent=1)
EOC
cp "$OUT/table1.md" "$W/table1.old"
{
    $PY table "$OUT/workload.json" "$REG"
    echo
    sed -n '/^`weenv-convert plan stats`/,$p' "$W/table1.old"
} >"$OUT/table1.md"
cat "$OUT/table1.md"
