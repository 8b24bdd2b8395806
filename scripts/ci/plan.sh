#!/usr/bin/env bash
# The plan job (a GitHub-hosted runner, no GPU, no build): pin and check once for every model,
# render each to its inputs digest and aiter stage key, write plan/ (plan.json, each model's lock
# and check reports), the check's SARIF (one run, every model's findings), the matrices as job
# outputs, and a summary row and an annotation for each model left out of the build.
#
#   scripts/ci/plan.sh            REQUESTED_MODELS: a JSON list of recipe names ("" or []: all)
. "$(dirname "$0")/common.sh"

# the inputs first: a bad one fails the job before anything is installed
args=()
models=$(requested_models) || exit 1
while IFS= read -r m; do
    [ -n "$m" ] && args+=("--model=$m")
done <<<"$models"
# the GPU hosts (vars.MI355_RUNNERS): the plan builds that many images first, to smoke early
gpu_hosts="${GPU_HOSTS:-1}"
[[ "$gpu_hosts" =~ ^[1-9][0-9]{0,2}$ ]] || ci_die "GPU_HOSTS (vars.MI355_RUNNERS) must be a number of hosts, 1 or more: ${gpu_hosts:0:40}"
args+=("--gpu-hosts=$gpu_hosts")

setup_tool production
# models left out are not a failure of this job (the report job's); anything else is
write_plan "${args[@]}"

# one SARIF run for the upload: every model's findings, deduplicated
"$PYTHON" - "$PLAN_DIR" <<'PY'
import json, sys
from pathlib import Path
plan_dir = Path(sys.argv[1])
runs, seen, results = [], set(), []
for f in sorted(plan_dir.glob("reports/*/check.sarif")):
    for run in json.loads(f.read_text()).get("runs", []):
        runs.append(run)
        for r in run.get("results", []):
            key = json.dumps(r, sort_keys=True)
            if key not in seen:
                seen.add(key)
                results.append(r)
if runs:
    merged = {**runs[0], "results": results}
    out = {"version": "2.1.0", "$schema": "https://json.schemastore.org/sarif-2.1.0.json", "runs": [merged]}
    (plan_dir / "check.sarif").write_text(json.dumps(out, indent=1) + "\n")
PY

left_out=$(plan_json 'plan["matrix"]["left_out"]')
if [ -n "${GITHUB_OUTPUT:-}" ]; then
    for k in lead follow follow_first follow_rest smoke smoke_lead smoke_first smoke_rest left_out released; do
        echo "$k=$(plan_json "plan['matrix']['$k']")" >>"$GITHUB_OUTPUT"
    done
fi
# a model no common pair serves: an annotation, a row; the report job fails the run for it
"$PYTHON" - "$PLAN_DIR/plan.json" <<'PY'
import json, os, sys
plan = json.load(open(sys.argv[1]))
summary = os.environ.get("GITHUB_STEP_SUMMARY")
for model, entry in sorted(plan["models"].items()):
    if entry["status"] == "ok":
        continue
    notes = "; ".join(entry.get("notes", []))[:500].replace("\n", " ")
    print(f"::error title={model} left out of the rebuild::{entry['status']}: {notes}")
    if summary:
        with open(summary, "a") as f:
            f.write(f"| {model} | left out: {entry['status']} | {notes} |\n")
PY
ci_say "plan: lead $(plan_json 'len(plan["matrix"]["lead"])'), follow $(plan_json 'len(plan["matrix"]["follow"])'), smoke $(plan_json '[len(plan["matrix"][k]) for k in ("smoke_lead", "smoke_first", "smoke_rest")]') (three waves), left out $left_out"
