"""A line-based reader of Python source: top-level statements, compound-statement blocks and
line numbers, found with string searches and regular expressions instead of `ast`.

The reach walk (pipeline.compat.reach) reads some 400 ATOM files per cold closure within 0.3 s:
blocks are found from the colons that end their headers and nested by indentation, on demand.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Iterable

_TOP_RE = re.compile(r"\n(?=[^ \t\n#)\]}])")  # a newline before a column-0 statement (literal-first)
_TOP_NAME_RE = re.compile(
    r"(?:(?:async[ \t]+)?def|class)[ \t]+(\w+)|(\w+)[ \t]*(?::[^=\n]*)?=(?!=)[ \t]*([\[{(\"'])?"
)


class Lines:
    """Top-level statements of one file (computed on first use): who owns an offset."""

    def __init__(self, text: str) -> None:
        self.text = text
        self._tops: list[int] | None = None

    @property
    def tops(self) -> list[int]:
        """Starts of the statements at column 0."""
        if self._tops is None:
            first = [0] if self.text[:1] and self.text[0] not in " \t\n#)]}" else []
            self._tops = first + [m.start() + 1 for m in _TOP_RE.finditer(self.text)]
        return self._tops

    def top_of(self, offset: int) -> int:
        return bisect.bisect_right(self.tops, offset) - 1

    def owner(self, offset: int) -> str:
        t = self.top_of(offset)
        return self.owner_name(t) if t >= 0 else ""

    def owner_name(self, t: int) -> str:
        """def/class name, `NAME` of `NAME = <literal>`, or "" (code that runs at import)."""
        m = _TOP_NAME_RE.match(self.text, self.tops[t])
        if m is None:
            return ""
        if m.group(1):
            return m.group(1)
        return m.group(2) if m.group(3) else ""


# Compound statements whose header ends a line with `:` (then a newline or a comment).
_BLOCK_WORDS = frozenset(
    {"if", "elif", "else", "def", "async", "class", "try", "except", "finally", "with", "for", "while"}
    | {"match", "case"}
)
CONDITIONAL_WORDS = frozenset({"if", "elif", "else", "except", "while", "case"})
_WORD_RE = re.compile(r"[ \t]*(\w+)")
_INDENT_RE = re.compile(r"[ \t]*")
_COLON_RE = re.compile(r":(?=\n|  #| #)")  # a colon that ends a line (before any comment)


class Blocks:
    """The compound-statement headers of one file and how they nest, found from their colons.

    A statement's innermost enclosing block is the nearest header before it that is indented
    less (every line between is in that block); nesting follows by the same rule among the
    headers, so an offset's blocks are a walk up parent links, not a scan of the lines.
    """

    def __init__(self, text: str) -> None:
        self.text = text
        self.ends: list[int] = []  # colon offsets, increasing
        self.starts: list[int] = []  # offset of the header's first line
        self.indent: list[int] = []
        self.word: list[str] = []
        self.parent: list[int] = []
        self._stack: list[int] = []
        self._done = 0  # headers are read up to here (on demand: most references come early)
        self._colons: list[int] | None = None
        self._at = 0

    def _find_colons(self) -> list[int]:
        return [m.start() for m in _COLON_RE.finditer(self.text)]

    def _read_to(self, offset: int) -> None:
        text, stack, indent = self.text, self._stack, self.indent
        colons = self._colons if self._colons is not None else self._find_colons()
        self._colons = colons
        at, n = self._at, len(colons)
        while at < n and colons[at] < offset:
            c = colons[at]
            at += 1
            start = text.rfind("\n", 0, c) + 1
            m = _WORD_RE.match(text, start)
            if m is None:
                ind = _INDENT_RE.match(text, start).end() - start  # type: ignore[union-attr]
                if text[start + ind] not in ")]":
                    continue
                start, m = self._opening(start, ind)
                if m is None:
                    continue
            else:
                ind = m.start(1) - start
            word = m.group(1)
            if word not in _BLOCK_WORDS:
                continue
            while stack and indent[stack[-1]] >= ind:
                stack.pop()
            self.parent.append(stack[-1] if stack else -1)
            stack.append(len(self.ends))
            self.ends.append(c)
            self.starts.append(start)
            indent.append(ind)
            self.word.append(word)
        self._at = at
        self._done = max(self._done, offset)

    def _opening(self, start: int, ind: int) -> tuple[int, re.Match[str] | None]:
        """The first line of a header whose last line is `) -> X:`: the nearest line before it
        indented exactly as much (≤ 64 lines up)."""
        text, lead, pos = self.text, "\n" + " " * ind, start - 1
        for _ in range(64):
            pos = text.rfind(lead, 0, pos)
            if pos < 0:
                break
            m = _WORD_RE.match(text, pos + 1)
            if m is not None and m.start(1) - pos - 1 == ind:
                return pos + 1, m
        return start, None

    def enclosing(self, offset: int, indent: int) -> list[int]:
        """Headers around a statement at `offset` indented `indent`, innermost first."""
        out: list[int] = []
        if offset > self._done:
            self._read_to(offset)
        i = bisect.bisect_left(self.ends, offset) - 1 if indent > 0 else -1
        while i >= 0:
            if self.indent[i] < indent:
                out.append(i)
                indent = self.indent[i]
            i = self.parent[i]  # the headers in between are indented at least as much
        return out

    def around_line(self, line_start: int, indent: int) -> list[int]:
        """Headers around a line that may continue a bracketed statement (a table's entry): while
        a line between the innermost header and it is indented no more than that header, the
        last such line is where the statement (or an enclosing one) starts; climb to it."""
        heads = self.enclosing(line_start, indent)
        while heads:
            bound = self.indent[heads[0]]
            pat = _LESS.get(bound)
            if pat is None:
                pat = _LESS[bound] = re.compile(rf"\n[ \t]{{0,{bound}}}[^ \t\n#)\]}}]")
            last = None
            for m in pat.finditer(self.text, self.ends[heads[0]], line_start - 1):
                last = m
            if last is None:
                break
            line_start = last.start() + 1
            heads = self.enclosing(line_start, last.end() - line_start - 1)
        return heads

    def line_of(self, i: int, offset: int, line: int) -> int:
        """Line number of header i, from a later offset whose line number is known."""
        return line - self.text.count("\n", self.starts[i], offset)

    def condition(self, i: int) -> str:
        """`if self.use_triton`, `except ImportError`: the header without its colon; an `else`
        names the header it follows (`else of if envs.USE_ATOMESH_ENTRYPOINTS`)."""
        text = " ".join(self.text[self.starts[i] : self.ends[i]].split())
        if self.word[i] == "else":
            j = i - 1
            while j >= 0 and self.indent[j] > self.indent[i]:
                j -= 1  # the blocks nested in the branch before it
            if j >= 0 and self.indent[j] == self.indent[i] and self.word[j] != "else":
                text += " of " + " ".join(self.text[self.starts[j] : self.ends[j]].split())
        return text


_LESS: dict[int, re.Pattern[str]] = {}


class LineNumbers:
    """Line numbers of increasing offsets, counted incrementally."""

    def __init__(self, text: str) -> None:
        self.text, self.pos, self.line = text, 0, 1

    def __call__(self, offset: int) -> int:
        if offset < self.pos:
            self.pos, self.line = 0, 1
        self.line += self.text.count("\n", self.pos, offset)
        self.pos = offset
        return self.line


def finds(text: str, word: str) -> Iterable[int]:
    """Offsets of `word` in `text` (a literal search: much faster than a regex with lookbehinds)."""
    pos = text.find(word)
    while pos >= 0:
        yield pos
        pos = text.find(word, pos + len(word))
