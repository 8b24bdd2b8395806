"""What the README says matches what the CLI prints (issue 30's wording drift)."""

from __future__ import annotations

import ast
import re
import typing
from pathlib import Path

import pipeline.gitw  # noqa: F401  (GitPython runs `git version` on import: at collection, not in a test)

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_the_readme_names_the_patch_statuses_as_the_cli_prints_them() -> None:
    from pipeline.patchq.apply import Status

    said = re.search(r"`pipeline patch check` says per patch (.*?); `pipeline patch apply`", README, re.S)
    assert said is not None
    assert set(re.findall(r"`([a-z-]+)`", said.group(1))) == set(typing.get_args(Status))


def test_the_readmes_check_line_has_the_reports_shape() -> None:
    """`path:line:col: severity: [kind]`, as compat.report writes each finding."""
    lines = [line.strip() for line in README.splitlines() if "error: [positional-shift]" in line]
    assert lines and all(re.match(r"\S+\.py:\d+:\d+: error: \[", line) for line in lines)


def test_no_message_is_ended_twice() -> None:
    """`f"...: {e.message}. ..."` prints `attempts)..` when the message already ends a sentence."""
    twice = []
    for path in sorted((ROOT / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.JoinedStr):
                continue
            for value, after in zip(node.values, node.values[1:], strict=False):
                if (
                    isinstance(value, ast.FormattedValue)
                    and isinstance(value.value, ast.Attribute)
                    and value.value.attr == "message"
                    and isinstance(after, ast.Constant)
                    and str(after.value).startswith(".")
                ):
                    twice.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert twice == []
