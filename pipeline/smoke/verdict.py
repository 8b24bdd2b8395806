"""The smoke verdict: what ran, against which image and recipe, whom it talked to, what it measured.

Written atomically as ``verdict.json`` in the run directory (``summary.md`` and
``junit.xml`` are made from it, after it). This is the one model of the document:
the tag stage reads it with `read_verdict` and tags only an image whose verdict
passed, whose ID/digest match, and whose `server` evidence proves the answers came
from a container of that very image.

Whether a verdict passed is derived from its checks (`derive`), never read from its
top-level `passed`/`status`: every gate its recipe requires (`required_gates`) must be
there, once, and passed, each check's own `passed` and `status` must agree, and a
verdict whose top level says otherwise disagrees with itself.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from pipeline.errors import ConfigError, PipelineError
from pipeline.fsutil import read_text

if TYPE_CHECKING:
    from pipeline.recipes.recipe import Recipe

VERDICT_SCHEMA = "atom-image-pipeline/smoke-verdict/v1"
READY_CHECK = "server-ready"  # the first check of every run: the server became ready
VERDICT_FILE = "verdict.json"
SUMMARY_FILE = "summary.md"
JUNIT_FILE = "junit.xml"

Status = Literal["passed", "failed", "no-hardware", "error"]
CheckStatus = Literal["passed", "failed", "skipped", "error"]


Recheck = Callable[["CheckResult"], str]  # why a passed check's figures do not bear it out ("": they do)


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
    lock_sha256: str = ""  # Lock.digest() of the model's lock (it names the model), "" when none was given
    pair_digest: str = ""  # the image's pair label, which that lock's Lock.pair_digest() equals
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


# --------------------------------------------------------------------------- derived result


@dataclass(frozen=True)
class _PlanOptions:
    """The plan options a verdict records (`options`), as `pipeline.smoke.checks.plan` takes them."""

    quick: bool
    gsm8k_limit: int | None
    bench_concurrencies: tuple[int, ...] | None
    bench_tolerance: float | None


def _plan_options(options: Mapping[str, Any]) -> _PlanOptions:
    """ValueError when the recorded options are not what a smoke run writes."""
    quick = options.get("quick", False)
    limit = options.get("gsm8k_limit")
    rows = options.get("bench_concurrencies") or []
    tolerance = options.get("bench_tolerance")
    if not isinstance(quick, bool):
        raise ValueError(f"options.quick is {quick!r}, not true or false")
    if limit is not None and not (type(limit) is int and limit >= 1):
        raise ValueError(f"options.gsm8k_limit is {limit!r}, not a positive whole number")
    if not isinstance(rows, list) or not all(type(c) is int and c >= 1 for c in rows):
        raise ValueError(f"options.bench_concurrencies is {rows!r}, not a list of positive whole numbers")
    if tolerance is not None and (isinstance(tolerance, bool) or not isinstance(tolerance, int | float)):
        raise ValueError(f"options.bench_tolerance is {tolerance!r}, not a number")
    return _PlanOptions(quick, limit, tuple(rows) or None, None if tolerance is None else float(tolerance))


def required_gates(recipe: Recipe, options: Mapping[str, Any]) -> dict[str, Recheck]:
    """The checks a smoke run of `recipe` with these (recorded) options has, in order (readiness,
    then the plan), each with how its figures are read against the recipe (`SmokeCheck.recheck`).

    ValueError when the options are not what a smoke run records.
    """
    from pipeline.smoke.checks import plan  # it imports this module

    gates: dict[str, Recheck] = {READY_CHECK: _no_figures}
    gates.update((item.name, item.recheck) for item in plan(recipe, _plan_options(options)))
    return gates


def _no_figures(result: CheckResult) -> str:
    return ""


@dataclass(frozen=True)
class Derived:
    """A verdict's result as its checks and its recipe's gates make it."""

    passed: bool
    problems: list[str]  # why it did not pass, or how it contradicts itself: one clause each

    @property
    def status(self) -> Status:
        return "passed" if self.passed else "failed"


def derive(verdict: Verdict, required: Sequence[str] | Mapping[str, Recheck]) -> Derived:
    """Passed only when every required gate is there once and passed, its figures bearing out the
    pass (each gate's recheck, when `required` maps names to them), and nothing else is there."""
    recheck = required if isinstance(required, Mapping) else {}
    problems: list[str] = []
    seen: dict[str, int] = {}
    for check in verdict.checks:
        seen[check.name] = seen.get(check.name, 0) + 1
        if check.passed != (check.status == "passed"):
            problems.append(
                f"check '{check.name}' says passed={str(check.passed).lower()} but status '{check.status}'"
            )
        elif not check.passed:
            why = f": {check.message[:200]}" if check.message else ""
            problems.append(f"check '{check.name}' {check.status}{why}")
        elif check.name in recheck and (against := recheck[check.name](check)):
            problems.append(f"check '{check.name}' says passed but {against}")
    problems += [f"check '{name}' appears {n} times" for name, n in seen.items() if n > 1]
    missing = [name for name in required if name not in seen]
    if missing:
        problems.append(f"the recipe's gate(s) {', '.join(repr(m) for m in missing)} are missing")
    unknown = [name for name in seen if name not in required]
    if unknown:
        problems.append(f"check(s) {', '.join(repr(u) for u in unknown)} are not gates of its recipe")
    return Derived(not problems, problems)
