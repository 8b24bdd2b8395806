"""Whole-word search in source bytes (`pysource.says_word`): what `re`'s `\\bname\\b` finds, by plain
substring search (an op name is looked up in every changed aiter file, every night)."""

from __future__ import annotations

import re

import pytest

from pipeline.compat.pysource import says_word, words_at

TEXTS = [
    b"my_op(x)",
    b"torch.ops.aiter.my_op.default",
    b"my_op2(x); _my_op(y); my_opx",
    b"x = my_op",
    b"",
    b"my_op_and my_op",
    b"\xe9my_op\xe9",  # (non-ASCII bytes are not word bytes, as for a bytes pattern)
]


@pytest.mark.parametrize("text", TEXTS)
def test_a_whole_word_is_what_a_regex_word_match_is(text: bytes) -> None:
    pattern = re.compile(rb"\bmy_op\b")
    assert says_word(text, b"my_op") == bool(pattern.search(text))
    assert [m.span() for m in pattern.finditer(text)] == list(words_at(text, b"my_op"))
