"""The check's result: findings, counts, and text / JSON / SARIF 2.1.0 renderings."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the counts and renderings need no git (a stage's figure, rebuild's summary)
    from pipeline.gitw import CommitInfo

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"


def sarif_rule(rule_id: str, name: str, text: str, help_uri: str, tags: list[str]) -> dict[str, Any]:
    """A SARIF rule as code scanning shows it: an error by default, of high precision."""
    return {
        "id": rule_id,
        "name": name,
        "shortDescription": {"text": text},
        "fullDescription": {"text": text},
        "defaultConfiguration": {"level": "error"},
        "helpUri": help_uri,
        "properties": {"tags": tags, "precision": "high"},
    }


def sarif_location(uri: str, line: int, col: int | None = None) -> dict[str, Any]:
    """A result's location: a path relative to the checked-out repository (%SRCROOT%)."""
    region = {"startLine": max(line, 1), **({"startColumn": max(col, 1)} if col is not None else {})}
    return {
        "physicalLocation": {"artifactLocation": {"uri": uri, "uriBaseId": "%SRCROOT%"}, "region": region}
    }


def sarif_log(
    *,
    tool: str,
    info_uri: str,
    rules: list[dict[str, Any]],
    repository: str,
    revision: str,
    properties: dict[str, Any],
    results: list[dict[str, Any]],
) -> dict[str, Any]:
    """A SARIF 2.1.0 log of one run of `tool` over `revision` of `repository`."""
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {"driver": {"name": tool, "informationUri": info_uri, "rules": rules}},
                "versionControlProvenance": [{"repositoryUri": repository, "revisionId": revision}],
                "properties": properties,
                "results": results,
            }
        ],
    }


TOOL_NAME = "atom-image-pipeline compat"

KINDS: dict[str, str] = {
    "positional-shift": "An argument passed positionally now lands on a different aiter parameter.",
    "too-many-positional": "More positional arguments than the aiter function accepts.",
    "missing-argument": "A required parameter of the aiter function is not given.",
    "unexpected-keyword": "A keyword argument the aiter function does not have.",
    "duplicate-argument": "A parameter given both positionally and by keyword.",
    "positional-only-as-keyword": "A positional-only parameter passed by keyword.",
    "type-mismatch": "An argument whose evident type does not fit the parameter's annotation.",
    "missing-function": "The aiter function does not exist at the pinned commit.",
    "missing-module": "The aiter module does not exist at the pinned commit.",
    "unparseable-file": "A source file that does not parse.",
    "unreachable-at-pin": "A call under an inspect.signature guard that cannot hold at the pinned aiter.",
}


@dataclass(frozen=True)
class CauseInfo:
    commit: CommitInfo
    last_good: str | None
    change: str
    effect: str

    def to_json(self) -> dict[str, Any]:
        return {
            "commit": self.commit.sha,
            "short": self.commit.short,
            "date": self.commit.iso_date,
            "subject": self.commit.subject,
            "author": self.commit.author,
            "last_good": self.last_good,
            "change": self.change,
            "effect": self.effect,
        }


@dataclass(frozen=True)
class Finding:
    path: str
    line: int
    col: int
    function: str  # aiter qualified name as called, e.g. aiter.fused_qknorm_idxrqknorm
    severity: str  # error / warning / note (a call its own signature guard keeps from running at the pin)
    kind: str
    message: str
    details: tuple[str, ...] = ()
    cause: CauseInfo | None = None
    defined_at: str | None = None  # aiter path:line of the signature checked against
    # Broken already with the aiter the call was written against: an ATOM bug no aiter pin fixes.
    preexisting: bool = False
    written_against: str | None = None  # aiter SHA the call was written against (its baseline)
    callee: str | None = None  # "op" (compiled/registered: annotations enforced) or "python"
    # For one model (pipeline/compat/reach.py): "on-path" / "off-path", and why; None: not computed.
    reach: str | None = None
    reach_evidence: str = ""
    # On the path only under conditional blocks: per way in, its conditions ("if self.use_triton",).
    reach_conditions: tuple[tuple[str, ...], ...] = ()

    def to_json(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "path": self.path,
            "line": self.line,
            "column": self.col,
            "function": self.function,
            "severity": self.severity,
            "kind": self.kind,
            "message": self.message,
            "details": list(self.details),
            "defined_at": self.defined_at,
            "preexisting": self.preexisting,
            "written_against": self.written_against,
            "callee": self.callee,
        }
        if self.reach is not None:
            d["reach"] = self.reach
            d["reach_evidence"] = self.reach_evidence
            if self.reach_conditions:
                d["reach_conditions"] = [list(c) for c in self.reach_conditions]
        d["cause"] = self.cause.to_json() if self.cause else None
        return d


@dataclass(frozen=True)
class Unparseable:
    repo: str  # "atom" / "aiter"
    path: str
    error: str

    def to_json(self) -> dict[str, str]:
        return {"repo": self.repo, "path": self.path, "error": self.error}


@dataclass(frozen=True)
class UncheckedCall:
    path: str
    line: int
    function: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "line": self.line, "function": self.function, "reason": self.reason}


@dataclass(frozen=True)
class Counts:
    """What counts as an error, a warning and a waived finding: the one definition that the text
    and JSON reports, the stage line and the run's records all print.

    An *error* is an error-severity finding after the model's gate (these stop a build); a
    *warning* is every other finding, off-path and waived ones included, but notes (calls their own
    `inspect.signature` guard keeps from running at the pin), which are counted apart; *off path* and *waived*
    say how many of the check's errors the gate turned into warnings (each finding once: one
    waiver that matches two call sites waives two).
    """

    errors: int
    warnings: int
    off_path: int = 0
    waived: int = 0
    unparseable: int = 0
    notes: int = 0  # calls their own `inspect.signature` guard keeps from running at this pin

    @classmethod
    def of(cls, report: CheckReport, raw: CheckReport | None = None) -> Counts:
        """The counts of `report`; `raw` is the same check before the gate (reach, then waivers)."""
        off_path = waived = 0
        if raw is not None:
            if len(raw.findings) != len(report.findings):  # the gate re-labels findings, one for one
                raise ValueError("the gated report does not have the check's findings")
            for before, after in zip(raw.findings, report.findings, strict=True):
                if before.severity == "error" and after.severity != "error":
                    if after.reach == "off-path":
                        off_path += 1
                    else:  # reach leaves an on-path error an error: only a waiver turned it
                        waived += 1
        notes = sum(1 for f in report.findings if f.severity == "note")
        return cls(
            errors=len(report.errors),
            warnings=len(report.findings) - len(report.errors) - notes,
            off_path=off_path,
            waived=waived,
            unparseable=len(report.unparseable),
            notes=notes,
        )

    def summary(self) -> str:
        """`2 error(s), 9 warning(s) (1 off the model's path, 2 waived by the recipe)`."""
        turned = [
            f"{n} {why}"
            for n, why in ((self.off_path, "off the model's path"), (self.waived, "waived by the recipe"))
            if n
        ]
        return (
            f"{self.errors} error(s), {self.warnings} warning(s)"
            + (f" ({', '.join(turned)})" if turned else "")
            + (f", {self.notes} note(s) (not reached at this pin)" if self.notes else "")
        )

    def to_json(self) -> dict[str, int]:
        return {
            "errors": self.errors,
            "warnings": self.warnings,
            "off_path": self.off_path,
            "waived": self.waived,
            "unparseable_files": self.unparseable,
            "notes": self.notes,
        }


@dataclass(frozen=True)
class CheckReport:
    findings: list[Finding]
    calls_checked: int
    calls_unchecked: int
    unparseable: list[Unparseable]
    atom_sha: str
    aiter_sha: str
    baseline_aiter_sha: str | None = None
    unchecked: list[UncheckedCall] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not any(f.severity == "error" for f in self.findings)

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "warning"]

    # -- renderings -------------------------------------------------------
    def to_json(self, counts: Counts | None = None) -> dict[str, Any]:
        """`counts`: this report's, as its gate made them (`Counts.of(report, raw)`)."""
        counts = counts or Counts.of(self)
        return {
            "tool": TOOL_NAME,
            "atom": self.atom_sha,
            "aiter": self.aiter_sha,
            "baseline_aiter": self.baseline_aiter_sha,
            "compatible": self.ok,
            "counts": {
                "calls_checked": self.calls_checked,
                "calls_unchecked": self.calls_unchecked,
                **counts.to_json(),
            },
            "calls_checked": self.calls_checked,
            "calls_unchecked": self.calls_unchecked,
            "findings": [f.to_json() for f in self.findings],
            "unchecked": [u.to_json() for u in self.unchecked],
            "unparseable": [u.to_json() for u in self.unparseable],
        }

    def to_text(self, counts: Counts | None = None) -> str:
        counts = counts or Counts.of(self)
        lines = [
            f"ATOM {self.atom_sha[:10]} × aiter {self.aiter_sha[:10]}"
            + (f" (written against aiter {self.baseline_aiter_sha[:10]})" if self.baseline_aiter_sha else ""),
        ]
        for f in self.findings:
            lines.append(f"{f.path}:{f.line}:{f.col}: {f.severity}: [{f.kind}] {f.message}")
            for d in f.details:
                if d not in f.message:
                    lines.append(f"    {d}")
            if f.cause is not None:
                lines.append(f"    cause: aiter {f.cause.commit.sha} (last good {f.cause.last_good or '?'})")
            if f.reach is not None:
                lines.append(
                    f"    reach: {f.reach}"
                    + ("" if f.reach_evidence in f.message else f": {f.reach_evidence}")
                )
        for u in self.unparseable:
            lines.append(f"{u.repo}:{u.path}: warning: [unparseable-file] {u.error}")
        verdict = "compatible" if self.ok else "INCOMPATIBLE"
        lines.append(
            f"{verdict}: {counts.summary()}; "
            f"{self.calls_checked} call(s) checked, {self.calls_unchecked} unchecked "
            f"(*args/**kwargs, dynamic getattr, callables without a Python signature), "
            f"{len(self.unparseable)} unparseable file(s)"
        )
        return "\n".join(lines)

    def to_sarif(self) -> dict[str, Any]:
        """SARIF 2.1.0, as GitHub code scanning accepts it (relative URIs, rules, levels)."""
        rules = [
            sarif_rule(
                kind,
                "".join(w.capitalize() for w in kind.split("-")),
                desc,
                "https://github.com/ROCm/aiter",
                ["compatibility", "aiter"],
            )
            for kind, desc in KINDS.items()
        ]
        rule_index = {r["id"]: i for i, r in enumerate(rules)}
        results: list[dict[str, Any]] = []
        for f in self.findings:
            text = f.message
            if f.details:
                text += "\n" + "\n".join(f.details)
            res: dict[str, Any] = {
                "ruleId": f.kind,
                "ruleIndex": rule_index.get(f.kind, 0),
                "level": f.severity if f.severity in ("error", "note") else "warning",
                "message": {"text": text},
                "locations": [sarif_location(f.path, f.line, f.col)],
                "partialFingerprints": {"primaryLocationLineHash": f"{f.function}:{f.kind}:{f.path}"},
                "properties": {"function": f.function, **({"reach": f.reach} if f.reach else {})},
            }
            if f.cause is not None:
                res["properties"]["cause"] = f.cause.to_json()
            results.append(res)
        for u in self.unparseable:
            if u.repo != "atom":
                continue
            results.append(
                {
                    "ruleId": "unparseable-file",
                    "ruleIndex": rule_index["unparseable-file"],
                    "level": "warning",
                    "message": {"text": f"Not parseable: {u.error}"},
                    "locations": [sarif_location(u.path, 1)],
                }
            )
        return sarif_log(
            tool=TOOL_NAME,
            info_uri="https://github.com/ROCm/ATOM",
            rules=rules,
            repository="https://github.com/ROCm/ATOM",
            revision=self.atom_sha,
            properties={
                "aiter": self.aiter_sha,
                "callsChecked": self.calls_checked,
                "callsUnchecked": self.calls_unchecked,
            },
            results=results,
        )
