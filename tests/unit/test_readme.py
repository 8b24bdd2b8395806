"""The README's promises that code can check."""

import re
from pathlib import Path

from pipeline.errors import EXIT_CODES

README = Path(__file__).resolve().parents[2] / "README.md"


def test_exit_code_table_matches_errors_module() -> None:
    text = README.read_text()
    block = text.split("<!-- exit-codes:start", 1)[1].split("<!-- exit-codes:end -->", 1)[0]
    rows = dict(re.findall(r"^\| (\d+) \| (.+?) \|$", block, re.M))
    assert {int(k): v for k, v in rows.items()} == {int(k): v for k, v in EXIT_CODES.items()}


def test_readme_opens_with_the_two_commands() -> None:
    head = README.read_text().split("```sh", 1)[1].split("```", 1)[0]
    assert "make run" in head and "make test" in head
