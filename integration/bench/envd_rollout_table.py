"""The table of an envd_rollout.sh run: one row per mode and iteration (cold, then warm)."""

import json
import sys
from pathlib import Path

out = Path(sys.argv[1])
rows = []
for f in sorted(out.glob("*-*.json")):
    r = json.loads(f.read_text())
    mode, it = f.stem.rsplit("-", 1)
    s = r["summary"]
    envs = r["envs"]
    fault = r.get("fault")
    idle = r.get("idle")
    rows.append(
        f"| {mode} | {'cold' if it == '1' else 'warm'} | {r['b']} | {s['ready_p50']:.2f} / "
        f"{s['ready_p99']:.2f} | {s['session_p50_ms']:.1f} / {s['session_p99_ms']:.1f} | "
        f"{s['exec_p50_ms']:.0f} / {s['exec_p99_ms']:.0f} | {r['wall_s']:.1f} | "
        f"{s['rewards_ok']}/{s['n']}{' (' + str(len(r['errors'])) + ' errors)' if r['errors'] else ''} | "
        + (f"{fault.get('state')}: {str(fault.get('state_cause', fault.get('error', '')))[:60]}"
           if fault else "–")
        + " | "
        + (f"{idle['service_daemon_kib_per_env'] / 1024:.2f} MiB (+ shim {idle['shim_kib_per_env'] / 1024:.1f})"
           if idle else "–")
        + " |"
    )
    _ = envs
print("| mode | node | B | ready p50 / p99 (s) | session p50 / p99 (ms) | exec p50 / p99 (ms) "
      "| iteration (s) | rewards | fault env | service+daemon per idle env |")
print("|---|---|---:|---:|---:|---:|---:|---:|---|---:|")
print("\n".join(rows))
