"""Python sources read straight from git objects, summaries cached by blob SHA.

No checkout and no import: a tree is the `{path: blob sha}` map of a commit,
and each blob is parsed once (per machine) into a small, picklable summary.
The cache is a single file per kind of summary under the cache dir, keyed by
blob SHA plus a schema version, so a warm run only lists the trees. Each value
in it stays pickled until read (`LazyValues`): a nightly check, which reads a
part of it and adds a few entries, neither unpickles nor re-pickles the rest.
"""

from __future__ import annotations

import ast
import functools
import itertools
import os
import pickle
import re
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.gitw import GitRepo, GitSoon

try:  # hashlib loads OpenSSL (3 ms of every check's start-up); a file name needs no more than BLAKE2
    from _blake2 import blake2b as blake2b
except ImportError:  # pragma: no cover (not CPython)
    from hashlib import blake2b as blake2b

SCHEMA = 23  # bump when a summary's shape or its extraction rules change
# Past this size a summary pickle loses its oldest entries at the next save: a scheduled CI keeps
# one cache dir for months, and every warm run loads the whole file.
MAX_CACHE_BYTES = 64 << 20


@dataclass
class Tree:
    """The Python files of one commit: path -> blob SHA."""

    repo: GitRepo
    sha: str
    blobs: dict[str, str]

    @classmethod
    def load(cls, repo: GitRepo, sha: str, prefix: str = "", ahead: GitSoon | None = None) -> Tree:
        return cls(repo, sha, repo.blob_shas(sha, prefix=prefix, suffix=".py", ahead=ahead))


WORD_BYTES = frozenset(b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")  # `\w` in bytes


def words_at(text: bytes, name: bytes) -> Iterator[tuple[int, int]]:
    """(start, end) of each whole-word occurrence of `name` (a `\\b` on both sides, as in `re`)."""
    n = len(text)
    at = text.find(name)
    while at >= 0:
        end = at + len(name)
        if (at == 0 or text[at - 1] not in WORD_BYTES) and (end >= n or text[end] not in WORD_BYTES):
            yield at, end
        at = text.find(name, end)


def says_word(text: bytes, name: bytes) -> bool:
    """`name` occurs in `text` as a whole word."""
    return name in text and next(words_at(text, name), None) is not None


def parse_source(data: bytes, path: str) -> ast.Module | str:
    """An AST, or the syntax error text (an unparseable upstream file is a finding, not a crash)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # invalid escape sequences etc. in upstream code
            return ast.parse(data, filename=path)
    except (SyntaxError, ValueError) as e:
        line = getattr(e, "lineno", None)
        msg = getattr(e, "msg", None) or str(e)
        return f"line {line}: {msg}" if line else str(msg)


class _Packed:
    """A cache value as it was read from disk: unpickled when first asked for."""

    __slots__ = ("raw",)

    def __init__(self, raw: bytes) -> None:
        self.raw = raw


class LazyValues(dict[str, Any]):
    """A summary cache's `{key: value}`: each value stays pickled until read, and one that was only
    read is written back as the bytes it was read from. A nightly check reads a fraction of
    the entries and adds a few: it neither unpickles nor re-pickles the rest.

    Values are immutable facts keyed by what they depend on; a value changed in place without
    being set again is not saved (the next run only recomputes what it adds)."""

    def __init__(self, items: Any = ()) -> None:
        super().__init__(items)
        self.read_from: dict[str, bytes] = {}  # key -> the bytes its unchanged value was read from

    def _unpack(self, key: str) -> bool:
        """Unpickle the value of a present key; False when absent or stale (then dropped)."""
        v = dict.get(self, key, _ABSENT)
        if type(v) is not _Packed:
            return v is not _ABSENT
        try:
            value = pickle.loads(v.raw)
        except Exception:  # (written by other code: the run computes it again)
            dict.__delitem__(self, key)
            return False
        dict.__setitem__(self, key, value)
        self.read_from[key] = v.raw
        return True

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._unpack(key)

    def __getitem__(self, key: str) -> Any:
        if not self._unpack(key):
            raise KeyError(key)
        return dict.__getitem__(self, key)

    def __setitem__(self, key: str, value: Any) -> None:
        dict.__setitem__(self, key, value)
        self.read_from.pop(key, None)

    def __delitem__(self, key: str) -> None:
        dict.__delitem__(self, key)
        self.read_from.pop(key, None)

    def get(self, key: str, default: Any = None) -> Any:
        return dict.__getitem__(self, key) if self._unpack(key) else default

    def pop(self, key: str, *default: Any) -> Any:
        if key not in self:
            if default:
                return default[0]
            raise KeyError(key)
        v = self[key]
        del self[key]
        return v

    def setdefault(self, key: str, default: Any = None) -> Any:
        if key not in self:
            self[key] = default
        return self[key]

    def __iter__(self) -> Any:  # (not dict's: `dict(this)` and `{**this}` then read through __getitem__)
        return iter(list(dict.keys(self)))

    def keys(self) -> Any:  # (what `dict(this)` reads: only the values that unpickle)
        return [k for k in list(dict.keys(self)) if self._unpack(k)]

    def copy(self) -> dict[str, Any]:
        return dict(self.items())

    def has(self, key: str) -> bool:
        """Is `key` kept? Its value not unpickled (a stale one is found when it is read)."""
        return dict.__contains__(self, key)

    def touch(self, key: str) -> None:
        """Move an entry last (used recently: pruning keeps the newest), as it is."""
        v = dict.pop(self, key)
        dict.__setitem__(self, key, v)

    def items(self) -> Any:
        return [(k, dict.__getitem__(self, k)) for k in list(self) if self._unpack(k)]

    def values(self) -> Any:
        return [v for _, v in self.items()]

    def clear(self) -> None:
        dict.clear(self)
        self.read_from.clear()

    def packed(self) -> dict[str, bytes]:
        """Every entry as bytes: those read or never read as they were, the others pickled now."""
        out: dict[str, bytes] = {}
        for k, v in dict.items(self):
            if type(v) is _Packed:
                out[k] = v.raw
            else:
                was = self.read_from.get(k)
                out[k] = was if was is not None else pickle.dumps(v, protocol=pickle.HIGHEST_PROTOCOL)
        return out


LAZY_FORMAT = "lazy-values-1"  # the on-disk shape: (LAZY_FORMAT, {key: pickled value})
_ABSENT = object()


OPS_AHEAD = "op-mentions-ahead"  # `pending`'s key of a child's op mentions: (names, {blob: names named})


@dataclass
class SummaryCache:
    """`{blob sha: summary}` for one kind of summary, persisted as one pickle (read on first use;
    each value unpickled when first read: `LazyValues`)."""

    kind: str
    cache_dir: Path | None
    _data: LazyValues | None = None
    dirty: bool = False
    raw: dict[str, bytes] = field(default_factory=dict)  # blob sha -> bytes, this run only
    mentions: dict[tuple[str, str, str], bool] = field(default_factory=dict)  # (sha, path, name)
    resolved: dict[tuple[str, str], list[Any]] = field(default_factory=dict)  # shared resolutions
    recent: list[Any] = field(default_factory=list)  # the last indexes built over this cache (a run's)
    loaded_bytes: int = 0  # the pickle's size when it was read
    pending: dict[str, Any] = field(default_factory=dict)  # key -> a worker's summary to come (.get())
    from_workers: set[str] = field(default_factory=set)  # keys whose summary a worker made, this run

    @property
    def file(self) -> Path | None:
        return self.cache_dir / f"compat-{self.kind}-v{SCHEMA}.pickle" if self.cache_dir else None

    @property
    def data(self) -> LazyValues:
        if self._data is None:
            f = self.file
            self._data = _load_lazy(f)
            if self._data and f is not None:
                self.loaded_bytes = _size(f)
        return self._data

    @data.setter
    def data(self, value: dict[str, Any]) -> None:
        self._data = value if isinstance(value, LazyValues) else LazyValues(value)

    @classmethod
    def open(cls, kind: str, cache_dir: Path | None) -> SummaryCache:
        return cls(kind, cache_dir)

    def get_many(
        self,
        repo: GitRepo,
        pairs: Iterable[tuple[str, str]],
        summarize: Callable[[bytes, str], Any],
    ) -> dict[str, Any]:
        """{path: summary} for `(path, blob sha)` pairs, reading and parsing only cache misses.

        The key is blob SHA plus path: a summary depends on the module name
        (relative imports), so a moved file is summarized again.
        """
        out: dict[str, Any] = {}
        missing: dict[str, list[str]] = {}
        for path, sha in pairs:
            key = f"{sha}:{path}"
            got = self.data.get(key)
            if got is None and key in self.pending:  # summarized ahead by a worker (a search)
                ahead = self.pending.pop(key)
                got = ahead.get() if ahead.ready() else None  # (never waited for: summarized here)
                if got is not None:
                    self.data[key] = got
                    self.from_workers.add(key)
                    self.dirty = True
            if got is not None:
                self.data.touch(key)  # (moved last: used recently)
                out[path] = got
            else:
                missing.setdefault(sha, []).append(path)
        if missing:
            for sha, blob in repo.read_blobs(list(missing)):
                for path in missing[sha]:
                    s = summarize(blob, path)
                    self.data[f"{sha}:{path}"] = s
                    out[path] = s
            self.dirty = True
        return out

    def save(self) -> None:
        f = self.file
        if f is None or not self.dirty or self._data is None:
            return
        if self.loaded_bytes > MAX_CACHE_BYTES:
            self._prune()
        if _dump(f, (LAZY_FORMAT, self._data.packed())):
            self.dirty = False

    def _prune(self) -> None:
        """Keep the newest entries (a summary read by `get_many` counts as new), about half the cap."""
        data = self.data
        keep = max(1, int(len(data) * (MAX_CACHE_BYTES / 2) / self.loaded_bytes))
        for key in list(itertools.islice(data, len(data) - keep)):
            del data[key]
        self.loaded_bytes = 0


def _size(f: Path) -> int:
    try:
        return f.stat().st_size
    except OSError:
        return 0


def prune_files(directory: Path, pattern: str, keep: int) -> None:
    """Delete all but the `keep` newest files matching `pattern` (by modification time)."""
    try:
        files = sorted(directory.glob(pattern), key=lambda p: p.stat().st_mtime)
    except OSError:
        return  # (a file removed meanwhile by a concurrent run)
    for old in files[: max(0, len(files) - keep)]:
        old.unlink(missing_ok=True)


def _load(f: Path | None) -> dict[str, Any]:
    if f is None or not f.is_file():
        return {}
    try:
        with f.open("rb") as fh:
            loaded = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return {}  # a corrupt or stale cache is only a slower run
    return loaded if isinstance(loaded, dict) else {}


def _load_lazy(f: Path | None) -> LazyValues:
    """A summary cache file's entries, each left pickled (another format: empty, a slower run)."""
    if f is None or not f.is_file():
        return LazyValues()
    try:
        with f.open("rb") as fh:
            loaded = pickle.load(fh)
    except (OSError, pickle.UnpicklingError, EOFError, AttributeError, ImportError, TypeError, ValueError):
        return LazyValues()
    if not (isinstance(loaded, tuple) and len(loaded) == 2 and loaded[0] == LAZY_FORMAT):
        return LazyValues()
    entries = loaded[1]
    if not isinstance(entries, dict):
        return LazyValues()
    return LazyValues({k: _Packed(v) for k, v in entries.items() if isinstance(v, bytes)})


def _dump(f: Path, value: object) -> bool:
    """Write atomically (temp file + rename); False when the cache dir is not writable."""
    try:
        f.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=f.parent, prefix=f.name, suffix=".tmp")
    except OSError:
        return False
    try:
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, f)
    except OSError:
        Path(tmp).unlink(missing_ok=True)
        return False
    return True


class ReportStore:
    """Whole results, one small pickle per key: a warm run reads only the one it needs."""

    def __init__(self, kind: str, cache_dir: Path | None, keep: int = 256) -> None:
        self.dir = cache_dir / f"compat-{kind}-v{SCHEMA}" if cache_dir else None
        self.keep = keep

    def _file(self, key: str) -> Path | None:
        if self.dir is None:
            return None
        return self.dir / (blake2b(key.encode(), digest_size=16).hexdigest() + ".pickle")

    def get(self, key: str) -> Any:
        f = self._file(key)
        got = _load(f).get(key) if f is not None else None
        return got

    def put(self, key: str, value: object) -> None:
        f = self._file(key)
        if f is None or not _dump(f, {key: value}):
            return
        assert self.dir is not None
        prune_files(self.dir, "*.pickle", self.keep)


@functools.lru_cache(maxsize=65536)
def module_of(path: str) -> str | None:
    """Dotted module name of a repository path (`aiter/ops/x.py` -> `aiter.ops.x`)."""
    if not path.endswith(".py"):
        return None
    parts = path[:-3].split("/")
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if not parts or not all(p.isidentifier() for p in parts):
        return None
    return ".".join(parts)


def module_files(blobs: dict[str, str]) -> dict[str, str]:
    """{dotted module: path} for every importable file of a tree."""
    out: dict[str, str] = {}
    for path in blobs:
        m = module_of(path)
        if m is not None and (m not in out or path.endswith("__init__.py")):
            out[m] = path
    return out


def resolve_relative(module: str, is_package: bool, level: int, target: str | None) -> str | None:
    """Absolute module name of a `from ...target import` inside `module`."""
    if level == 0:
        return target
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    if level > 1:
        if level - 1 > len(base):
            return None
        base = base[: len(base) - (level - 1)]
    if target:
        base = [*base, *target.split(".")]
    return ".".join(base) if base else None


# A def header's tokens: strings (a triple quote first), a comment, brackets, ':'.
_HEADER_TOKEN = re.compile(rb"""'''|\"\"\"|"(?:[^"\\]|\\.)*"?|'(?:[^'\\]|\\.)*'?|#|[()\[\]{}:]""")
_DEF_RE = re.compile(rb"^([ \t]*)(?:async[ \t]+)?def[ \t]+\w+[ \t]*\(", re.M)


def def_spans(data: bytes) -> tuple[list[bytes], list[tuple[int, int, int, int]]] | None:
    """Lines, and for each function with a body block: (header line, ':' column, body start, body end).

    Line-based (fast): None when the text is too unusual (the caller then
    parses the full source). Nested functions are listed too, after their parent.
    """
    lines = data.split(b"\n")
    spans: list[tuple[int, int, int, int]] = []
    n = len(lines)
    for i in range(n):
        line = lines[i]
        if b"def" not in line:
            continue
        m = _DEF_RE.match(line)
        if not m:
            continue
        indent = len(m.group(1).expandtabs())
        j, end_col = _header_end(lines, i)
        if j < 0:
            return None
        header_last = lines[j]
        if header_last[end_col + 1 :].split(b"#", 1)[0].strip():
            continue  # one-line def
        b0 = k = j + 1
        in_str: bytes | None = None
        deeper = b" " * (indent + 1)  # a line starting so cannot end the body (most lines of it)
        while k < n:
            body = lines[k]
            if in_str is not None:
                if in_str in body and body.count(in_str) % 2 == 1:
                    in_str = None
                k += 1
                continue
            if not body.startswith(deeper):
                stripped = body.lstrip()
                if (
                    stripped
                    and not stripped.startswith(b"#")
                    and len(body[: len(body) - len(stripped)].expandtabs()) <= indent
                ):
                    break
            if b'"""' in body or b"'''" in body:
                for q in (b'"""', b"'''"):
                    if body.count(q) % 2 == 1:
                        in_str = q
                        break
            k += 1
        if in_str is not None:
            return None
        spans.append((j, end_col, b0, k))
    return lines, spans


def strip_bodies(
    data: bytes,
    keep: Callable[[bytes], bool] | None = None,
    spans: tuple[list[bytes], list[tuple[int, int, int, int]]] | None = None,
) -> bytes | None:
    """The source with function bodies replaced by `...`, line numbers unchanged.

    Parsing an API module only needs its top-level bindings and signatures;
    the bodies are most of the text. With `keep`, a body for which
    `keep(body text)` is true is kept whole (nested functions included).
    None when the text is too unusual for this line-based pass (the caller
    then parses the full source). `spans` reuses a `def_spans(data)` result.
    """
    got = spans if spans is not None else def_spans(data)
    if got is None:
        return None
    lines, defs = got
    out = list(lines)
    covered = -1  # bodies already decided (kept or stripped) up to this line
    for j, end_col, b0, k in defs:
        if j < covered:
            continue  # nested in a body handled already
        if keep is not None and keep(b"\n".join(lines[b0:k])):
            covered = k
            continue
        out[j] = lines[j][: end_col + 1] + b" ..."
        for x in range(b0, k):
            out[x] = b""
        covered = k
    return b"\n".join(out)


def _header_end(lines: list[bytes], i: int) -> tuple[int, int]:
    """(line index, column) of the ':' closing the def header starting at line i, or (-1, -1)."""
    # Fast path: no quote or comment in the header, brackets closing on a line ending with ':'.
    depth = 0
    j = i
    n = len(lines)
    while j < n:
        text = lines[j]
        if b"'" in text or b'"' in text or b"#" in text:
            break
        depth += text.count(b"(") + text.count(b"[") + text.count(b"{")
        depth -= text.count(b")") + text.count(b"]") + text.count(b"}")
        if depth == 0:
            stripped = text.rstrip()
            if stripped.endswith(b":"):
                return j, len(stripped) - 1
            break  # e.g. `def f(x): return x`: let the exact scan decide
        if depth < 0:
            break
        j += 1
    depth = 0
    for j in range(i, n):
        for m in _HEADER_TOKEN.finditer(lines[j]):  # strings end at the line's end, as Python's do
            tok = m.group()
            c = tok[:1]
            if c in b"\"'":
                if tok in (b'"""', b"'''"):
                    return -1, -1  # triple quotes in a header: give up
            elif c == b"#":
                break
            elif c in b"([{":
                depth += 1
            elif c in b")]}":
                depth -= 1
            elif depth == 0:  # ':'
                return j, m.start()
    return -1, -1
