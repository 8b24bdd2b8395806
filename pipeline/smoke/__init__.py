"""`pipeline smoke`: run a model recipe against an image on (MI355) GPUs and write a verdict.

Public API:
    run_smoke(engine, *, image, recipe, recipe_path, settings, env, run_dir, log, run_all=False,
              sysfs_root=None, options=None) -> Verdict
    load_verdict(path) -> Verdict          # for the tag stage
    Verdict, CheckResult, SmokeOptions, VERDICT_SCHEMA
"""

from pipeline.smoke.runner import SMOKE_LABEL, SmokeOptions, run_smoke
from pipeline.smoke.verdict import (
    JUNIT_FILE,
    SUMMARY_FILE,
    VERDICT_FILE,
    VERDICT_SCHEMA,
    CheckResult,
    Verdict,
    load_verdict,
)

__all__ = [
    "JUNIT_FILE",
    "SMOKE_LABEL",
    "SUMMARY_FILE",
    "VERDICT_FILE",
    "VERDICT_SCHEMA",
    "CheckResult",
    "SmokeOptions",
    "Verdict",
    "load_verdict",
    "run_smoke",
]
