"""The docker tier's test server image: the local base image, the real lm_eval, tests/servers.

- ``lm-eval[api]`` at the version the pipeline pins (pipeline/toolpins.py), installed from the
  wheelhouse `scripts/setup.sh wheelhouse` downloads from PyPI, the one the pipeline's images
  install from (containers cannot reach PyPI): the real ``lm_eval`` CLI, no torch;
- a local GSM8K-format task over generated documents (tests/servers/gsm8k_local.py) at
  ``LM_EVAL_TASKS``, which the test recipe passes as ``--include_path``;
- the OpenAI-compatible test server and the benchmark stand-in at ``/opt/smoke``.
"""

from __future__ import annotations

import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from pipeline.toolpins import LM_EVAL_REQUIREMENT, LM_EVAL_VERSION

SERVERS = Path(__file__).resolve().parent
LM_EVAL_TASKS = "/opt/smoke/lm_eval_tasks"


def lm_eval_wheels() -> Path:
    """The wheelhouse for the test base image's python; a clear failure when it is incomplete."""
    from tests.fixtures.build_repos import test_wheelhouse

    path = test_wheelhouse()
    if not (path / ".complete").is_file() or not any(path.glob(f"lm_eval-{LM_EVAL_VERSION}-*.whl")):
        raise FileNotFoundError(
            f"{path} holds no complete wheelhouse with {LM_EVAL_REQUIREMENT}: run `make setup` "
            "(scripts/setup.sh wheelhouse downloads it from PyPI)."
        )
    return path


def write_context(ctx: Path, base_image: str) -> Path:
    """Write the build context (Dockerfile, wheels, servers) into `ctx`."""
    wheels = lm_eval_wheels()
    pip = sorted(wheels.glob("pip-*.whl"))
    if not pip:
        raise FileNotFoundError(f"{wheels} has no pip wheel: run `make setup` again.")
    shutil.copytree(wheels, ctx / "wheels", ignore=shutil.ignore_patterns(".complete"))
    for f in SERVERS.glob("*.py"):
        shutil.copy(f, ctx / f.name)
    (ctx / "Dockerfile").write_text(
        f"FROM {base_image}\n"
        "COPY wheels /tmp/wheels\n"
        # pip runs from its own wheel: the minimal base image has python3 but no pip
        f"RUN python3 /tmp/wheels/{pip[-1].name}/pip install --no-index --find-links /tmp/wheels "
        f"--break-system-packages --root-user-action=ignore --no-cache-dir -q '{LM_EVAL_REQUIREMENT}' "
        "&& rm -rf /tmp/wheels\n"
        "COPY *.py /opt/smoke/\n"
        f"RUN python3 /opt/smoke/gsm8k_local.py {LM_EVAL_TASKS}\n"
    )
    return ctx


def build_smoke_image(engine: Any, base_image: str, ctx: Path, *, tag: str, labels: Mapping[str, str]) -> str:
    write_context(ctx, base_image)
    engine.build(ctx, tag=tag, labels=dict(labels))
    return tag
