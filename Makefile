# atom-image-pipeline: `make test` sets up this machine (Debian bookworm, root) and runs everything.
#
#   make setup   apt packages if missing, pip install -e '.[test]', start dockerd if needed,
#                build the local test base image if absent           (scripts/setup.sh)
#   make test    setup, then ruff + mypy and the unit, git and docker tiers (scripts/test.sh)
#   make lint    ruff + mypy only
#   make unit | make git | make docker   one tier (no setup, no lint)
#   make run     setup (dependencies only), then `python -m pipeline build --model MiniMax-M3-MXFP4 --auto`
#
# Variables: PYTHON (python), PIP_INSTALL=0 skips the editable install (a shared machine with
# several worktrees), TIERS ("unit git docker"), PYTEST_ARGS, MODEL.

PYTHON ?= python
MODEL ?= MiniMax-M3-MXFP4
ATOM_PIPELINE_TEST_BASE_IMAGE ?= atom-pipeline-test/bookworm-python3:1
export PYTHON ATOM_PIPELINE_TEST_BASE_IMAGE

.PHONY: setup test lint unit git docker run

setup:
	scripts/setup.sh

test: setup
	scripts/test.sh

lint:
	scripts/test.sh lint

unit git docker:
	scripts/test.sh $@

# run: the dependencies only (no editable install that would repoint another checkout's
# `pipeline`); `python -m pipeline` from here runs this checkout. --auto pins the newest aiter
# this ATOM is compatible with, so the build is not stopped at check by aiter's head.
run:
	PIP_INSTALL=$${PIP_INSTALL:-deps} scripts/setup.sh
	$(PYTHON) -m pipeline build --model $(MODEL) --auto
