#!/usr/bin/env bash
# The tag job (one at a time per repository: `concurrency: tag-<repository>`): tag each model whose
# verdict passed, and nothing else; the image is pulled by the digest its verdict names.
#
#   scripts/ci/tag.sh
. "$(dirname "$0")/common.sh"

setup_tool venv
failed=()
tagged=0
for model in $(plan_json '" ".join(plan["matrix"]["smoke"])'); do
    verdict="$VERDICTS_DIR/$model/verdict.json"
    if [ ! -f "$verdict" ]; then
        ci_say "$model: no verdict (its smoke job did not finish): not tagged"
        continue
    fi
    passed=$("$PYTHON" -c 'import json, sys
v = json.load(open(sys.argv[1]))
print("passed" if v.get("passed") is True else v.get("status", "unreadable"))' "$verdict")
    if [ "$passed" != "passed" ]; then
        ci_say "$model: verdict $passed: not tagged"
        continue
    fi
    found=$(candidate_of "$model") || { failed+=("$model"); continue; }
    ref=$(sed -n 1p <<<"$found")
    dir=$(sed -n 2p <<<"$found")
    docker pull --quiet "$ref" >/dev/null
    att=()
    [ -f "$dir/attestations.json" ] && att=(--build-attestations "$dir/attestations.json")
    if pipeline tag --image "$ref" --verdict "$verdict" --lock "$PLAN_DIR/$(plan_json "plan['models']['$model']['lock']")" \
            --recipe "${PIPELINE_RECIPES_DIR:-recipes}/$model.yaml" "${att[@]}"; then
        tagged=$((tagged + 1))
    else
        failed+=("$model")
    fi
done
ci_say "tagged $tagged model(s)"
[ ${#failed[@]} -eq 0 ] || ci_die "tagging failed for: ${failed[*]}"
