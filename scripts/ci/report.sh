#!/usr/bin/env bash
# The final job: the run is red when any model was left out of the plan or any job failed,
# after everything else ran. NEEDS: the workflow's `toJSON(needs)`.
#
#   scripts/ci/report.sh
. "$(dirname "$0")/common.sh"

"$PYTHON" - "$PLAN_DIR/plan.json" <<'PY'
import json, os, sys
from pathlib import Path
needs = json.loads(os.environ.get("NEEDS") or "{}")
plan_file = Path(sys.argv[1])
bad = [f"job {job}: {v.get('result')}" for job, v in sorted(needs.items()) if v.get("result") not in ("success", "skipped")]
if plan_file.is_file():
    plan = json.loads(plan_file.read_text())
    bad += [f"{m}: left out ({plan['models'][m]['status']})" for m in plan["matrix"]["left_out"]]
else:
    bad.append("no plan")
summary = os.environ.get("GITHUB_STEP_SUMMARY")
if summary:
    with open(summary, "a") as f:
        f.write("### rebuild\n\n" + ("\n".join(f"- {b}" for b in bad) if bad else "every planned model went through") + "\n")
for b in bad:
    print(f"::error::{b}")
sys.exit(1 if bad else 0)
PY
