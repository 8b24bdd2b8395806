#!/usr/bin/env bash
# The logic of the repository's composite action (action.yml): run `pipeline check` for an ATOM
# pull request, or `pipeline impact` for an aiter pull request, keep the SARIF, write the step
# summary and the step outputs. tests/git/test_compat_action.py runs this script as the action does.
#
# Inputs come as INPUT_* variables (action.yml maps each input to one); GitHub's own variables
# (GITHUB_REPOSITORY, GITHUB_WORKSPACE, GITHUB_OUTPUT, GITHUB_STEP_SUMMARY, RUNNER_TEMP) as set.
# Exit 0 with the verdict in the outputs (breaks=true|false, exit-code=0|4); any other exit code
# of the tool is a failure of the run itself and is this script's exit code.
set -euo pipefail

say() { printf 'compat-action: %s\n' "$*" >&2; }

mode=${INPUT_MODE:-auto}
if [ "$mode" = auto ]; then
    case "${GITHUB_REPOSITORY:-}" in
        */aiter) mode=impact ;;
        *) mode=check ;;
    esac
fi
case "$mode" in
    check | impact) ;;
    *) say "mode must be auto, check or impact (got '$mode')"; exit 2 ;;
esac

out=${INPUT_OUTPUT_DIR:-${RUNNER_TEMP:-/tmp}/atom-image-pipeline}
cache=${INPUT_CACHE_DIR:-${PIPELINE_CACHE_DIR:-${RUNNER_TEMP:-/tmp}/atom-image-pipeline-cache}}
mkdir -p "$out" "$cache/mirrors"
export PIPELINE_CACHE_DIR="$cache"
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)  # the action's checkout: its recipes and locks
export PIPELINE_RECIPES_DIR="${PIPELINE_RECIPES_DIR:-$here/recipes}"
export PIPELINE_LOCKS_DIR="${PIPELINE_LOCKS_DIR:-$here/locks}"
read -r -a tool <<<"${PIPELINE_CMD:-pipeline}"

# A repository given as a URL is mirrored into the cache (full history: causes need it), once,
# then fetched; a local path (the pull request's own checkout) is read as it is.
repo() {
    local given=$1 name=$2
    case "$given" in
        http://* | https://* | ssh://* | git@* | file://*)
            local dir="$cache/mirrors/$name.git"
            if [ -d "$dir" ]; then
                git --git-dir="$dir" fetch --quiet --prune origin '+refs/heads/*:refs/heads/*' >&2
            else
                git clone --quiet --mirror "$given" "$dir" >&2
            fi
            printf '%s\n' "$dir"
            ;;
        *) printf '%s\n' "$given" ;;
    esac
}

workspace=${GITHUB_WORKSPACE:-$PWD}
args=()
if [ "$mode" = check ]; then
    atom_repo=$(repo "${INPUT_ATOM_REPO:-$workspace}" atom)
    aiter_repo=$(repo "${INPUT_AITER_REPO:-https://github.com/ROCm/aiter.git}" aiter)
    if [ -n "${INPUT_LOCK:-}" ]; then
        # the pinned aiter of a released lock, against the pull request's ATOM
        aiter_ref=$(python3 -c 'import sys, tomllib; print(tomllib.load(open(sys.argv[1], "rb"))["sources"]["aiter"]["sha"])' "$INPUT_LOCK")
    else
        aiter_ref=${INPUT_AITER_REF:-main}
    fi
    args+=(--atom "${INPUT_ATOM_REF:-HEAD}" --aiter "$aiter_ref")
    read -r -a models <<<"${INPUT_MODELS:-}"
    if [ "${#models[@]}" -gt 0 ]; then
        args+=(--model "${models[0]}")  # the check gates for one model
        [ "${#models[@]}" -eq 1 ] || say "check gates for one model: ${models[0]} (the others are ignored)"
    else
        say "no model given: every finding gates (models: sets the model whose path gates)"
    fi
else
    aiter_repo=$(repo "${INPUT_AITER_REPO:-$workspace}" aiter)
    atom_repo=$(repo "${INPUT_ATOM_REPO:-https://github.com/ROCm/ATOM.git}" atom)
    base=${INPUT_AITER_BASE:-}
    head=${INPUT_AITER_HEAD:-HEAD}
    if [ -z "$base" ]; then say "impact needs aiter-base (the pull request's base SHA)"; exit 2; fi
    args+=(--aiter-base "$base" --aiter-head "$head")
    for r in ${INPUT_ATOM_REFS:-}; do args+=(--atom "$r"); done
    for m in ${INPUT_MODELS:-}; do args+=(--model "$m"); done
fi
args+=(--atom-repo "$atom_repo" --aiter-repo "$aiter_repo")

sarif="$out/$mode.sarif"
text="$out/$mode.txt"
say "${tool[*]} $mode ${args[*]}"
set +e
"${tool[@]}" "$mode" "${args[@]}" --format sarif -o "$sarif"
code=$?
set -e
if [ "$code" -ne 0 ] && [ "$code" -ne 4 ]; then
    say "pipeline $mode failed (exit $code): no verdict"
    exit "$code"
fi
# The text report for the summary: the same answer, from the warm cache.
set +e
"${tool[@]}" "$mode" "${args[@]}" --format text -o "$text"
set -e

breaks=false
[ "$code" -eq 4 ] && breaks=true
if [ -n "${GITHUB_OUTPUT:-}" ]; then
    {
        echo "mode=$mode"
        echo "sarif=$sarif"
        echo "report=$text"
        echo "breaks=$breaks"
        echo "exit-code=$code"
    } >>"$GITHUB_OUTPUT"
fi
if [ -n "${GITHUB_STEP_SUMMARY:-}" ]; then
    {
        if [ "$mode" = check ]; then
            echo "### ATOM × aiter check"
        else
            echo "### aiter change impact on ATOM"
        fi
        echo
        if [ "$breaks" = true ]; then
            echo "**Breaks**: $(tail -n 1 "$text")"
        else
            echo "No break: $(tail -n 1 "$text")"
        fi
        echo
        echo '```text'
        head -c 60000 "$text"  # (the summary has a size limit; the SARIF has everything)
        echo
        echo '```'
    } >>"$GITHUB_STEP_SUMMARY"
fi
say "verdict: $([ "$breaks" = true ] && echo breaks || echo 'no break') (exit $code); SARIF: $sarif"
