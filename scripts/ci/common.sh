# Sourced by the job scripts of .github/workflows/rebuild.yml (scripts/ci/<job>.sh).
#
# Each job installs the tool for production only (scripts/setup.sh production|venv: a virtual
# environment with the tool and its runtime dependencies, never the test machinery) and calls
# `pipeline`. The workflow's YAML holds no logic: what a job does is here, where tests run it.
#
# Environment every job reads: PLAN_DIR (plan), CANDIDATES_DIR (candidates), VERDICTS_DIR
# (verdicts), VENV (.venv), PYTHON (python3). GITHUB_OUTPUT / GITHUB_STEP_SUMMARY when set.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
cd "$ROOT"
PLAN_DIR="${PLAN_DIR:-plan}"
CANDIDATES_DIR="${CANDIDATES_DIR:-candidates}"
VERDICTS_DIR="${VERDICTS_DIR:-verdicts}"
export VENV="${VENV:-.venv}"
export PYTHON="${PYTHON:-python3}"

ci_say() { printf 'ci: %s\n' "$*"; }
ci_die() { printf '::error::%s\n' "$*" >&2; exit 1; }

# setup_tool production|venv: the tool on PATH from its virtual environment
setup_tool() {
    scripts/setup.sh "$1"
    PATH="$(cd "$VENV/bin" && pwd):$PATH"
    export PATH
    command -v pipeline >/dev/null || ci_die "the production install left no pipeline command in $VENV/bin"
}

# requested_models: REQUESTED_MODELS (a JSON list of recipe names; "" or []: all) one a line, or
# the job fails (a list that cannot be read must not turn into "every model")
requested_models() {
    "$PYTHON" -c 'import json, os, re, sys
try:
    models = json.loads(os.environ.get("REQUESTED_MODELS") or "[]")
except ValueError:
    sys.exit(1)
if not isinstance(models, list) or not all(
    isinstance(m, str) and re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}", m) for m in models
):
    sys.exit(1)
print("\n".join(models))' || ci_die "REQUESTED_MODELS is not a JSON list of model names: ${REQUESTED_MODELS:0:200}"
}

# write_plan ARGS...: `pipeline rebuild --write-plan $PLAN_DIR ARGS...`, judged. Its exit is 0 when
# every model is planned, else the worst exit code of the models it leaves out, after the whole
# plan is written (the others still build; the report job ends the run red for those left out).
# Any other outcome fails the job: no plan written, a plan left from before, or an exit code that
# is not the one the written plan's left-out models give (a crash after the plan was written).
write_plan() {
    local rc=0 expected
    rm -f "$PLAN_DIR/plan.json"  # a plan from an earlier run must not pass for this one's
    pipeline rebuild --write-plan "$PLAN_DIR" "$@" || rc=$?
    [ -f "$PLAN_DIR/plan.json" ] || ci_die "rebuild --write-plan wrote no plan (exit $rc)"
    expected=$(plan_json 'max([int(e.get("exit_code") or 0) or 2 for e in plan["models"].values() if e["status"] != "ok"], default=0)') \
        || ci_die "rebuild --write-plan wrote an unreadable plan (exit $rc)"
    [ "$rc" = "$expected" ] || ci_die "rebuild --write-plan failed (exit $rc; the plan it wrote leaves out models for exit $expected): see its output above"
    [ "$rc" = 0 ] || echo "plan: some models were left out (exit $rc); the others are planned" >&2
}

# plan_json EXPR: evaluate a Python expression over the plan (`plan`) and print it
plan_json() {
    "$PYTHON" - "$PLAN_DIR/plan.json" "$1" <<'PY'
import json, sys
plan = json.load(open(sys.argv[1]))
value = eval(sys.argv[2], {"plan": plan, "json": json})
print(value if isinstance(value, str) else json.dumps(value))
PY
}

# candidate_of MODEL: the registry reference (name@sha256:...) of the model's planned image
candidate_of() {
    "$PYTHON" - "$PLAN_DIR/plan.json" "$CANDIDATES_DIR" "$1" <<'PY'
import json, sys
from pathlib import Path
plan, root, model = json.load(open(sys.argv[1])), Path(sys.argv[2]), sys.argv[3]
digest = plan["models"][model]["inputs_digest"]
for f in sorted(root.glob("**/candidate.json")):
    c = json.loads(f.read_text()[:100000])
    if c.get("inputs_digest") == digest and model in c.get("models", []):
        ref = c["candidate"]  # repository:tag@sha256:...
        repo = ref.rsplit("@", 1)[0].rsplit(":", 1)[0]
        print(f"{repo}@{ref.rsplit('@', 1)[1]}")
        print(f.parent)
        break
else:
    sys.exit(f"no candidate of {model} (inputs digest {digest[:12]}) in {root}: its build job did not hand one on")
PY
}
