"""The smoke verdict: what ran, against which image and recipe, whom it talked to, what it measured.

Written atomically as ``verdict.json`` in the run directory (``summary.md`` and
``junit.xml`` are made from it, after it). This is the one model of the document:
the tag stage reads it with `read_verdict` and tags only an image whose verdict
passed, whose ID/digest match, and whose `server` evidence proves the answers came
from a container of that very image.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError, PipelineError
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


class TestedImage(_Model):
    """The image the smoke test ran (not an image reference grammar: see `pipeline.oci.registry`)."""

    __test__ = False  # not a pytest class, despite the name

    ref: str
    id: str = ""
    digest: str = ""  # sha256:... of a RepoDigest, "" for a never-pushed local image


class ServerEvidence(_Model):
    """Who answered the probes: proven, not assumed (see `pipeline.smoke.identity`)."""

    container_id: str
    container_name: str
    image_id: str  # the image the answering container runs, from the engine
    port: int
    network_mode: str = ""
    listeners: list[str] = []  # "address:port inode N", every socket listening on the port
    pids: list[int] = []  # the container's processes holding them (its own PID namespace)
    proven_by: str = ""
    checked: list[str] = []  # when it was proven: after readiness, after the last gate


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
    image: TestedImage
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
    server: ServerEvidence | None = None  # None: no server answered (or it was never proven ours)
    leftovers: list[dict[str, Any]] = []  # containers of earlier runs found at the start

    model_config = ConfigDict(extra="allow", populate_by_name=True)

    def to_json(self) -> dict[str, Any]:
        data: dict[str, Any] = self.model_dump(by_alias=True, mode="json")
        return data


@dataclass(frozen=True)
class VerdictFile:
    """A verdict as read from disk: where, its exact bytes' sha256, the model."""

    path: Path
    sha256: str
    verdict: Verdict


def read_verdict(path: Path, *, error: type[PipelineError] = ConfigError, hint: str = "") -> VerdictFile:
    """Read a `verdict.json` (or the run directory holding one); `error` for every refusal."""
    p = Path(path)
    if p.is_dir():
        p = p / VERDICT_FILE
    if not p.exists():
        raise error(
            f"there is no smoke verdict at {p} (missing verdict).",
            hint=hint or "Run `pipeline smoke` for this image first.",
        )
    text = read_text(p, what="smoke verdict", error=error, hint=hint or None)
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise error(f"smoke verdict {p} is not valid JSON: {e}.", hint=hint or None) from None
    if not isinstance(data, dict) or data.get("schema") != VERDICT_SCHEMA:
        got = data.get("schema") if isinstance(data, dict) else type(data).__name__
        raise error(
            f"{p} is not a smoke verdict (schema {got!r}, expected {VERDICT_SCHEMA!r}).", hint=hint or None
        )
    try:
        verdict = Verdict.model_validate(data)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(str(x) for x in err['loc'])}: {err['msg']}" for err in e.errors())
        raise error(f"smoke verdict {p} is invalid: {problems}.", hint=hint or None) from None
    if verdict.passed != (verdict.status == "passed"):
        raise error(
            f"smoke verdict {p} is inconsistent: status {verdict.status!r} but passed={verdict.passed}.",
            hint=hint or None,
        )
    return VerdictFile(p, hashlib.sha256(text.encode("utf-8")).hexdigest(), verdict)


def load_verdict(path: Path) -> Verdict:
    """Read a `verdict.json` (or the run directory holding one); ConfigError when it is not one."""
    return read_verdict(path).verdict
