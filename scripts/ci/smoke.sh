#!/usr/bin/env bash
# A smoke job (a GPU host, [self-hosted, linux, mi355]): pull the model's candidate by digest from
# the registry (DOCKER_HOST: the engine with the GPUs) and smoke-test it; the verdict, JUnit and
# run directory go to VERDICTS_DIR/<model>/.
#
#   scripts/ci/smoke.sh MODEL
. "$(dirname "$0")/common.sh"

model="${1:?usage: scripts/ci/smoke.sh MODEL}"
[[ "$model" =~ ^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$ ]] || ci_die "not a model name: ${model:0:80}"
setup_tool venv

found=$(candidate_of "$model") || exit 1
ref=$(sed -n 1p <<<"$found")
ci_say "$model: pulling $ref"
docker pull --quiet "$ref" >/dev/null
mkdir -p "$VERDICTS_DIR"
rc=0
# the model's planned lock: the verdict binds it to the image (model-free: built from its pair)
pipeline smoke --image "$ref" --model "$model" --lock "$PLAN_DIR/$(plan_json "plan['models']['$model']['lock']")" \
    --run-dir "$VERDICTS_DIR/$model" || rc=$?
printf '%s\n' "$ref" >"$VERDICTS_DIR/$model/candidate.txt"
exit "$rc"
