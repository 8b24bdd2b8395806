"""The message catalogue: no two sentences run together (issue 15 §3).

"(gave up after 4 attempts) Check the URL", "does not exist Check that the path": a message and
its hint, or a message and the sentence an f-string glues after it, must be separated as
sentences are. `PipelineError.__str__` ends the message before the hint; every f-string that
puts a sentence after an interpolated message goes through `errors.sentence`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from pipeline.errors import InfraError, SourceError, sentence

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"
UNITS = ("KiB", "MiB", "GiB")  # " 12 MiB" is not a new sentence
# a sentence that begins mid-literal after a word with no full stop: "... exist Check that ..."
GLUED = re.compile(
    r"[a-z0-9)\]`'\"] (Check|Run|Pass|Use|Add|Give|Set|Remove|Fix|Try|Start|Install|Rebuild|Stop|"
    r"Wait|Point|Build|Render|Pin|Then|Continuing|Nothing|Delete|Create|Restore|Make|The|It)\b"
)


def _sources() -> list[tuple[Path, ast.AST]]:
    return [(p, ast.parse(p.read_text(encoding="utf-8"))) for p in sorted(PIPELINE.rglob("*.py"))]


def _is_sentence_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sentence"


def _where(path: Path, node: ast.AST, text: str) -> str:
    return f"{path.relative_to(PIPELINE.parent)}:{getattr(node, 'lineno', 0)}: {text}"


def test_no_fstring_glues_a_sentence_onto_an_interpolated_value_without_ending_it() -> None:
    glued = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if not isinstance(node, ast.JoinedStr):
                continue
            for value, after in zip(node.values, node.values[1:], strict=False):
                if not (isinstance(value, ast.FormattedValue) and isinstance(after, ast.Constant)):
                    continue
                text = str(after.value)
                starts = re.match(r" [A-Z][a-z]", text) and not text[1:].startswith(UNITS)
                if starts and not _is_sentence_call(value.value):
                    glued.append(_where(path, node, f"{{{ast.unparse(value.value)}}}{text[:25]}"))
    assert glued == []


def test_no_literal_runs_two_sentences_together() -> None:
    glued = []
    for path, tree in _sources():
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                for m in GLUED.finditer(node.value):
                    glued.append(_where(path, node, node.value[max(0, m.start() - 30) : m.end()]))
    assert glued == []


@pytest.mark.parametrize(
    ("message", "shown"),
    [
        ("the repository path /x does not exist", "the repository path /x does not exist. Check the path."),
        (
            "git fetch failed (gave up after 4 attempts)",
            "git fetch failed (gave up after 4 attempts). Check the path.",
        ),
        ("already a sentence.", "already a sentence. Check the path."),
        ("a list follows:", "a list follows: Check the path."),
    ],
)
def test_a_message_is_ended_before_its_hint(message: str, shown: str) -> None:
    assert str(SourceError(message, hint="Check the path.")) == shown


def test_a_report_under_the_message_puts_the_hint_on_its_own_line() -> None:
    err = InfraError(
        "not compatible: 2 breaking call(s)\nINCOMPATIBLE: 0 unparseable file(s)", hint="Add a patch."
    )
    assert str(err).splitlines()[-2:] == ["INCOMPATIBLE: 0 unparseable file(s)", "Add a patch."]


def test_sentence() -> None:
    assert [sentence(t) for t in ("a", "a.", "a!  ", "(b)", "")] == ["a.", "a.", "a!", "(b).", ""]
