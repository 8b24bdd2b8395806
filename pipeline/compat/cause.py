"""Name the aiter commit that broke a call, and say what the change does to it.

The history of the file defining the function is read with one
`git log --raw` (each commit with the blob SHA of that file), each distinct
blob is summarized once (cache keyed by blob SHA), and the walk goes from the
pinned commit back to the newest version under which the call is clean. The
commit after it in the file's history is the cause.
"""

from __future__ import annotations

import ast
import dataclasses
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import cast

from pipeline.compat import incremental
from pipeline.compat.aiterapi import (
    TORCH_OPS,
    ModSummary,
    Signature,
    op_signature,
    sig_from_def,
    summarize_module,
)
from pipeline.compat.bind import Binding, arg_desc, bind, show_param
from pipeline.compat.calls import RawCall
from pipeline.compat.pysource import WORD_BYTES, SummaryCache, _header_end, module_of
from pipeline.gitw import CommitInfo, GitRepo, GitSoon
from pipeline.pickling import by_fields


@by_fields
@dataclass(frozen=True, slots=True)
class FileVersion:
    commit: CommitInfo
    blob: str | None  # None: the file is absent after this commit


class FileLogs:
    """{path: versions newest first} of a first-parent log, kept as plain tuples and made into
    `FileVersion`s per path when asked: a night reads its 600 KB log to learn which files a few
    commits changed (`changes`), and the versions of a handful of files."""

    __slots__ = ("_built", "_commits", "_infos", "_paths")

    def __init__(
        self,
        paths: dict[str, tuple[tuple[str, str | None], ...]],  # path -> ((commit, blob after), ...)
        commits: dict[str, tuple[int, str, str]],  # commit -> (committer time, subject, author)
    ) -> None:
        self._paths = paths
        self._commits = commits
        self._built: dict[str, list[FileVersion]] = {}
        self._infos: dict[str, CommitInfo] = {}

    def __reduce__(self) -> tuple[object, ...]:
        return FileLogs, (self._paths, self._commits)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FileLogs) and (self._paths, self._commits) == (other._paths, other._commits)

    __hash__ = None  # type: ignore[assignment]

    def get(self, path: str) -> list[FileVersion]:
        """The file's versions, newest first ([] for a file the log does not name)."""
        got = self._built.get(path)
        if got is None:
            raw = self._paths.get(path)
            if raw is None:
                return []
            got = self._built[path] = [FileVersion(self._info(sha), blob) for sha, blob in raw]
        return got

    def _info(self, sha: str) -> CommitInfo:
        got = self._infos.get(sha)
        if got is None:
            ts, subject, author = self._commits[sha]
            got = self._infos[sha] = CommitInfo(sha, datetime.fromtimestamp(ts, tz=UTC), subject, author)
        return got

    def items(self) -> Iterator[tuple[str, list[FileVersion]]]:
        return ((path, self.get(path)) for path in self._paths)

    def changes(self, newer: Callable[[str], bool] | None = None) -> Iterator[tuple[str, str]]:
        """(path, commit) of every change, with no version made; with `newer`, of the changes by
        commits it accepts, each file's read only down to its first older change (newest first)."""
        for path, raw in self._paths.items():
            for sha, _ in raw:
                if newer is not None and not newer(sha):
                    break
                yield path, sha

    def over(self, older: FileLogs) -> FileLogs:
        """This log's commits (newer) on top of an older tip's log."""
        paths = dict(older._paths)
        for path, raw in self._paths.items():
            paths[path] = raw + older._paths.get(path, ())
        return FileLogs(paths, {**older._commits, **self._commits})


@dataclass(frozen=True, slots=True)
class Cause:
    commit: CommitInfo  # first aiter commit where the call is broken
    last_good: str | None  # its first parent: the last commit where the call was clean
    change: str  # "kv_cache_v inserted at position 15"
    effect: str  # what that does to this call
    old_sig: Signature | None
    new_sig: Signature | None
    shifted: bool = False  # positional arguments now land on other parameters

    def sentence(self) -> str:
        c = self.commit
        head = f'{self.change} by aiter {c.short} ({c.date.strftime("%Y-%m-%d")}, "{c.subject}")'
        return f"{head}: {self.effect}" if self.effect else head


class History:
    """File histories and signatures at each version, memoized for one run."""

    def __init__(
        self,
        repo: GitRepo,
        cache: SummaryCache,
        facts: SummaryCache | None = None,
        logs: Callable[[], SummaryCache] | None = None,
        soon: dict[str, GitSoon] | None = None,
    ) -> None:
        self.repo = repo
        self.soon = soon if soon is not None else {}  # git commands begun early, by key
        self.cache = cache
        self.facts = facts
        self.logs = logs  # the whole-history logs: big, so opened only when a check needs them
        self._logs: dict[tuple[str, str], list[FileVersion]] = {}
        self._parents: dict[str, str | None] = {}
        # One whole-history log of the tip serves every file of every commit on its first parents.
        self._all: FileLogs | None = None
        self._order: dict[str, int] = {}  # first-parent commit -> position (0: the tip)
        self._prefix = ""  # the whole-history log's (`use_first_parent`)

    def changed_by(self, sha: str) -> dict[str, str]:
        """{path: new blob} of the files under the history's prefix a first-parent commit changed
        (against its first parent): one `git diff-tree` per commit, kept with the git facts."""
        key = f"changed-by:{sha}:{self._prefix}"
        got: dict[str, str] | None = self.facts.data.get(key) if self.facts is not None else None
        if got is None:
            parent = self.parent(sha)
            got = {}
            if parent is not None:
                out = self.repo.git(
                    "diff-tree", "-r", "--no-renames", "--no-abbrev", parent, sha, "--", self._prefix
                )
                for path, blob in _raw_lines(out):
                    if blob is not None:
                        got[path] = blob
            if self.facts is not None:
                self.facts.data[key] = got
                self.facts.dirty = True
        return got

    def position(self, sha: str) -> int | None:
        """Place of a commit on the tip's first parents (0: the tip), when the whole log is in use."""
        return self._order.get(sha)

    def use_first_parent(self, tip: str, commits: list[tuple[int, str]], prefix: str) -> None:
        """Answer `file_log` for commits on `tip`'s first parents from one `git log --raw` of `prefix`."""
        if self._all is None:
            self._prefix = prefix
            self._all = self.first_parent_log(tip, prefix, {sha for _, sha in commits})
            self._order = {sha: i for i, (_, sha) in enumerate(commits)}

    def first_parent_changes(self, newer: Callable[[str], bool] | None = None) -> Iterator[tuple[str, str]]:
        """(path, commit) of each change to a file of the log `use_first_parent` read (`FileLogs.changes`)."""
        assert self._all is not None
        return self._all.changes(newer)

    def parent(self, sha: str) -> str | None:
        """First parent (known from the file logs read so far, else asked)."""
        if sha in self._parents:
            return self._parents[sha]
        p = self.repo.rev_parse(f"{sha}^1")
        self._parents[sha] = p
        return p

    def file_log(self, rev: str, path: str) -> list[FileVersion]:
        key = (rev, path)
        got = self._logs.get(key)
        if got is not None:
            return got
        if self._all is not None and rev in self._order:
            k = self._order[rev]
            got = [v for v in self._all.get(path) if self._order.get(v.commit.sha, -1) >= k]
            self._logs[key] = got
            return got
        fkey = f"log:{rev}:{path}"
        cached = self.facts.data.get(fkey) if self.facts is not None else None
        if cached is not None:
            versions_c: list[FileVersion] = cached[0]
            self._parents.update(cached[1])
            self._logs[key] = versions_c
            return versions_c
        versions: list[FileVersion] = []
        parents: dict[str, str | None] = {}
        for info, parent, changes in _raw_log_commits(self.repo.git(*self._log_args(rev, path))):
            parents[info.sha] = parent
            # the file's blob after the commit (its last raw line: the path is the only one logged)
            versions.append(FileVersion(info, changes[-1][1] if changes else None))
        self._logs[key] = versions
        self._parents.update(parents)
        if self.facts is not None:
            self.facts.data[fkey] = (versions, parents)
            self.facts.dirty = True
        return versions

    def summary(self, path: str, blob: str) -> ModSummary:
        mod = module_of(path) or path
        res = self.cache.get_many(self.repo, [(path, blob)], lambda b, p: summarize_module(b, p, mod))
        s: ModSummary = res[path]
        return s

    def sig_at(self, path: str, blob: str | None, name: str) -> Signature | None:
        if blob is None:
            return None
        if name.startswith(TORCH_OPS + "."):  # an op: the def it is registered from, as registered
            op = name[len(TORCH_OPS) + 1 :]
            summ = self.summary(path, blob)
            reg = summ.registered.get(op)
            found = summ.find_sig(".".join(reg) if reg else op)
            if found is None:
                return None
            return op_signature(op, found if found.op else dataclasses.replace(found, op="custom_op"))
        if "." in name:  # a method (`C().m`, `C.m`): read from the module summary
            return self.summary(path, blob).find_sig(name)
        key = f"sig:{blob}:{name}"
        if self.facts is not None and key in self.facts.data:
            got: Signature | None = self.facts.data[key]
            return got
        raw = self.cache.raw.get(blob)
        if raw is None:
            raw = next(iter(self.repo.read_blobs([blob])))[1]
        one = _one_def(raw, path, name)
        fast = one if isinstance(one, Signature) else None
        if one is False:  # not a plain single top-level def: summarize the module
            self.cache.raw[blob] = raw
            fast = self.summary(path, blob).find_sig(name)
        if self.facts is not None:
            self.facts.data[key] = fast
            self.facts.dirty = True
        return fast

    def _log_store(self) -> SummaryCache | None:
        return self.logs() if self.logs is not None else self.facts

    @staticmethod
    def _log_args(rev: str, prefix: str, since: str | None = None) -> tuple[str, ...]:
        return (
            "log", "--format=%x01%H%x00%P%x00%ct%x00%an%x00%s", "--raw", "--no-renames", "--no-abbrev",
            "--first-parent", "-m", rev, *([f"^{since}"] if since else []), "--", prefix,
        )  # fmt: skip

    def _log_base(self, rev: str, prefix: str) -> str | None:
        """The newest other tip whose whole log is kept (the last run's): this one may extend it."""
        store = self._log_store()
        if store is None:
            return None
        for key in incremental.newest(store.data, "all-logs:", f":{prefix}"):
            base = key[len("all-logs:") : -len(prefix) - 1]
            if base != rev:
                return base
        return None

    def start_first_parent_log(self, rev: str, prefix: str) -> None:
        """Begin the whole-history log now, unless cached: git reads it while the ATOM scan starts
        (only the commits since the last run's tip when its log is kept: see `first_parent_log`)."""
        fkey = f"all-logs:{rev}:{prefix}"
        store = self._log_store()
        if fkey in self.soon or (store is not None and fkey in store.data):
            return
        base = self._log_base(rev, prefix)
        if base is not None:
            self.soon[f"{fkey}:since:{base}"] = self.repo.soon(*self._log_args(rev, prefix, base))
        else:
            self.soon[fkey] = self.repo.soon(*self._log_args(rev, prefix))

    def first_parent_log(self, rev: str, prefix: str, chain: set[str] | None = None) -> FileLogs:
        """Every file's versions under `prefix` along `rev`'s first parents: one `git log --raw`.

        When the log of an older tip on these first parents is kept (`chain`: the first
        parents, when the caller knows them), only the commits since are read.
        """
        fkey = f"all-logs:{rev}:{prefix}"
        store = self._log_store()
        cached = stored_log(store, rev, prefix) if store is not None else None
        if cached is not None:
            self._parents.update(cached[1])
            return cached[0]
        base = self._log_base(rev, prefix)
        ahead = self.soon.pop(f"{fkey}:since:{base}", None) if base is not None else None
        on_chain = base is not None and (
            base in chain
            if chain is not None
            else incremental.first_parents_since(self.repo, rev, base) is not None
        )
        older = None
        if store is not None and base is not None and on_chain:
            older = stored_log(store, base, prefix)
        entry: tuple[object, ...]
        if older is not None:
            assert store is not None and base is not None
            new_logs, new_parents = _parse_raw_log(
                (ahead or self.repo.soon(*self._log_args(rev, prefix, base))).stdout()
            )
            logs, parents = _extended(older, new_logs, new_parents)
            # kept as the commits since `base` (a night's few), not the whole log written again
            whole = _chain_length(store, base, prefix) >= LOG_CHAIN_MAX
            entry = (logs, parents) if whole else (SINCE, base, new_logs, new_parents)
        else:
            if ahead is not None:
                ahead.cancel()
            logs, parents = _parse_raw_log(
                (self.soon.pop(fkey, None) or self.repo.soon(*self._log_args(rev, prefix))).stdout()
            )
            entry = (logs, parents)
        self._parents.update(parents)
        if store is not None:
            store.data[fkey] = entry
            _prune_logs(store)
            store.dirty = True
        return logs


SINCE = "since"  # a kept log entry of the commits since an older tip's: (SINCE, tip, logs, parents)
LOG_CHAIN_MAX = 16  # such entries over one whole log, before a whole log is written again

Logs = tuple[FileLogs, dict[str, str | None]]


def stored_log(store: SummaryCache, rev: str, prefix: str) -> Logs | None:
    """The whole first-parent log kept for `rev`: its entry, or the entries of the commits since
    an older tip over that tip's (a night writes only its own commits: the whole log is 600 KB)."""
    got = store.data.get(f"all-logs:{rev}:{prefix}")
    if got is None or len(got) == 2:
        return cast("Logs | None", got)
    _, base, new_logs, new_parents = got
    older = stored_log(store, base, prefix)
    return None if older is None else _extended(older, new_logs, new_parents)


def _extended(older: Logs, new_logs: FileLogs, new_parents: dict[str, str | None]) -> Logs:
    old_logs, old_parents = older
    return new_logs.over(old_logs), {**old_parents, **new_parents}


def _chain_length(store: SummaryCache, rev: str, prefix: str) -> int:
    n, got = 0, store.data.get(f"all-logs:{rev}:{prefix}")
    while got is not None and len(got) == 4:
        n, got = n + 1, store.data.get(f"all-logs:{got[1]}:{prefix}")
    return n


def _prune_logs(store: SummaryCache) -> None:
    """Keep the newest tips' logs (each run loads them all) and the entries theirs are kept over."""
    keep: set[str] = set()
    for key in incremental.newest(store.data, "all-logs:")[: incremental.KEEP_TIPS]:
        prefix = key[len("all-logs:") :].partition(":")[2]
        while key not in keep:
            keep.add(key)
            got = store.data.get(key)
            if got is None or len(got) == 2:
                break
            key = f"all-logs:{got[1]}:{prefix}"
    for key in incremental.newest(store.data, "all-logs:"):
        if key not in keep:
            del store.data[key]


def _parse_raw_log(out: str) -> Logs:
    """{path: versions newest first} of the Python files, and {commit: first parent}, of a
    `git log --raw` in `History._log_args`' format."""
    paths: dict[str, list[tuple[str, str | None]]] = {}
    commits: dict[str, tuple[int, str, str]] = {}
    parents: dict[str, str | None] = {}
    for sha, parent, ts, author, subject, changes in _raw_log_entries(out):
        parents[sha] = parent
        commits[sha] = (ts, subject, author)
        for fpath, blob in changes:
            if fpath.endswith(".py"):
                paths.setdefault(fpath, []).append((sha, blob))
    return FileLogs({p: tuple(v) for p, v in paths.items()}, commits), parents


def _raw_log_commits(out: str) -> Iterator[tuple[CommitInfo, str | None, list[tuple[str, str | None]]]]:
    """Each commit of a `git log --raw` in `History._log_args`' format, newest first: the commit, its
    first parent, and the (path, blob after it) of each raw line (blob None: the path is deleted)."""
    for sha, parent, ts, author, subject, changes in _raw_log_entries(out):
        yield CommitInfo(sha, datetime.fromtimestamp(ts, tz=UTC), subject, author), parent, changes


def _raw_log_entries(
    out: str,
) -> Iterator[tuple[str, str | None, int, str, str, list[tuple[str, str | None]]]]:
    """(commit, first parent, committer time, author, subject, raw changes) of each commit."""
    for chunk in out.split("\x01"):
        if not chunk.strip():
            continue
        header, _, rest = chunk.partition("\n")
        sha, par, ts, author, subject = header.split("\x00", 4)
        yield sha, (par.split()[0] if par.split() else None), int(ts), author, subject, list(_raw_lines(rest))


def _raw_lines(out: str) -> Iterator[tuple[str, str | None]]:
    """(path, blob after the change) of each `--raw` line (`git log --raw`, `git diff-tree -r`);
    blob None: the path is deleted."""
    for line in out.splitlines():
        if line.startswith(":") and "\t" in line:
            meta, _, fpath = line.partition("\t")
            blob = meta.split()[3]
            yield fpath, (None if set(blob) == {"0"} else blob)


_OP_WORDS = (b"compile_ops", b"torch_compile_guard", b"custom_op")


def _top_level_bindings(raw: bytes, nb: bytes) -> tuple[list[int], bool]:
    """(starts of the lines `def nb(` / `async def nb(` at column 0, whether `class nb` or `nb =` is too).

    A scan of the name's occurrences, not a regex: the history screen asks this
    for hundreds of names, which would recompile (and evict) a pattern each.
    """
    hits: list[int] = []
    other = False
    n = len(raw)
    at = raw.find(nb)
    while at >= 0:
        end = at + len(nb)
        line = raw.rfind(b"\n", 0, at) + 1
        head = raw[line:at]
        k = end
        while k < n and raw[k] in b" \t":
            k += 1
        nxt = raw[k : k + 1]
        words = head.split()
        if not head or (head[0] not in b" \t" and head[-1] in b" \t"):  # at column 0, a whole word
            if words in ([b"def"], [b"async", b"def"]) and nxt == b"(":
                hits.append(line)
            elif (words == [b"class"] and (end >= n or raw[end] not in WORD_BYTES)) or (
                not words and nxt == b"="
            ):
                other = True
        at = raw.find(nb, end)
    return hits, other


def _one_def(raw: bytes, path: str, name: str) -> Signature | bool | None:
    """The signature of the only top-level `def name(` in `raw`, parsed from its header alone.

    None: no such def (nor a class or assignment of that name); False: anything
    less plain (several bindings, a class), for which the caller parses the module.
    """
    nb = name.encode()
    if nb not in raw:
        return None
    hits, other = _top_level_bindings(raw, nb)
    if len(hits) != 1 or other:
        return False if hits or other else None
    start = hits[0]
    lines = raw[start:].split(b"\n", 200)
    j, col = _header_end(lines, 0)
    if j < 0:
        return False
    header = b"\n".join(lines[:j]) + b"\n" + lines[j][: col + 1] + b" ..."
    # The decorators directly above it (a compiled op's schema enforces its annotations).
    above = raw[max(0, start - 2000) : start].rsplit(b"\n\n", 1)[-1]
    compiled = any(k in above for k in _OP_WORDS)
    try:
        fn = ast.parse(header).body[0]
    except (SyntaxError, ValueError, IndexError):
        return False
    if not isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    line_no = raw[:start].count(b"\n") + 1
    sig = sig_from_def(fn, path, False)
    # (A wrapper of an op defined beside it is marked by the module summary the index reads; a
    # history version only needs the layout.)
    return Signature(sig.name, path, line_no, sig.params, compiled)


def find_cause(
    hist: History,
    rev: str,
    sig: Signature | None,
    path: str,
    name: str,
    call: RawCall,
    clean: Callable[[Signature], bool],
) -> Cause | None:
    """Walk the history of `path` back from `rev` to the newest version under which `call` is clean."""
    versions = hist.file_log(rev, path)
    newer: FileVersion | None = None
    newer_sig: Signature | None = sig
    for v in versions:
        s = hist.sig_at(path, v.blob, name)
        if s is not None and clean(s):
            if newer is None:
                return None  # clean at the pinned version: nothing to blame here
            parent = hist.parent(newer.commit.sha)
            change, effect = explain(s, newer_sig, call, name)
            shifted = newer_sig is not None and bool(shifted_args(s, newer_sig, call))
            return Cause(newer.commit, parent, change, effect, s, newer_sig, shifted)
        if s is None and newer is not None and newer_sig is not None:
            # Before this the function did not exist in this file: it was never clean here.
            return None
        newer, newer_sig = v, s
    return None


# ---------------------------------------------------------------------------
# Explaining a signature change


def param_map(old: Signature, new: Signature) -> dict[str, str]:
    """Old parameter name -> the same slot's name in `new` (same name, or renamed in place)."""
    o = [p.name for p in old.params]
    n = [p.name for p in new.params]
    out: dict[str, str] = {}
    import difflib  # (a shift's explanation only: not on a plain check's start-up)

    sm = difflib.SequenceMatcher(a=o, b=n, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            out.update({o[i1 + k]: n[j1 + k] for k in range(i2 - i1)})
        elif tag == "replace":
            olds = [x for x in o[i1:i2] if x not in n]
            news = [x for x in n[j1:j2] if x not in o]
            out.update(dict(zip(olds, news, strict=False)))
    for name in o:
        if name in n:
            out[name] = name  # moved, not renamed
    return out


def shifted_args(old: Signature, new: Signature, call: RawCall) -> list[int]:
    """1-based positions of the positional arguments that land elsewhere than written for `old`."""
    ob, nb = bind(call, old), bind(call, new)
    pm = param_map(old, new)
    shifted = [
        i
        for i, (op, np_) in enumerate(zip(ob.positional, nb.positional, strict=True), 1)
        if np_ is not None and (pm.get(op.name) if op else None) != np_.name
    ]  # an argument with no slot any more is a too-many-positional error, not a shift
    if shifted and _benign(call, ob, nb, pm, new, shifted):
        return []
    return shifted


def _benign(
    call: RawCall, ob: Binding, nb: Binding, pm: dict[str, str], new: Signature, shifted: list[int]
) -> bool:
    """Only `None` literals moved, between parameters that all default to None: nothing changes."""
    by_name = {p.name: p for p in new.params}
    filled: dict[str, str | None] = {}  # new param -> evident type of what fills it now
    for a, p in zip(call.args, nb.positional, strict=True):
        if p is not None:
            filled[p.name] = a.etype
    for name, a in call.kwargs:
        filled[name] = a.etype
    for i in shifted:
        a, op, np_ = call.args[i - 1], ob.positional[i - 1], nb.positional[i - 1]
        if a.etype != "None" or np_ is None or not np_.default_none:
            return False
        intended = by_name.get(pm.get(op.name, "")) if op else None
        if intended is not None and not (
            intended.default_none and filled.get(intended.name, "None") == "None"
        ):
            return False
    return True


def describe_changes(old: Signature, new: Signature) -> list[tuple[str, int | None]]:
    """Human phrases for what changed, each with the 1-based position it starts at."""
    o = [p.name for p in old.params]
    n = [p.name for p in new.params]
    out: list[tuple[str, int | None]] = []
    import difflib

    sm = difflib.SequenceMatcher(a=o, b=n, autojunk=False)
    for tag, i1, i2, j1, j2 in sm.get_opcodes():
        if tag == "equal":
            continue
        olds, news = o[i1:i2], n[j1:j2]
        moved_in = [x for x in news if x in o]
        moved_out = [x for x in olds if x in n]
        olds = [x for x in olds if x not in n]
        news_only = [x for x in news if x not in o]
        k = 0
        if tag == "replace":
            for a, b in zip(olds, news_only, strict=False):
                pos = n.index(b) + 1
                out.append((f"`{a}` renamed to `{b}` (position {pos})", pos))
                k += 1
        for b in news_only[k:]:
            pos = n.index(b) + 1
            out.append((f"`{b}` inserted at position {pos}", pos))
        for a in olds[k:]:
            pos = o.index(a) + 1
            out.append((f"`{a}` removed (was position {pos})", pos))
        for x in sorted(set(moved_in) | set(moved_out), key=n.index):  # (a set's order varies per run)
            out.append((f"`{x}` moved from position {o.index(x) + 1} to {n.index(x) + 1}", n.index(x) + 1))
    old_by = {p.name: p for p in old.params}
    for p in new.params:
        q = old_by.get(p.name)
        if q is None:
            continue
        pos = n.index(p.name) + 1
        if q.has_default and not p.has_default:
            out.append((f"`{p.name}` made required", pos))
        if q.kind in ("pos", "posonly") and p.kind == "kwonly":
            out.append((f"`{p.name}` made keyword-only", pos))
        if q.kind == "pos" and p.kind == "posonly":
            out.append((f"`{p.name}` made positional-only", pos))
        if q.annotation != p.annotation and q.annotation and p.annotation:
            out.append((f"`{p.name}` retyped from `{show_param(q)}` to `{show_param(p)}`", pos))
    # dedupe, keep order
    seen: set[str] = set()
    uniq: list[tuple[str, int | None]] = []
    for phrase, where in out:
        if phrase not in seen:
            seen.add(phrase)
            uniq.append((phrase, where))
    return uniq


def explain(old: Signature, new: Signature | None, call: RawCall, name: str) -> tuple[str, str]:
    """(change, effect on this call)."""
    if new is None:
        return f"`{name}` removed", "this call now fails with AttributeError/ImportError"
    changes = describe_changes(old, new)
    nargs = len(call.args)
    kw = {k for k, _ in call.kwargs}
    # Changes that reach this call: inside its positional range or a keyword it uses.
    relevant = [
        (c, pos) for c, pos in changes
        if (pos is not None and pos <= max(nargs, 1)) or any(f"`{k}`" in c for k in kw) or "required" in c
    ]  # fmt: skip
    shifting = [c for c, _ in relevant if "inserted" in c or "removed" in c or "moved" in c]
    headline_list = shifting or [c for c, _ in relevant] or [c for c, _ in changes] or ["signature changed"]
    change = "; ".join(_strip_ticks_first(headline_list))
    ob, nb = bind(call, old), bind(call, new)
    effect_parts: list[str] = []
    shifted = _shift_range(ob, nb, new)
    if shifted:
        lo, hi, delta = shifted
        rng = f"{lo}–{hi}" if hi > lo else f"{lo}"
        plural = "s" if hi > lo else ""
        if delta is None:
            effect_parts.append(
                f"positional argument{plural} {rng} of this call now "
                f"{'bind' if plural else 'binds'} to different parameters"
            )
        else:
            words = {1: "one", 2: "two", 3: "three", 4: "four"}
            count = words.get(abs(delta), str(abs(delta)))
            how = f"{count} slot{'s' if abs(delta) != 1 else ''} {'later' if delta > 0 else 'earlier'}"
            verb = "bind" if plural else "binds"
            effect_parts.append(f"positional argument{plural} {rng} of this call now {verb} {how}")
    for p in nb.problems:
        effect_parts.append(p.message)
    if not nb.problems:
        # Unknown types: name where each shifted argument now lands.
        pm = param_map(old, new)
        moved = [
            (i, a, op, np_)
            for i, (a, op, np_) in enumerate(zip(call.args, ob.positional, nb.positional, strict=True), 1)
            if (pm.get(op.name) if op else None) != (np_.name if np_ else None)
        ]
        for i, a, op, np_ in moved[:3]:
            effect_parts.append(
                f"{arg_desc(i, a)} written for `{op.name if op else '?'}` now lands on `{show_param(np_)}`"
            )
        if len(moved) > 3:
            effect_parts.append(f"and {len(moved) - 3} more")
    others = [c for c, _ in changes if c not in headline_list]
    text = "; ".join(effect_parts)
    if others:
        text += f" (also in that commit: {'; '.join(others[:4])})"
    return change, text


def _strip_ticks_first(items: list[str]) -> list[str]:
    # "`kv_cache_v` inserted at position 15" reads as "kv_cache_v inserted at position 15"
    out = []
    for s in items:
        if s.startswith("`"):
            end = s.find("`", 1)
            s = s[1:end] + s[end + 1 :]
        out.append(s)
    return out


def _shift_range(ob: Binding, nb: Binding, new: Signature) -> tuple[int, int, int | None] | None:
    """(first, last, delta) of positional arguments whose intended parameter now sits elsewhere.

    Argument i was written for the parameter it bound to under the old
    signature; if that parameter now sits at another position, the argument
    is shifted. delta (> 0: the parameter moved later) when uniform.
    """
    new_pos = {p.name: i for i, p in enumerate(x for x in new.params if x.kind in ("pos", "posonly"))}
    shifted: list[tuple[int, int]] = []
    for i, op in enumerate(ob.positional):
        if op is None or op.kind == "vararg":
            continue
        j = new_pos.get(op.name)
        if j is not None and j != i:
            shifted.append((i, j - i))
        elif j is None and nb.positional[i] is not None and nb.positional[i] is not op:
            continue
    if not shifted:
        return None
    lo, hi = shifted[0][0] + 1, shifted[-1][0] + 1
    deltas = {d for _, d in shifted}
    return lo, hi, deltas.pop() if len(deltas) == 1 else None
