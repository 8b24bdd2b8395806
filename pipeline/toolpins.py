"""Versions of the tools the image bakes in and the smoke stage drives, pinned in one place.

The image (render), the smoke stage's setup step and the docker tier's real-tool tests all read
these, so the lm_eval that parses GSM8K in CI is the one that runs on the GPU host.
"""

from __future__ import annotations

# lm-eval 0.4.x: its core and the `api` extra need no torch; `local-chat-completions` talks to
# the OpenAI-compatible server the recipe starts.
LM_EVAL_VERSION = "0.4.13"
LM_EVAL_REQUIREMENT = f"lm-eval[api]=={LM_EVAL_VERSION}"
