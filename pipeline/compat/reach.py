"""Which ATOM modules can run for one model: a static import closure, read from git objects.

The closure starts at the server entry point (`atom.entrypoints.openai_server`)
and at the model's own module, which ATOM's model registry names for the
model's architecture class (the architecture -> qualname dict that
`atom/model_engine/model_runner.py` indexes with `hf_config.architectures[0]`).

Edges followed (a sound over-approximation: when unsure, a module is on the path):
- imports at module level, and imports inside functions, `if` and `try` blocks;
  `import a.b.c` and `from a.b import c` also run the packages `a` and `a.b`,
  and `from a import b` runs the module `a.b` when there is one;
- every string literal that names an ATOM module or object (`"atom.x.y.Cls"`,
  `"atom.x.y:Cls"`): the registries and plug-in tables ATOM resolves through
  `resolve_obj_by_qualname` / `importlib.import_module`; an f-string prefix
  (`f"atom.pkg.{name}"`, `"atom.pkg." + name`) reaches every module under that package.

Edges not followed, each only while the pinned tree shows the fact it rests on
(otherwise the edge is followed):
- `other-architecture`: the model registry's entries for other architectures;
- `use_v4`: the attention backend the selector returns under `if use_v4:`, for
  a model that is not DeepSeek-V4 (ModelRunner sets use_v4 from
  `"DeepseekV4" in architectures`);
- `standalone`: code under `if is_vllm():` / `is_sglang()` / `is_rtpllm()` /
  `is_plugin_mode()`: the server runs ATOM standalone (the framework is "atom"
  unless a plugin entry point switches it, and no module on the path does);
- `no-drafter`: the speculative-decoding package's function bodies and drafter
  tables, when the recipe's server command sets no `--method` (ATOM builds no
  drafter then).

Read with string searches and regular expressions, not `ast` (a cold closure
over ~400 files stays within its 0.3 s budget): blocks are found from the
colons that end their headers and nested by indentation. Every file is
scanned for its references as git streams its blob (git inflates the next
ones meanwhile), but only the files the walk reaches get their blocks read;
the others keep their references alone, which is all the evidence of who
imports a file off the path uses. Per-file summaries are cached by blob SHA
and path, whole results by tree SHA.
"""

from __future__ import annotations

import bisect
import re
import time
import tomllib
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from pipeline.compat.pyblocks import CONDITIONAL_WORDS, Blocks, LineNumbers, Lines, finds
from pipeline.compat.pysource import SummaryCache, module_files, module_of, prune_files, resolve_relative
from pipeline.compat.report import CheckReport, Finding
from pipeline.compat.waivers import apply_waivers, covers
from pipeline.errors import ConfigError, SourceError
from pipeline.gitw import GitRepo

ENTRY_POINT = "atom.entrypoints.openai_server"
REGISTRY_PATH = "atom/model_engine/model_runner.py"
SELECTOR_PATH = "atom/utils/selector.py"
ARG_UTILS_PATH = "atom/model_engine/arg_utils.py"
PREPARE_PATH = "atom/plugin/prepare.py"
PLUGIN_PACKAGE = "atom/plugin/"
SPEC_DECODE_PACKAGE = "atom/spec_decode/"
SUMMARY_SCHEMA = 7  # bump when FileSummary or the extraction rules change
REACH_TREES_KEPT = 256  # per-tree result files kept in a cache dir (the newest)
PLUGIN_GUARDS = ("is_vllm()", "is_sglang()", "is_rtpllm()", "is_plugin_mode()")

EdgeKind = Literal["import", "nested-import", "string", "registry", "package"]

# -- per-file summaries ----------------------------------------------------------

_IMPORT_RE = re.compile(
    r"^([ \t]*)(?:from[ \t]+(\.*)([\w.]*)[ \t]+import[ \t]+(\([^)]*\)|[^\n]*)|import[ \t]+([^\n]*))",
    re.M,
)
# A quoted literal that is an ATOM qualname ("atom.a.b", "atom.a.b:Cls") or an f-string prefix.
_QUAL_RE = re.compile(r"""(?<=["'])atom(?:\.\w+)+(?::\w+)?(?=\.\{|\.["']|["'])""")
_GUARD_RE = re.compile(r"^[ \t]*(?:el)?if[ \t]+(?:self\.)?(\w+(?:\(\))?)[ \t]*:")
_SWITCH_RE = re.compile(r"(?<![.\w])(?<!def )_set_framework_backbone\(")
_SETS_FRAMEWORK_RE = re.compile(r"(?<![.\w])(?<!def )(?:_set_framework_backbone|prepare_model\w*)\(")
# Significant lines: not blank, not a comment, not a closing bracket (which ends a bracket, not a block).


@dataclass(frozen=True)
class RawEdge:
    """One reference from a file: an import or a qualname string, with its context."""

    line: int
    kind: EdgeKind  # import / nested-import / string (registry/package are decided later)
    target: str  # dotted name as written (relative imports resolved)
    names: tuple[str, ...] = ()  # `from target import names` (possible submodules)
    in_function: bool = False
    guards: tuple[str, ...] = ()  # conditions of the `if`/`elif` blocks around it: "use_v4", "is_vllm()"
    key: str | None = None  # dict key when the string is a table entry
    prefix: bool = False  # f-string prefix: every module under target
    owner: str = ""  # in atom/plugin/: the top-level def/class/assignment it belongs to ("": other code)
    # The conditional blocks around it, outermost first: ("if self.use_triton", 1207), ("else", 12).
    conditions: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True)
class FileSummary:
    edges: tuple[RawEdge, ...]
    # Outside atom/plugin/: calls ATOM's plugin-mode switch (_set_framework_backbone, prepare_model*).
    sets_framework: bool
    # In atom/plugin/ only: top-level owners that call _set_framework_backbone, and for each
    # top-level owner the identifiers it mentions (which functions and imports it can run).
    switch_owners: tuple[str, ...] = ()
    refs: tuple[tuple[str, frozenset[str]], ...] = ()
    # Top-level assignments of a literal (`TABLE = {...}`): their strings are data, used when named.
    data_owners: frozenset[str] = frozenset()


def _imports(text: str) -> Iterable[re.Match[str]]:
    """`_IMPORT_RE` matches, found from the word `import` (a literal scan, much faster than `^`)."""
    seen = -1
    pos = text.find("import", 0)
    while pos >= 0:
        start = text.rfind("\n", 0, pos) + 1
        if start != seen:
            seen = start
            m = _IMPORT_RE.match(text, start)
            if m is not None:
                yield m
        pos = text.find("import", pos + 6)


def _key_before(text: str, quote: int) -> str | None:
    """The dict key of a `"key": "value"` entry whose value's opening quote is at `quote`."""
    w = text[max(0, quote - 160) : quote].rstrip()
    if w.endswith("("):
        w = w[:-1].rstrip()
    if not w.endswith(":"):
        return None
    w = w[:-1].rstrip()
    if not w or w[-1] not in "\"'":
        return None
    start = w.rfind(w[-1], 0, len(w) - 1)
    key = w[start + 1 : -1]
    return key if start >= 0 and re.fullmatch(r"[\w.\-]+", key) else None


def _quals(text: str) -> Iterable[re.Match[str]]:
    """`_QUAL_RE` matches, found from the literal `atom.` right after a quote."""
    pos = text.find("atom.", 1)
    while pos >= 0:
        if text[pos - 1] in "\"'":
            m = _QUAL_RE.match(text, pos)
            if m is not None:
                yield m
        pos = text.find("atom.", pos + 5)


def _calls_switch(text: str) -> bool:
    """Does the file call ATOM's plugin-mode switch (`_SETS_FRAMEWORK_RE`, tried where the names are)?"""
    return any(
        _SETS_FRAMEWORK_RE.match(text, pos)
        for word in ("_set_framework_backbone", "prepare_model")
        for pos in finds(text, word)
    )


# A reference as the scan finds it: (line, kind, target, names, key, prefix) and where it is:
# (offset, indent, statement?) -- a statement's blocks are the ones around it, a string's those
# around the statement whose line it continues.
_Found = tuple[int, EdgeKind, str, tuple[str, ...], str | None, bool, int, int, bool]
_Context = tuple[bool, tuple[str, ...], str, tuple[tuple[str, int], ...]]


@dataclass
class _Scanned:
    """One file's text and its references without their blocks (this run only, not cached)."""

    text: str
    lines: Lines
    found: list[_Found]

    def refs(self, path: str) -> FileRefs:
        edges = tuple(
            RawEdge(n, kind, target, names, key=key, prefix=prefix)
            for n, kind, target, names, key, prefix, *_ in self.found
        )
        return FileRefs(
            edges, _switch_owners(self.text, self.lines) if path.startswith(PLUGIN_PACKAGE) else ()
        )


def _scan(data: bytes, path: str) -> _Scanned:
    """Every import and ATOM qualname string of one file, where it is (no blocks read yet)."""
    text = data.decode("utf-8", "replace")
    module = module_of(path) or ""
    is_pkg = path.endswith("__init__.py")
    found: list[_Found] = []
    line_no = LineNumbers(text)
    for m in _imports(text):
        indent, dots, target, names, plain = m.groups()
        if plain is not None:
            if "atom" not in plain:
                continue
        elif not (target.startswith("atom") or dots):
            continue
        n = line_no(m.start())
        kind: EdgeKind = "nested-import" if indent else "import"
        if plain is not None:
            for part in plain.split("#")[0].split(","):
                name = part.strip().split(" as ")[0].strip()
                if name == "atom" or name.startswith("atom."):
                    found.append((n, kind, name, (), None, False, m.start(), len(indent), True))
            continue
        base = resolve_relative(module, is_pkg, len(dots), target or None) if dots else target
        if not base or not (base == "atom" or base.startswith("atom.")):
            continue
        if "#" in names:
            names = re.sub(r"#[^\n]*", "", names)
        listed = [x.strip().split(" as ")[0].strip() for x in names.split(",")]
        clean = tuple(x.strip("()\\ \t\n") for x in listed)
        found.append(
            (
                n,
                kind,
                base,
                tuple(x for x in clean if x.isidentifier()),
                None,
                False,
                m.start(),
                len(indent),
                True,
            )
        )
    line_no = LineNumbers(text)
    for m in _quals(text):
        qual = m.group(0)
        # f"atom.pkg.{name}" and "atom.pkg." + name: every module under the package
        end = ".{" if text.startswith((".{", '."', ".'"), m.end()) else ""
        line_start = text.rfind("\n", 0, m.start()) + 1
        lead = text[line_start : m.start()]
        indent = len(lead) - len(lead.lstrip(" \t"))
        n = line_no(m.start())
        key = _key_before(text, m.start() - 1)
        found.append((n, "string", qual.replace(":", "."), (), key, end == ".{", line_start, indent, False))
    return _Scanned(text, Lines(text), found)


def _with_blocks(scanned: _Scanned, path: str) -> list[RawEdge]:
    """The references of a scanned file, each with the blocks around it."""
    text, lines = scanned.text, scanned.lines
    plugin = path.startswith(PLUGIN_PACKAGE)
    blocks: Blocks | None = None  # only for files with an indented reference

    def context(offset: int, indent: int, line: int, statement: bool) -> _Context:
        """(inside a function?, simple `if NAME:` guards innermost first, top-level owner,
        the conditional blocks around it outermost first as (header, line))."""
        nonlocal blocks
        owner = lines.owner(offset) if plugin else ""
        if indent <= 0:
            return False, (), owner, ()
        if blocks is None:
            blocks = Blocks(text)
        heads = blocks.enclosing(offset, indent) if statement else blocks.around_line(offset, indent)
        in_fn, guards, conds = False, [], []
        for h in heads:
            word = blocks.word[h]
            if word in ("def", "async"):
                in_fn = True
            elif word in CONDITIONAL_WORDS:
                header = blocks.condition(h)
                conds.append((header, blocks.line_of(h, offset, line)))
                g = _GUARD_RE.match(header + ":") if word in ("if", "elif") else None
                if g:
                    guards.append(g.group(1))
        return in_fn, tuple(guards), owner, tuple(reversed(conds))

    edges = []
    for n, kind, target, names, key, prefix, offset, indent, statement in scanned.found:
        in_fn, guards, owner, conds = context(offset, indent, n, statement)
        edges.append(RawEdge(n, kind, target, names, in_fn, guards, key, prefix, owner, conds))
    return edges


def _switch_owners(text: str, lines: Lines) -> tuple[str, ...]:
    """Top-level owners of a plugin file that call `_set_framework_backbone` (host entry points)."""
    calls = [pos for pos in finds(text, "_set_framework_backbone(") if _SWITCH_RE.match(text, pos)]
    return tuple(sorted({lines.owner(pos) for pos in calls}))


@dataclass(frozen=True)
class FileRefs:
    """What a file the walk never reaches is read for: its references without their blocks (for
    the evidence of who imports a file off the path) and, in atom/plugin/, the owners that switch
    ATOM into plugin mode (host entry points). Much cheaper than a `FileSummary`."""

    edges: tuple[RawEdge, ...]
    switch_owners: tuple[str, ...] = ()


def summarize_refs(data: bytes, path: str) -> FileRefs:
    return _scan(data, path).refs(path)


def summarize(data: bytes, path: str) -> FileSummary:
    """Every import and ATOM qualname string of one file, with the blocks around each."""
    return _summary(_scan(data, path), path)


def _summary(scanned: _Scanned, path: str) -> FileSummary:
    text, lines = scanned.text, scanned.lines
    edges = _with_blocks(scanned, path)
    if not path.startswith(PLUGIN_PACKAGE):
        return FileSummary(tuple(edges), _calls_switch(text))
    switch = _switch_owners(text, lines)
    # The names each top-level statement mentions, among the file's own top-level names and the
    # names it imports (a substring test: a false mention only keeps more code on the path).
    owners = [lines.owner_name(t) for t in range(len(lines.tops))]
    candidates = {o for o in owners if o} | {x for e in edges for x in e.names}
    tops = lines.tops
    refs: dict[str, set[str]] = {owner: set() for owner in owners}
    data_owners = {
        o
        for t, o in enumerate(owners)
        if o and not text.startswith(("def ", "async def ", "class ", "@"), tops[t])
    }
    # Each name's occurrences, each in the top-level statement it falls in (a name has no newline,
    # so none straddles two): the first one in a statement is enough, the search goes on at the next.
    ends = [*tops[1:], len(text)]
    for c in candidates:
        pos = text.find(c)
        while pos >= 0:
            t = bisect.bisect_right(tops, pos) - 1
            if t >= 0 and owners[t] != c:
                refs[owners[t]].add(c)
            if t < 0 and not tops:
                break
            pos = text.find(c, ends[t] if t >= 0 else tops[0])
    return FileSummary(
        tuple(edges),
        False,
        switch,
        tuple((o, frozenset(r)) for o, r in sorted(refs.items())),
        frozenset(data_owners),
    )


# -- the graph -------------------------------------------------------------------


@dataclass(frozen=True)
class Edge:
    src: str  # path of the importing file
    dst: str  # path of the file it runs
    line: int
    kind: EdgeKind
    key: str | None = None  # registry key
    raw: RawEdge | None = None
    conditions: tuple[tuple[str, int], ...] = ()  # the raw edge's conditional blocks (kept when bare)

    def how(self) -> str:
        name = Path(self.src).name
        return {
            "import": f"import, {name}:{self.line}",
            "nested-import": f"function-level import, {name}:{self.line}",
            "string": f"qualname string, {name}:{self.line}",
            "registry": f"registry entry {self.key}, {name}:{self.line}",
            "package": f"package __init__, {name}:{self.line}",
        }[self.kind]


@dataclass(frozen=True)
class Excluded:
    edge: Edge
    rule: str  # rule id (other-architecture, use_v4, standalone, no-drafter)


@dataclass(frozen=True)
class ModelFacts:
    """What the recipe says about the model that its path depends on."""

    architecture: str
    speculative: bool = False  # the server command sets --method (ATOM builds a drafter)

    @property
    def key(self) -> str:
        return f"{self.architecture}:{int(self.speculative)}"


def facts_from_command(architecture: str, command: Iterable[str]) -> ModelFacts:
    spec = any(a == "--method" or a.startswith("--method=") for a in command)
    return ModelFacts(architecture, speculative=spec)


@dataclass(frozen=True)
class Reach:
    """The closure of one model at one ATOM tree, with the evidence for each verdict."""

    atom_sha: str
    tree_sha: str
    facts: ModelFacts
    model_module: str  # path of the model's file
    registry_line: int
    parents: dict[str, Edge | None]  # reached path -> the edge that first reached it (None: a root)
    importers: dict[str, tuple[Edge, ...]]  # every edge into each file off the path
    excluded: tuple[Excluded, ...]
    followed: dict[str, int]  # edge kind -> edges followed
    rules: dict[str, str]  # rule id -> what it rests on in this tree
    files: frozenset[str] = frozenset()  # every ATOM Python file of the tree
    # Files on the path only through conditional blocks (`if self.use_triton:`), each with the
    # conditional edges from the unconditional part of the path that lead to it.
    conditional: dict[str, tuple[Edge, ...]] = field(default_factory=dict)
    seconds: float = 0.0

    def on_path(self, path: str) -> bool:
        """A file of the tree the closure does not reach is off; anything else is on (sound)."""
        return path in self.parents or path not in self.files

    def chain(self, path: str) -> list[Edge]:
        out: list[Edge] = []
        e = self.parents.get(path)
        while e is not None and len(out) < 64:
            out.append(e)
            e = self.parents.get(e.src)
        return list(reversed(out))

    def conditions(self, path: str) -> tuple[tuple[str, ...], ...]:
        """For a file reached only conditionally: per way in, its conditions (outermost first);
        () for a file reached unconditionally or not at all."""
        out: list[tuple[str, ...]] = []
        for e in self.conditional.get(path, ()):
            conds = tuple(c for c, _ in e.conditions)
            if conds not in out:
                out.append(conds)
        return tuple(out)

    def condition_summary(self, path: str) -> str:
        """ "`if self.use_triton` (moe.py:1207; import at 1208, 1441); ...": each way in."""
        groups: dict[tuple[str, tuple[tuple[str, int], ...]], list[int]] = {}
        for e in self.conditional.get(path, ()):
            lines = groups.setdefault((e.src, e.conditions), [])
            if e.line not in lines:
                lines.append(e.line)
        parts = []
        for (src, conds), lines in groups.items():
            name = Path(src).name
            where = " and ".join(f"`{c}` ({name}:{n})" for c, n in conds)
            parts.append(f"{where}, import at {name}:{','.join(map(str, sorted(lines)))}")
        return "; ".join(parts)

    def evidence(self, path: str) -> str:
        arch = self.facts.architecture
        if path in self.parents:
            chain = self.chain(path)
            if not chain:
                return f"{path} is where {arch}'s path starts"
            steps = [chain[0].src] + [f"{e.dst} ({e.how()})" for e in chain]
            if path in self.conditional:
                return f"{arch} reaches {path} only under {self.condition_summary(path)}: " + " -> ".join(
                    steps
                )
            return f"{arch} reaches {path}: " + " -> ".join(steps)
        if self.on_path(path):
            return f"{path} is not a Python file of ATOM {self.atom_sha[:10]}: counted as on the path"
        ins = self.importers.get(path, ())
        rule_of = {(x.edge.src, x.edge.line, x.edge.dst): x.rule for x in self.excluded}
        # One entry per importing file and reason, its lines together.
        groups: dict[tuple[str, str], list[int]] = {}
        for e in ins:
            rule = rule_of.get((e.src, e.line, e.dst))
            if e.kind == "registry":
                why = f"the registry entry for {e.key}"
            elif rule:
                why = _RULE_SHORT[rule]
            else:
                why = "itself off the path"
            lines = groups.setdefault((e.src, why), [])
            if e.line not in lines:
                lines.append(e.line)
        if not groups:
            return f"nothing in ATOM {self.atom_sha[:10]} imports or names {path}"
        parts = []
        for (src, why), lines in groups.items():
            at = f"{src}:{','.join(map(str, sorted(lines)))}"
            parts.append(f"{why} ({at})" if why.startswith("the registry") else f"{at} ({why})")
        return f"{path} is imported only by " + "; ".join(parts) + f": none is on {arch}'s path"

    def edges_summary(self) -> str:
        f = ", ".join(f"{n} {k}" for k, n in sorted(self.followed.items()))
        counts: dict[str, int] = {}
        for x in self.excluded:
            counts[x.rule] = counts.get(x.rule, 0) + 1
        ex = ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "none"
        return f"{len(self.parents)} ATOM files on the path; edges followed: {f}; not followed: {ex}"

    def to_json(self) -> dict[str, object]:
        return {
            "architecture": self.facts.architecture,
            "speculative": self.facts.speculative,
            "model_module": self.model_module,
            "atom": self.atom_sha,
            "tree": self.tree_sha,
            "files_on_path": len(self.parents),
            "files_only_under_conditions": len(self.conditional),
            "followed": dict(self.followed),
            "rules": dict(self.rules),
        }


_RULE_SHORT = {
    "other-architecture": "another architecture's registry entry",
    "use_v4": "under `if use_v4:`, false for this model",
    "standalone": "plugin mode only, the server runs ATOM standalone",
    "plugin-only": "in plugin code nothing on the path runs (vLLM/SGLang call it)",
    "no-drafter": "speculative decoding only, the recipe sets no --method",
}


class ReachError(SourceError):
    """ATOM's tree does not show what the closure needs (registry, entry point)."""


_REGISTRY_USE_RE = re.compile(r"(\w+)\[[\w.]*architectures\[0\]\]")


def model_registry(text: str) -> dict[str, tuple[str, int]] | None:
    """{architecture: (qualname, line)} of the dict model_runner.py indexes with architectures[0]."""
    # Searched from the line of the first `architectures[0]]` (every match holds it; a regex that
    # starts with \w+ is slow to try at every offset of a 230 kB file).
    first = text.find("architectures[0]]")
    use = _REGISTRY_USE_RE.search(text, text.rfind("\n", 0, first) + 1) if first >= 0 else None
    if use is None:
        return None
    name = use.group(1)
    start = re.search(rf"^{re.escape(name)}[ \t]*(?::[^=\n]*)?=[ \t]*\{{", text, re.M)
    if start is None:
        return None
    end = re.compile(r"^\}", re.M).search(text, start.end())
    if end is None:
        return None
    body = text[start.end() : end.start()]
    first_line = text.count("\n", 0, start.end()) + 1
    entries: dict[str, tuple[str, int]] = {}
    for m in re.finditer(r"""["'](\w+)["'][ \t]*:[ \t]*\(?\s*["']([\w.:]+)["']""", body):
        entries[m.group(1)] = (m.group(2), first_line + body.count("\n", 0, m.start()))
    return entries


class _Tree:
    """The Python files of one ATOM tree, each read only as far as the closure asks: every file
    without a cached summary is scanned for its references as git streams it; the files the walk
    reaches then get a `FileSummary` (the blocks around each reference), the others a `FileRefs`
    (who imports a file off the path, host entry points)."""

    def __init__(
        self,
        blobs: dict[str, str],
        cache: dict[str, object],
        fetch: Callable[[Sequence[str]], dict[str, bytes]],
    ) -> None:
        self.blobs = blobs
        self.mods = module_files(blobs)
        self.cache = cache  # per-file: "{blob}:{path}" -> FileSummary, "{blob}:{path}:refs" -> FileRefs
        self.fetch = fetch  # reads blobs the stream did not bring
        self.dirty = False  # the cache gained entries
        self.scanned: dict[str, _Scanned] = {}
        self._raw: dict[str, bytes] = {}  # fetched blobs, scanned on first use
        self._summaries: dict[str, FileSummary] = {}
        self._targets: dict[str, tuple[str | None, tuple[str, ...]]] = {}

    def unread(self) -> dict[str, list[str]]:
        """{blob sha: its paths} of the files with nothing cached (to be streamed and scanned)."""
        out: dict[str, list[str]] = {}
        for p, sha in self.blobs.items():
            if f"{sha}:{p}" not in self.cache and f"{sha}:{p}:refs" not in self.cache:
                out.setdefault(sha, []).append(p)
        return out

    def scan_of(self, path: str) -> _Scanned:
        got = self.scanned.get(path)
        if got is None:
            sha = self.blobs[path]
            if sha not in self._raw:
                # A file an earlier model left with refs only, on this model's path: read every
                # blob that has no full summary yet at once (one git process for all of them).
                more = {
                    s for p, s in self.blobs.items() if p not in self.scanned and self.summarized(p) is None
                }
                self._raw.update(self.fetch(sorted(more | {sha})))
            got = self.scanned[path] = _scan(self._raw[sha], path)
        return got

    def summary(self, path: str) -> FileSummary:
        got = self._summaries.get(path)
        if got is None:
            key = f"{self.blobs[path]}:{path}"
            cached = self.cache.get(key)
            if isinstance(cached, FileSummary):
                got = cached
            else:
                got = _summary(self.scan_of(path), path)
                self.cache[key] = got
                self.dirty = True
            self._summaries[path] = got
        return got

    def summarized(self, path: str) -> FileSummary | None:
        """The file's full summary if this run or the cache has it (never computed here)."""
        got = self._summaries.get(path)
        if got is None:
            cached = self.cache.get(f"{self.blobs[path]}:{path}")
            got = cached if isinstance(cached, FileSummary) else None
        return got

    def refs(self, path: str) -> FileSummary | FileRefs:
        """The file's references: from its full summary when there is one, else the cheap kind."""
        got = self.summarized(path)
        if got is not None:
            return got
        key = f"{self.blobs[path]}:{path}:refs"
        cached = self.cache.get(key)
        if isinstance(cached, FileRefs):
            return cached
        refs = self.scan_of(path).refs(path)
        self.cache[key] = refs
        self.dirty = True
        return refs

    def switch_owners(self, path: str) -> tuple[str, ...]:
        """Owners of a plugin file that call `_set_framework_backbone` (host entry points)."""
        got = self.summarized(path)
        if got is not None:
            return got.switch_owners
        cached = self.cache.get(f"{self.blobs[path]}:{path}:refs")
        if isinstance(cached, FileRefs):
            return cached.switch_owners
        scanned = self.scan_of(path)
        return _switch_owners(scanned.text, scanned.lines)

    def _runs(self, target: str) -> tuple[str | None, tuple[str, ...]]:
        """(the file a dotted name runs, the package __init__ files above it), once per name."""
        got = self._targets.get(target)
        if got is None:
            dst = self.path_of(target)
            parts = target.split(".")
            pkgs = [self.mods.get(".".join(parts[:depth])) for depth in range(1, len(parts))]
            got = dst, tuple(p for p in pkgs if p is not None and p.endswith("__init__.py") and p != dst)
            self._targets[target] = got
        return got

    def path_of(self, dotted: str) -> str | None:
        """The file a dotted name runs: the longest prefix that is a module."""
        parts = dotted.split(".")
        while parts:
            p = self.mods.get(".".join(parts))
            if p is not None:
                return p
            parts.pop()
        return None

    def targets(
        self, path: str, registry: dict[str, tuple[str, int]], r: RawEdge
    ) -> list[tuple[str, EdgeKind, str | None]]:
        """(file, edge kind, registry key) of each file one of `path`'s references runs."""
        if r.kind == "string" and r.prefix:
            prefix = r.target + "."
            return [(p, "string", None) for m, p in self.mods.items() if m.startswith(prefix)]
        out: list[tuple[str, EdgeKind, str | None]] = []
        kind: EdgeKind = r.kind
        if path == REGISTRY_PATH and r.kind == "string" and r.key in registry:
            kind = "registry"
        dst, pkgs = self._runs(r.target)
        if dst is not None:
            out.append((dst, kind, r.key if kind == "registry" else None))
        out += [(pkg, "package", None) for pkg in pkgs]
        for n in r.names:
            sub = self.mods.get(f"{r.target}.{n}")
            if sub is not None:
                out.append((sub, kind, None))
        return out

    def edges(self, path: str, registry: dict[str, tuple[str, int]], raw: Iterable[RawEdge]) -> list[Edge]:
        """The files each of `path`'s references runs."""
        return [
            Edge(path, dst, r.line, kind, key, r)
            for r in raw
            for dst, kind, key in self.targets(path, registry, r)
        ]


class _Graph:
    """{path: the edges out of it}, each file's built on first use from its full summary."""

    def __init__(self, tree: _Tree, registry: dict[str, tuple[str, int]]) -> None:
        self.tree, self.registry = tree, registry
        self._edges: dict[str, list[Edge]] = {}

    def get(self, path: str, default: Sequence[Edge] = ()) -> Sequence[Edge]:
        got = self._edges.get(path)
        if got is None:
            if path not in self.tree.blobs:
                return default
            got = self.tree.edges(path, self.registry, self.tree.summary(path).edges)
            self._edges[path] = got
        return got

    def built(self, path: str) -> list[Edge] | None:
        return self._edges.get(path)


def _rules(texts: dict[str, str], facts: ModelFacts) -> dict[str, str]:
    """The exclusion rules this tree supports for this model: {rule id: the text it rests on}."""
    rules = {"other-architecture": f"only {facts.architecture}'s entry of the model registry is dispatched"}
    runner = texts.get(REGISTRY_PATH, "")
    if (
        "DeepseekV4" not in facts.architecture
        and re.search(r"self\.use_v4\s*=\s*self\.is_deepseek_v4\(\)", runner)
        and re.search(r"""["']DeepseekV4["']\s+in\s+str\(a\)""", runner)
        and re.search(r"use_v4\s*=\s*self\.use_v4", runner)
    ):
        rules["use_v4"] = (
            "ModelRunner passes use_v4 = is_deepseek_v4() to the attention selector, true for an "
            f"architecture containing 'DeepseekV4' (or a deepseek_v4 model_type): not {facts.architecture}"
        )
    if re.search(r"""^_CURRENT_FRAMEWORK\s*=\s*["']atom["']""", texts.get(PREPARE_PATH, ""), re.M):
        rules["standalone"] = (
            "atom/plugin/prepare.py starts with _CURRENT_FRAMEWORK = 'atom' and only the plugin entry "
            "functions (those calling _set_framework_backbone, which vLLM/SGLang/RTP-LLM call) switch "
            "it: under the openai_server entry point is_vllm()/is_sglang()/is_rtpllm()/is_plugin_mode() "
            "are false and those functions do not run"
        )
    sel = texts.get(SELECTOR_PATH, "")
    if "standalone" in rules and "use_sglang=is_sglang()" in sel and "use_vllm=is_vllm()" in sel:
        rules["standalone-selector"] = (
            "the attention selector's use_vllm/use_sglang are is_vllm()/is_sglang()"
        )
    if (
        not facts.speculative
        and re.search(r"if self\.method and self\.num_speculative_tokens > 0", texts.get(ARG_UTILS_PATH, ""))
        and re.search(r"self\.drafter = \w+\(", runner)
    ):
        rules["no-drafter"] = (
            "the recipe's server command sets no --method, and ATOM makes a speculative config (and "
            "builds a drafter) only with one (arg_utils.py)"
        )
    return rules


def _exclusion(e: Edge, rules: dict[str, str], facts: ModelFacts, model_path: str) -> str | None:
    if e.kind == "registry":
        return None if e.key == facts.architecture or e.dst == model_path else "other-architecture"
    r = e.raw
    if r is None:
        return None
    if "use_v4" in rules and e.src == SELECTOR_PATH and r.kind == "string" and "use_v4" in r.guards:
        return "use_v4"
    if "standalone" in rules and any(g in PLUGIN_GUARDS for g in r.guards):
        return "standalone"
    if (
        "standalone-selector" in rules
        and e.src == SELECTOR_PATH
        and {"use_vllm", "use_sglang"} & set(r.guards)
    ):
        return "standalone"
    if (
        "no-drafter" in rules
        and e.src.startswith(SPEC_DECODE_PACKAGE)
        and (r.kind == "string" or r.in_function)
    ):
        return "no-drafter"
    return None


def compute_reach(
    atom: GitRepo,
    atom_rev: str,
    facts: ModelFacts,
    *,
    cache_dir: Path | None = None,
) -> Reach:
    """The ATOM files the server entry point plus `facts.architecture`'s module can run."""
    t0 = time.perf_counter()
    memo_key = (str(atom.path), atom_rev, facts.key, str(cache_dir))
    if len(atom_rev) == 40 and memo_key in _MEMO:  # a full SHA: `pin --auto` gates hundreds of reports
        return replace(_MEMO[memo_key], seconds=time.perf_counter() - t0)
    reach = _compute_reach(atom, atom_rev, facts, cache_dir, t0)
    if len(atom_rev) == 40:
        if len(_MEMO) > 16:
            _MEMO.clear()
        _MEMO[memo_key] = reach
    return reach


# Reaches computed in this process, by (repository, full SHA, model facts, cache dir).
_MEMO: dict[tuple[str, str, str, str], Reach] = {}


def _python_files(atom: GitRepo, sha: str) -> tuple[dict[str, str], str | None]:
    """({path: blob sha} of ATOM's Python files, pyproject.toml's blob sha): one `git ls-tree`."""
    blobs: dict[str, str] = {}
    project = None
    for line in atom.git("ls-tree", "-r", "--full-tree", sha, "--", "atom", "pyproject.toml").splitlines():
        meta, _, path = line.partition("\t")
        parts = meta.split()
        if len(parts) != 3 or parts[1] != "blob":
            continue
        if path == "pyproject.toml":
            project = parts[2]
        elif path.endswith(".py"):
            blobs[path] = parts[2]
    return blobs, project


def _compute_reach(
    atom: GitRepo, atom_rev: str, facts: ModelFacts, cache_dir: Path | None, t0: float
) -> Reach:
    atom_sha = atom.rev_parse(atom_rev)
    if atom_sha is None:
        raise SourceError(f"ATOM ref {atom_rev!r} is not a commit in {atom.path}.")
    tree_sha = atom.git("rev-parse", f"{atom_sha}^{{tree}}")
    # One small cache file per ATOM tree (its results per model), one for the per-file summaries.
    results = SummaryCache.open(f"reach-v{SUMMARY_SCHEMA}-{tree_sha[:16]}", cache_dir)
    got = results.data.get(facts.key)
    if isinstance(got, Reach):
        return replace(got, atom_sha=atom_sha, seconds=time.perf_counter() - t0)
    files = SummaryCache.open(f"reach-files-v{SUMMARY_SCHEMA}", cache_dir)
    blobs, project = _python_files(atom, atom_sha)
    want = {p: blobs[p] for p in (REGISTRY_PATH, ARG_UTILS_PATH, PREPARE_PATH, SELECTOR_PATH) if p in blobs}
    if project is not None:
        want["pyproject.toml"] = project
    # Every file with nothing cached is scanned for its references as git streams its blob (git
    # inflates the next ones meanwhile); which of them get their blocks read is up to the closure.
    tree = _Tree(blobs, files.data, atom.cat_blobs)
    unread = tree.unread()
    order = [*want.values(), *(s for s in sorted(unread) if s not in want.values())]
    texts: dict[str, str] = {}
    for sha, data in atom.stream_blobs(list(dict.fromkeys(order))):
        for p in unread.get(sha, ()):
            tree.scanned[p] = _scan(data, p)
        for p, want_sha in want.items():
            if want_sha == sha:
                texts[p] = data.decode("utf-8", "replace")
    reach = closure(tree, texts, facts, atom_sha, tree_sha)
    reach = replace(reach, seconds=time.perf_counter() - t0)
    results.data[facts.key] = reach
    results.dirty = True
    results.save()
    if cache_dir is not None:  # one small file per ATOM tree: the newest trees' are kept
        prune_files(cache_dir, f"compat-reach-v{SUMMARY_SCHEMA}-*.pickle", REACH_TREES_KEPT)
    files.dirty = files.dirty or tree.dirty
    files.save()
    return reach


def closure(tree: _Tree, texts: dict[str, str], facts: ModelFacts, atom_sha: str, tree_sha: str) -> Reach:
    entry = tree.mods.get(ENTRY_POINT)
    if entry is None:
        raise ReachError(
            f"ATOM {atom_sha[:10]} has no {ENTRY_POINT.replace('.', '/')}.py: the server entry point moved.",
            hint="Update ENTRY_POINT in pipeline/compat/reach.py for this ATOM.",
        )
    entries = model_registry(texts.get(REGISTRY_PATH, ""))
    if not entries:
        raise ReachError(
            f"ATOM {atom_sha[:10]}: no architecture -> model dict indexed by `architectures[0]` in "
            f"{REGISTRY_PATH}; the model registry moved.",
            hint="Update REGISTRY_PATH in pipeline/compat/reach.py for this ATOM.",
        )
    if facts.architecture not in entries:
        raise ConfigError(
            f"architecture {facts.architecture!r} is not in ATOM {atom_sha[:10]}'s model registry "
            f"({REGISTRY_PATH}); it has: {', '.join(sorted(entries))}.",
            hint="Fix `model.architecture` in the recipe (the `architectures` of the model's config.json).",
        )
    qual, reg_line = entries[facts.architecture]
    model_path = tree.path_of(qual.replace(":", "."))
    if model_path is None:
        raise ReachError(
            f"ATOM {atom_sha[:10]}'s registry maps {facts.architecture} to {qual}, "
            "which is no module in the tree."
        )
    graph = _Graph(tree, entries)
    rules = _rules(texts, facts)
    host = _host_entries(tree, texts.get("pyproject.toml", ""))
    while True:
        exclusions: dict[int, str | None] = {}  # per edge, while the rules stay the same
        walk = _Walk(graph, tree, rules, facts, model_path, host, exclusions=exclusions)
        walk.run([model_path, entry])
        # `standalone` holds only while no file on the path switches ATOM into plugin mode.
        switch = sorted(p for p in walk.parents if p in tree.blobs and tree.summary(p).sets_framework)
        if "standalone" in rules and switch:
            del rules["standalone"]
            rules["standalone-dropped"] = f"{switch[0]} (on the path) switches ATOM into plugin mode"
            continue
        break
    walk.unreached_plugin_code()
    parents, excluded, followed = dict(walk.parents), walk.excluded, walk.followed
    # The same walk through unconditional edges only: what is left is reached only under an `if`,
    # except a file reached through both branches of one `if ...:`/`else:` (it runs either way).
    roots = [model_path, entry]
    while True:
        plain = _Walk(
            graph, tree, rules, facts, model_path, host, skip_conditional=True, exclusions=exclusions
        )
        plain.run(roots)
        conditional = _conditional_entries(walk, plain)
        either = sorted(p for p, es in conditional.items() if _both_branches(es))
        if not either:
            break
        roots += either
    # Chains without conditions where there are such chains.
    parents.update({p: e for p, e in plain.parents.items() if e is not None})
    # The result keeps edges without their raw context (smaller to cache).
    bare: dict[int, Edge] = {}

    def strip(e: Edge) -> Edge:
        got = bare.get(id(e))
        if got is None:
            conds = e.raw.conditions if e.raw is not None else ()
            got = bare[id(e)] = Edge(e.src, e.dst, e.line, e.kind, e.key, conditions=conds)
        return got

    # Evidence is needed for the files off the path only: who imports them (any file of the tree;
    # one the walk never reached is read without its blocks, which the evidence does not use).
    importers: dict[str, list[Edge]] = {}
    for p in tree.blobs:
        es = graph.built(p)
        if es is not None:
            for e in es:
                if e.dst != p and e.dst not in parents:
                    importers.setdefault(e.dst, []).append(Edge(p, e.dst, e.line, e.kind, e.key))
            continue
        for r in tree.refs(p).edges:
            for dst, kind, key in tree.targets(p, entries, r):
                if dst != p and dst not in parents:
                    importers.setdefault(dst, []).append(Edge(p, dst, r.line, kind, key))
    parents = {p: (strip(e) if e is not None else None) for p, e in parents.items()}
    excluded = [Excluded(strip(x.edge), x.rule) for x in excluded]
    return Reach(
        atom_sha=atom_sha,
        tree_sha=tree_sha,
        facts=facts,
        model_module=model_path,
        registry_line=reg_line,
        parents=parents,
        importers={k: tuple(v) for k, v in importers.items()},
        excluded=tuple(excluded),
        followed=followed,
        rules=rules,
        files=frozenset(tree.blobs),
        conditional={p: tuple(strip(e) for e in es) for p, es in conditional.items()},
    )


def _both_branches(entries: Iterable[Edge]) -> bool:
    """Do two ways in differ only in the branch of one `if C:` they take (`if C` / `else of if C`)?"""
    ways = {(e.src, e.raw.conditions if e.raw is not None else e.conditions) for e in entries}
    for src, conds in ways:
        if not conds or not conds[-1][0].startswith("if "):
            continue
        text, line = conds[-1]
        if any(
            src2 == src and c2[:-1] == conds[:-1] and c2[-1][0] == f"else of {text}" and c2[-1][1] > line
            for src2, c2 in ways
            if c2
        ):
            return True
    return False


def _conditional_entries(walk: _Walk, plain: _Walk) -> dict[str, list[Edge]]:
    """{file reached only conditionally: the conditional edges out of the unconditional part of
    the path (the files `plain` reached) that lead to it, through files reached only so}."""
    region = {p for p in walk.parents if p not in plain.parents}
    if not region:
        return {}

    def runs(e: Edge, by: _Walk) -> bool:
        if _exclusion(e, walk.rules, walk.facts, walk.model_path) is not None:
            return False
        owner = e.raw.owner if e.raw is not None else ""
        return not (by.is_plugin(e.src) and owner and owner not in by.live.get(e.src, set()))

    below: dict[str, set[str]] = {}  # region file -> the region files it leads to

    def leads_to(start: str) -> set[str]:
        got = below.get(start)
        if got is None:
            got, todo = {start}, [start]
            while todo:
                for e in walk.graph.get(todo.pop(), ()):
                    if e.dst in region and e.dst not in got and runs(e, walk):
                        got.add(e.dst)
                        todo.append(e.dst)
            below[start] = got
        return got

    out: dict[str, list[Edge]] = {}
    for src in plain.parents:
        for e in walk.graph.get(src, ()):
            if e.dst in region and e.raw is not None and e.raw.conditions and runs(e, plain):
                for p in sorted(leads_to(e.dst)):
                    out.setdefault(p, []).append(e)
    return out


def _host_entries(tree: _Tree, pyproject: str) -> dict[str, set[str]]:
    """{plugin file: top-level functions only a host framework runs}: the `vllm.*`/`sglang.*`
    entry points of ATOM's pyproject.toml, and those that switch ATOM into plugin mode."""
    out: dict[str, set[str]] = {}
    try:
        eps = tomllib.loads(pyproject).get("project", {}).get("entry-points", {})
    except tomllib.TOMLDecodeError:
        eps = {}
    for group, items in eps.items():
        if not group.startswith(("vllm.", "sglang.")) or not isinstance(items, dict):
            continue
        for ref in items.values():
            mod, _, fn = str(ref).partition(":")
            p = tree.mods.get(mod)
            if p is not None and fn:
                out.setdefault(p, set()).add(fn.split(".")[0])
    for path in tree.blobs:
        if path.startswith(PLUGIN_PACKAGE):
            owners = tree.switch_owners(path)
            if owners:
                out.setdefault(path, set()).update(o for o in owners if o)
    return out


class _Walk:
    """Breadth-first closure.

    Under `standalone`, a file in atom/plugin/ runs its import-time code, and only
    those of its top-level functions, classes and literal tables that code on the
    path names (imports by name, or mentions); a host framework's entry points never.
    """

    def __init__(
        self,
        graph: _Graph,
        tree: _Tree,
        rules: dict[str, str],
        facts: ModelFacts,
        model_path: str,
        entries: dict[str, set[str]],
        *,
        skip_conditional: bool = False,
        exclusions: dict[int, str | None] | None = None,
    ) -> None:
        self.graph, self.tree, self.rules, self.facts = graph, tree, rules, facts
        self.skip_conditional = skip_conditional
        self.exclusions = {} if exclusions is None else exclusions  # id(edge) -> rule or None
        self.model_path = model_path
        self.entries = entries
        self.plugin = "standalone" in rules
        self.parents: dict[str, Edge | None] = {}
        self.followed: dict[str, int] = {}
        self.excluded: list[Excluded] = []
        self.live: dict[str, set[str]] = {}  # plugin file -> top-level owners whose code runs
        self.queue: deque[tuple[str, str | None]] = deque()
        self._by_owner: dict[str, dict[str, list[Edge]]] = {}
        self._imported: dict[str, dict[str, list[str]]] = {}
        self._refs: dict[str, dict[str, frozenset[str]]] = {}

    def is_plugin(self, path: str) -> bool:
        return self.plugin and path.startswith(PLUGIN_PACKAGE)

    def run(self, roots: Sequence[str]) -> None:
        for r in roots:
            self.reach(r, None)
        while self.queue:
            path, owner = self.queue.popleft()
            if not self.is_plugin(path):
                for e in self.graph.get(path, ()):
                    self.follow(e)
                continue
            for e in self.owner_edges(path).get(owner or "", ()):
                self.follow(e)
            refs = self.refs(path)
            # Import-time code; a literal table's names count once the table is named (data, not calls).
            self.mention(path, refs.get(owner or "", frozenset()))

    def refs(self, path: str) -> dict[str, frozenset[str]]:
        got = self._refs.get(path)
        if got is None:
            got = dict(self.tree.summary(path).refs)
            self._refs[path] = got
        return got

    def reach(self, path: str, via: Edge | None) -> None:
        if path not in self.parents:
            self.parents[path] = via
            self.queue.append((path, None))
            for owner in self.live.get(path, set()):
                self.queue.append((path, owner))

    def mention(self, path: str, names: Iterable[str]) -> None:
        """`names` are used by code of `path` that runs: their definitions and imports run too."""
        refs = self.refs(path)
        imported = self._imports_of(path)
        for n in sorted(names):  # a set: sorted, so the first chain found is the same every run
            if n in refs:
                self.make_live(path, n)
            for dst in imported.get(n, ()):
                self.make_live(dst, n)

    def make_live(self, path: str, owner: str) -> None:
        if not self.is_plugin(path) or not owner:
            return
        if owner in self.entries.get(path, ()):
            return  # a host framework's entry point: the standalone server never calls it
        got = self.live.setdefault(path, set())
        if owner in got:
            return
        got.add(owner)
        if path in self.parents:
            self.queue.append((path, owner))

    def follow(self, e: Edge) -> None:
        if self.skip_conditional and e.raw is not None and e.raw.conditions:
            return
        key = id(e)
        if key in self.exclusions:
            rule = self.exclusions[key]
        else:
            rule = self.exclusions[key] = _exclusion(e, self.rules, self.facts, self.model_path)
        if rule is not None:
            self.excluded.append(Excluded(e, rule))
            return
        self.followed[e.kind] = self.followed.get(e.kind, 0) + 1
        r = e.raw
        if self.is_plugin(e.dst) and e.kind != "package":
            if r is not None and r.kind != "string" and r.names and self.tree.mods.get(r.target) == e.dst:
                self.mention(e.dst, r.names)  # `from X import a, b`: a and b
            else:
                for owner in self.refs(e.dst):  # the module object escapes (import X, a qualname)
                    self.make_live(e.dst, owner)
        self.reach(e.dst, e)

    def owner_edges(self, path: str) -> dict[str, list[Edge]]:
        got = self._by_owner.get(path)
        if got is None:
            got = {}
            for e in self.graph.get(path, ()):
                got.setdefault(e.raw.owner if e.raw else "", []).append(e)
            self._by_owner[path] = got
        return got

    def _imports_of(self, path: str) -> dict[str, list[str]]:
        got = self._imported.get(path)
        if got is None:
            got = {}
            for e in self.graph.get(path, ()):
                if e.raw is not None and e.raw.names and self.tree.mods.get(e.raw.target) == e.dst:
                    for n in e.raw.names:
                        got.setdefault(n, []).append(e.dst)
            self._imported[path] = got
        return got

    def unreached_plugin_code(self) -> None:
        """Record the edges of plugin code that never runs, as excluded by `plugin-only`."""
        for path in self.parents:
            if not self.is_plugin(path):
                continue
            live = self.live.get(path, set())
            for owner, es in self.owner_edges(path).items():
                if owner and owner not in live:
                    self.excluded += [Excluded(e, "plugin-only") for e in es]


# -- applying it to a check --------------------------------------------------------


def apply_reach(report: CheckReport, reach: Reach) -> CheckReport:
    """Every finding tagged on-path/off-path; off-path errors become warnings carrying the evidence."""
    out: list[Finding] = []
    for f in report.findings:
        ev = reach.evidence(f.path)
        if reach.on_path(f.path):
            out.append(
                replace(f, reach="on-path", reach_evidence=ev, reach_conditions=reach.conditions(f.path))
            )
        elif f.severity == "error":
            out.append(
                replace(
                    f,
                    severity="warning",
                    reach="off-path",
                    reach_evidence=ev,
                    message=f"off {reach.facts.architecture}'s path ({ev}): {f.message}",
                )
            )
        else:
            out.append(replace(f, reach="off-path", reach_evidence=ev))
    return replace(report, findings=out)


@dataclass(frozen=True)
class WaiverNote:
    path: str
    function: str
    status: Literal["unnecessary", "unused", "condition-not-met"]
    message: str


def waiver_notes(report: CheckReport, unused: Sequence[object]) -> list[WaiverNote]:
    """Why each unused waiver matched no error: its call is off the path, the conditions it names
    no longer cover every way to the call, or there is no such call."""
    notes = []
    for w in unused:
        path, function = str(getattr(w, "path", "")), str(getattr(w, "function", ""))
        when = tuple(getattr(w, "when", ()) or ())
        hit = next((f for f in report.findings if f.path == path and f.function == function), None)
        if hit is not None and hit.reach == "off-path":
            msg = (
                f"recipe waiver for {function} in {path} is unnecessary: the call is off the model's path "
                f"({hit.reach_evidence}); remove it"
            )
            notes.append(WaiverNote(path, function, "unnecessary", msg))
        elif hit is not None and when and hit.severity == "error":
            open_ways = [w for w in hit.reach_conditions if not covers(when, [w])]
            how = (
                "unconditionally"
                if not hit.reach_conditions
                else "also under " + "; ".join(" and ".join(c) for c in open_ways)
            )
            msg = (
                f"recipe waiver for {function} in {path} holds only under {', '.join(when)}, but the "
                f"model reaches the call {how} ({hit.reach_evidence}): the error gates; review the waiver"
            )
            notes.append(WaiverNote(path, function, "condition-not-met", msg))
        else:
            msg = f"recipe waiver for {function} in {path} matches no finding: remove it"
            notes.append(WaiverNote(path, function, "unused", msg))
    return notes


@dataclass(frozen=True)
class ModelGate:
    """A check report as it gates one model: reach-tagged, waivers applied, with what to tell."""

    report: CheckReport
    reach: Reach | None
    waived: int
    off_path: int  # errors that are warnings because their call is off the model's path
    notes: tuple[WaiverNote, ...]
    warnings: tuple[str, ...]  # e.g. "no architecture in the recipe: every finding gates"


def gate_model(
    report: CheckReport,
    atom: GitRepo,
    recipe: object,
    *,
    cache_dir: Path | None = None,
    waivers: bool = True,
) -> ModelGate:
    """Tag each finding with the model's reach, make off-path errors warnings, then apply waivers.

    `recipe` is a `pipeline.recipes.recipe.Recipe` (duck-typed here: compat does not import recipes).
    """
    model = getattr(recipe, "model", None)
    arch = getattr(model, "architecture", None)
    warnings: list[str] = []
    reach = None
    before = len(report.errors)
    if arch:
        command = getattr(getattr(recipe, "server", None), "command", ())
        try:
            reach = compute_reach(
                atom, report.atom_sha, facts_from_command(arch, command), cache_dir=cache_dir
            )
        except ReachError as e:  # when unsure, everything is on the path
            warnings.append(f"reachability not computed ({e.message}): every finding gates")
        else:
            report = apply_reach(report, reach)
    else:
        warnings.append(
            f"recipe {getattr(recipe, 'name', '?')} states no model.architecture: reachability not "
            "computed, every finding gates"
        )
    off_path = before - len(report.errors)
    listed = tuple(getattr(getattr(recipe, "compat", None), "waive", ())) if waivers else ()
    report, unused = apply_waivers(report, listed)
    notes = tuple(waiver_notes(report, unused))
    return ModelGate(report, reach, len(listed) - len(unused), off_path, notes, tuple(warnings))
