"""Reports of a verdict: `verdict.json`, `summary.md` and `junit.xml`, written atomically.

Every text goes through the logger's `redact` first, so a secret that slipped
into a tool's output never reaches a report.
"""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipeline.errors import DiskError, disk_error
from pipeline.fsutil import atomic_write_text
from pipeline.smoke.plot import PLOT_FILE
from pipeline.smoke.verdict import JUNIT_FILE, SUMMARY_FILE, VERDICT_FILE, Verdict

_MARK = {"passed": "✓ passed", "failed": "✕ failed", "skipped": "↷ skipped", "error": "✕ error"}


def _fmt(values: dict[str, Any]) -> str:
    parts = []
    for k, v in values.items():
        if v is None or k == "answer" or isinstance(v, dict | list):
            continue
        parts.append(f"{k}={v}")
    return ", ".join(parts).replace("|", "\\|")


def summary_markdown(v: Verdict) -> str:
    head = {
        "passed": "✓ PASSED",
        "failed": "✕ FAILED",
        "no-hardware": "✕ NOT RUN (no hardware)",
        "error": "✕ ERROR",
    }[v.status]
    lines = [
        f"## Smoke test {head}: {v.recipe.name}",
        "",
        f"- **Reason:** `{v.reason}`" if "`" not in v.reason else f"- **Reason:** {v.reason}",
        f"- **Image:** `{v.image.ref}` id `{v.image.id}` digest `{v.image.digest or '-'}`",
        f"- **Recipe:** `{v.recipe.path}` sha256 `{v.recipe.sha256}`",
        f"- **Lock sha256:** `{v.lock_sha256 or '-'}` · **inputs digest:** `{v.inputs_digest or '-'}`",
        f"- **Started / finished:** {v.started} / {v.finished} · tool {v.tool_version}",
        "",
    ]
    if v.checks:
        lines += ["| check | result | figures | limits | message |", "|---|---|---|---|---|"]
        for c in v.checks:
            msg = c.message.replace("|", "\\|").replace("\n", " ")
            lines.append(f"| {c.name} | {_MARK[c.status]} | {_fmt(c.figures)} | {_fmt(c.limits)} | {msg} |")
        lines.append("")
    if v.timings:
        lines.append("Timings: " + ", ".join(f"{k} {val:.2f} s" for k, val in v.timings.items()))
        lines.append("")
    return "\n".join(lines)


def junit_xml(v: Verdict) -> str:
    failures = sum(1 for c in v.checks if c.status == "failed")
    errors = sum(1 for c in v.checks if c.status == "error")
    skipped = sum(1 for c in v.checks if c.status == "skipped")
    suite = ET.Element(
        "testsuite",
        name=f"smoke.{v.recipe.name}",
        tests=str(max(len(v.checks), 1)),
        failures=str(failures),
        errors=str(errors + (1 if not v.checks and not v.passed else 0)),
        skipped=str(skipped),
        time=f"{sum(c.seconds for c in v.checks):.3f}",
        timestamp=v.started,
    )
    props = ET.SubElement(suite, "properties")
    for key, value in (
        ("image", v.image.ref),
        ("image.id", v.image.id),
        ("image.digest", v.image.digest),
        ("recipe.sha256", v.recipe.sha256),
        ("status", v.status),
    ):
        ET.SubElement(props, "property", name=key, value=value)
    if not v.checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"smoke.{v.recipe.name}", name="preflight", time="0"
        )
        ET.SubElement(case, "error", message=v.reason, type=v.status).text = v.reason
    for c in v.checks:
        case = ET.SubElement(
            suite, "testcase", classname=f"smoke.{v.recipe.name}", name=c.name, time=f"{c.seconds:.3f}"
        )
        if c.status == "failed":
            ET.SubElement(case, "failure", message=c.message, type="gate").text = c.evidence or c.message
        elif c.status == "error":
            ET.SubElement(case, "error", message=c.message, type="error").text = c.evidence or c.message
        elif c.status == "skipped":
            ET.SubElement(case, "skipped", message=c.message)
        ET.SubElement(case, "system-out").text = json.dumps(
            {"figures": c.figures, "limits": c.limits}, sort_keys=True, default=str
        )
    ET.indent(suite)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(suite, encoding="unicode") + "\n"


def write_reports(v: Verdict, run_dir: Path, redact: Callable[[str], str]) -> Path:
    """Write the verdict first, then the summaries made from it; returns the verdict path.

    A summary never exists without its verdict: an earlier summary is removed before the
    verdict is written, so a full disk leaves no "PASSED" beside a missing verdict.
    DiskError (exit 14) when a file cannot be written.
    """
    path = run_dir / VERDICT_FILE
    try:
        for name in (SUMMARY_FILE, JUNIT_FILE):
            (run_dir / name).unlink(missing_ok=True)
        atomic_write_text(path, redact(json.dumps(v.to_json(), indent=2, sort_keys=True)) + "\n")
        summary = summary_markdown(v)
        if (run_dir / PLOT_FILE).is_file():
            summary += f"Benchmark against the recipe: [{PLOT_FILE}]({PLOT_FILE}) (in the run directory)\n"
        atomic_write_text(run_dir / SUMMARY_FILE, redact(summary))
        atomic_write_text(run_dir / JUNIT_FILE, redact(junit_xml(v)))
    except OSError as e:
        raise (disk_error(e) or DiskError(f"cannot write the smoke reports in {run_dir}: {e}.")) from None
    return path
