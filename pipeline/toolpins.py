"""Versions of the tools the image bakes in and the smoke stage drives, pinned in one place.

The image (render), the smoke stage's setup step and the docker tier's real-tool tests all read
these, so the lm_eval that parses GSM8K in CI is the one that runs on the GPU host.
"""

from __future__ import annotations

# lm-eval 0.4.x: its core and the `api` extra need no torch; `local-chat-completions` talks to
# the OpenAI-compatible server the recipe starts.
LM_EVAL_VERSION = "0.4.13"
LM_EVAL_REQUIREMENT = f"lm-eval[api]=={LM_EVAL_VERSION}"

# aiter's build needs setuptools_scm >= 9 (upstream ATOM fced8bf34: "vcs_versioning 1.1.1 requires
# setuptools_scm>=9"); pinned so the image is reproducible, installed from the context's wheelhouse.
SETUPTOOLS_SCM_VERSION = "10.3.4"
SETUPTOOLS_SCM_REQUIREMENT = f"setuptools_scm=={SETUPTOOLS_SCM_VERSION}"

# What `scripts/setup.sh wheelhouse` downloads into the wheelhouse (with their dependencies): the image
# installs these with --no-index; pip is there for bases that lack it.
WHEELHOUSE_REQUIREMENTS = (LM_EVAL_REQUIREMENT, SETUPTOOLS_SCM_REQUIREMENT, "pip")
