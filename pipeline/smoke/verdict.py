"""The smoke verdict: what ran, against which image and recipe, and what it measured.

Written atomically as ``verdict.json`` in the run directory (with ``summary.md``
and ``junit.xml`` beside it); the tag stage reads it with `load_verdict` and
tags only an image whose verdict passed *and* whose ID/digest match.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError
from pipeline.fsutil import read_text

VERDICT_SCHEMA = "atom-image-pipeline/smoke-verdict/v1"
VERDICT_FILE = "verdict.json"
SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"

Status = Literal["passed", "failed", "no-hardware", "error"]
CheckStatus = Literal["passed", "failed", "skipped", "error"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="allow")


class CheckResult(_Model):
    name: str
    passed: bool
    status: CheckStatus = "failed"
    figures: dict[str, Any] = {}
    limits: dict[str, Any] = {}
    message: str = ""
    seconds: float = 0.0
    evidence: str = ""  # log tail / traceback / tool output tail (secrets redacted)

    @classmethod
    def ok(cls, name: str, message: str, **kw: Any) -> CheckResult:
        return cls(name=name, passed=True, status="passed", message=message, **kw)

    @classmethod
    def fail(cls, name: str, message: str, **kw: Any) -> CheckResult:
        return cls(name=name, passed=False, status="failed", message=message, **kw)

    @classmethod
    def skipped(cls, name: str, message: str) -> CheckResult:
        return cls(name=name, passed=False, status="skipped", message=message)


class ImageRef(_Model):
    ref: str
    id: str = ""
    digest: str = ""  # sha256:... of a RepoDigest, "" for a never-pushed local image


class RecipeRef(_Model):
    name: str
    path: str
    sha256: str


class Verdict(_Model):
    schema_: Literal["atom-image-pipeline/smoke-verdict/v1"] = Field(
        default="atom-image-pipeline/smoke-verdict/v1", alias="schema"
    )
    status: Status
    passed: bool
    reason: str
    image: ImageRef
    recipe: RecipeRef
    lock_sha256: str = ""
    inputs_digest: str = ""
    model: str = ""
    checks: list[CheckResult] = []
    started: str
    finished: str
    tool_version: str
    engine: str = ""
    options: dict[str, Any] = {}
    timings: dict[str, float] = {}
    hardware: dict[str, Any] = {}

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.model_dump(by_alias=True, mode="json")
        return data

    @property
    def failed_check(self) -> CheckResult | None:
        for c in self.checks:
            if c.status in ("failed", "error"):
                return c
        return None


def load_verdict(path: Path) -> Verdict:
    """Read a `verdict.json` (or the run directory holding one)."""
    p = Path(path)
    if p.is_dir():
        p = p / VERDICT_FILE
    text = read_text(
        p, what="smoke verdict", error=ConfigError, hint="Run `pipeline smoke` for this image first."
    )
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"smoke verdict {p} is not valid JSON: {e}.") from None
    if not isinstance(data, dict) or data.get("schema") != VERDICT_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise ConfigError(f"{p} is not a smoke verdict (schema {got!r}, expected {VERDICT_SCHEMA!r}).")
    try:
        verdict = Verdict.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise ConfigError(f"smoke verdict {p} is invalid: {problems}.") from None
    if verdict.passed != (verdict.status == "passed"):
        raise ConfigError(
            f"smoke verdict {p} is inconsistent: status {verdict.status!r} but passed={verdict.passed}."
        )
    return verdict
