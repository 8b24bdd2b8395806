#!/usr/bin/env bash
# A build job (a build host, [self-hosted, linux, build], or a remote BuildKit builder): build one
# inputs digest of the plan, for every model that shares it, and hand its registry digest on.
#
#   scripts/ci/build.sh INPUTS_DIGEST
# The wheelhouse is the plan job's (WHEELS_DIR, default wheels/): the same bytes, the same digest.
. "$(dirname "$0")/common.sh"

digest="${1:?usage: scripts/ci/build.sh INPUTS_DIGEST}"
[[ "$digest" =~ ^[0-9a-f]{64}$ ]] || ci_die "not an inputs digest: ${digest:0:80}"
export PIPELINE_WHEELS_DIR="${PIPELINE_WHEELS_DIR:-$ROOT/${WHEELS_DIR:-wheels}}"
setup_tool production

out="$CANDIDATES_DIR/${digest:0:12}"
pipeline rebuild --plan "$PLAN_DIR/plan.json" --build "$digest" --candidate-dir "$out"
# the build's attestations travel with the candidate: the tag job's record links them
run_dir=$("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["run_dir"])' "$out/candidate.json")
for f in attestations.json provenance.json; do
    [ -f "$run_dir/$f" ] && cp "$run_dir/$f" "$out/$f"
done
ci_say "candidate: $("$PYTHON" -c 'import json, sys; print(json.load(open(sys.argv[1]))["candidate"])' "$out/candidate.json")"
