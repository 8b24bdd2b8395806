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
