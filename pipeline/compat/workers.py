"""The check's worker processes: they parse ATOM's files and summarize aiter modules ahead.

Forked once per run (a search's many checks share them) and stopped by `Caches.close`; a
worker that cannot read a blob leaves it to the checker, which reports the error as its own.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import sys
from collections.abc import Callable, Iterator
from typing import Any

from pipeline.compat.aiterapi import ModSummary, module_from_path, summarize_module
from pipeline.compat.calls import FileCalls, scan_file, scan_file_since, worth_scanning
from pipeline.compat.pysource import OPS_AHEAD, SummaryCache, Tree, says_word
from pipeline.errors import SourceError
from pipeline.gitw import BlobReader, GitRepo

PARALLEL_MIN_FILES = 40  # fewer files to parse are parsed in the checker's process,
PARALLEL_MIN_BYTES = 256 << 10  # unless they are this big together (a night's changed model files)
RESCAN_MIN_BYTES = 64 << 10  # a night's files re-scanned since their last scan: a child of their own

Rescan = tuple[int, str, bytes, FileCalls | None]  # (k, path, source, the scan of an earlier version)


def _scan_item(item: tuple[int, str, bytes]) -> tuple[int, FileCalls]:
    k, path, data = item
    return k, scan_file(data, path)


class Workers:
    """The run's worker processes (forked on first use, stopped by `close`).

    They parse ATOM's files; in a search, which walks aiter's history on one core otherwise,
    they also summarize the modules an examined commit will read, ahead of its resolution:
    those the last examined commit read and that changed. A summary lands in the cache's
    `pending`, which `get_many` takes only once it is ready.
    """

    MIN = 3  # fewer modules than this are summarized where they are needed

    def __init__(self) -> None:
        self._pool: Any = None
        self._children: list[_Child] = []

    def _get(self) -> Any:
        if self._pool is None and (os.cpu_count() or 1) > 1:
            import multiprocessing  # (here: a nightly check rarely starts workers)

            try:
                ctx = multiprocessing.get_context("fork")  # no re-import: the workers start at once
            except ValueError:  # no fork on this platform: all is done in the checker's process
                return None
            self._pool = ctx.Pool(min(os.cpu_count() or 2, 4), initializer=_worker_init)
        return self._pool

    def scan(self, items: list[tuple[int, str, bytes]]) -> Iterator[tuple[int, FileCalls]] | None:
        """(k, calls) per `(k, path, source)` as the workers finish them; None: no workers."""
        pool = self._get()
        if pool is None:
            return None
        it: Iterator[tuple[int, FileCalls]] = pool.imap_unordered(_scan_item, items, chunksize=2)
        return it

    def rescan(self, jobs: list[Rescan]) -> Iterator[tuple[int, FileCalls]] | None:
        """(k, calls) per job: `scan_file_since` its earlier scan (`scan_file` without one), in one
        forked child while this process reads aiter and binds the calls of the files that did not
        change; None: one core, no fork, or too little to gain.

        Not the pool: a night re-scans a few files, and starting the pool (its module, its threads,
        its workers) costs what the child saves. The child inherits the earlier scans; only the
        new ones come back, pickled, when they are asked for. The jobs wait in a pipe, biggest
        first, each taken by whoever reads it: when this process asks for the results before the
        child is done, it re-scans the jobs left itself (on two cores neither waits long).
        """
        size = sum(len(j[2]) for j in jobs if worth_scanning(j[2]))
        if size < RESCAN_MIN_BYTES or (os.cpu_count() or 1) < 2:
            return None
        queue = _JobQueue.of(sorted(range(len(jobs)), key=lambda i: -len(jobs[i][2])))
        if queue is None:
            return None
        child = _Child.start(_rescan_taken, (jobs, queue))
        if child is None:
            queue.close()
            return None
        child.also_close.append(queue)
        self._children.append(child)
        return self._rescans(child, jobs, queue)

    def _rescans(
        self, child: _Child, jobs: list[Rescan], queue: _JobQueue
    ) -> Iterator[tuple[int, FileCalls]]:
        done: set[int] = set()
        if HELP:
            while (i := queue.take()) is not None:
                done.add(i)
                yield _rescan_one(jobs[i])
        queue.close()
        got: list[tuple[int, FileCalls]] | None = child.result()
        self._children.remove(child)
        if got is None:  # the child failed: here, where an error is reported as the checker's own
            got = [_rescan_one(j) for i, j in enumerate(jobs) if i not in done]
        yield from got

    def ahead(self, cache: SummaryCache, repo: GitRepo, tree: Tree, paths: set[str]) -> int:
        """Start summarizing `paths` as they are in `tree`, unless known or on their way; how many."""
        todo = sorted(
            (p, tree.blobs[p]) for p in paths
            if p in tree.blobs and f"{tree.blobs[p]}:{p}" not in cache.data
            and f"{tree.blobs[p]}:{p}" not in cache.pending
        )  # fmt: skip
        if len(todo) < self.MIN:
            return 0
        pool = self._get()
        if pool is None:
            return 0
        git_dir = repo.git_dir
        for path, sha in todo:  # (the workers read the blobs: this process goes on binding)
            args = (git_dir, sha, path, module_from_path(path))
            cache.pending[f"{sha}:{path}"] = pool.apply_async(_summarize_blob, args)
        return len(todo)

    def summaries(
        self,
        cache: SummaryCache,
        repo: GitRepo,
        todo: list[tuple[str, str]],
        ops: tuple[frozenset[str], list[str]] = (frozenset(), []),
    ) -> bool:
        """Summarize the `(path, blob)` modules `todo`, and say which of the op names `ops[0]` each
        blob of `ops[1]` names, in one forked child that reads them with a `cat-file` of its own.
        A summary lands in the cache's `pending`, taken by `get_many` when first read; the op
        mentions under `OPS_AHEAD`, taken by `ApiIndex` (each waits for the child: it has worked
        since; a child that failed leaves the work to the checker). A night's aiter modules that
        changed and that the last night read, and the changed files its op search reads: this
        process meanwhile reads the last night's verdicts and binds the unchanged calls."""
        todo = [(p, b) for p, b in todo if not cache.data.has(f"{b}:{p}") and f"{b}:{p}" not in cache.pending]
        if not ops[0]:
            ops = (frozenset(), [])
        if not (todo or ops[1]) or (os.cpu_count() or 1) < 2:
            return False
        child = _Child.start(_ahead_all, (repo.git_dir, todo, sorted(ops[0]), ops[1]))
        if child is None:
            return False
        self._children.append(child)
        got = _Ahead(self, child)
        for path, blob in todo:
            cache.pending[f"{blob}:{path}"] = _Pending(got, f"{blob}:{path}")
        if ops[1]:
            cache.pending[OPS_AHEAD] = _Pending(got, OPS_AHEAD)
        return True

    def close(self) -> None:
        for child in self._children:
            child.cancel()
        self._children.clear()
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.terminate()
            pool.join()


HELP = True  # the checker re-scans the jobs the child has not taken when it needs the results


def _rescan_one(job: Rescan) -> tuple[int, FileCalls]:
    k, path, data, before = job
    return k, scan_file(data, path) if before is None else scan_file_since(data, path, before)


def _rescan_taken(arg: tuple[list[Rescan], _JobQueue]) -> list[tuple[int, FileCalls]]:
    jobs, queue = arg
    out = []
    while (i := queue.take()) is not None:
        out.append(_rescan_one(jobs[i]))
    return out


class _JobQueue:
    """Job numbers in a pipe whose writing end is closed: a reader takes the next with one 4-byte
    read (the kernel hands each read whole to one reader), and finds none at the end."""

    def __init__(self, fd: int) -> None:
        self.fd: int | None = fd

    @classmethod
    def of(cls, order: list[int]) -> _JobQueue | None:
        data = b"".join(i.to_bytes(4, "little") for i in order)
        if len(data) > 4096:  # (written before anyone reads: it must fit the pipe at once)
            return None
        r, w = os.pipe()
        try:
            os.write(w, data)
        finally:
            os.close(w)
        return cls(r)

    def take(self) -> int | None:
        if self.fd is None:
            return None
        got = os.read(self.fd, 4)
        return int.from_bytes(got, "little") if len(got) == 4 else None

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def _ahead_all(job: tuple[str, list[tuple[str, str]], list[str], list[str]]) -> dict[str, Any]:
    git_dir, todo, names, blobs = job
    out: dict[str, Any] = {}
    for path, blob in todo:
        got = _summarize_blob(git_dir, blob, path, module_from_path(path))
        if got is not None:
            out[f"{blob}:{path}"] = got
    if blobs:
        words = [n.encode() for n in names]
        reader = _reader(git_dir)
        named: dict[str, frozenset[str]] = {}
        with contextlib.suppress(SourceError, OSError, ValueError):  # (else the checker reads them)
            for b in blobs:
                text = reader.read(b)
                named[b] = frozenset(n.decode() for n in words if says_word(text, n))
            out[OPS_AHEAD] = (frozenset(names), named)
    return out


class _Ahead:
    """A child's results, read once, when the first is asked for."""

    def __init__(self, workers: Workers, child: _Child) -> None:
        self._workers, self._child = workers, child
        self._got: dict[str, Any] | None = None

    def get(self, key: str) -> Any:
        if self._got is None:
            self._got = self._child.result() or {}
            with contextlib.suppress(ValueError):
                self._workers._children.remove(self._child)
        return self._got.get(key)


class _Pending:
    """One of a child's results, as `SummaryCache.pending` holds a worker's (`ready`, `get`)."""

    def __init__(self, of: _Ahead, key: str) -> None:
        self._of, self._key = of, key

    def ready(self) -> bool:
        return True  # (the child has worked on it since the night began: waiting costs less)

    def get(self) -> Any:
        return self._of.get(self._key)


class _Child:
    """One function run in a forked child; its result read back through a pipe, pickled."""

    def __init__(self, pid: int, fd: int) -> None:
        self.pid, self.fd = pid, fd
        self.reaped = False
        self.also_close: list[_JobQueue] = []  # closed with the child when it is cancelled

    @classmethod
    def start(cls, fn: Callable[[Any], object], arg: object) -> _Child | None:
        threading = sys.modules.get("threading")
        if not hasattr(os, "fork") or (threading is not None and threading.active_count() > 1):
            return None  # (a thread could hold a lock the child would wait on forever)
        r, w = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
            return None
        if pid == 0:  # the child: compute, write, and leave without the parent's exit work
            code = 1
            try:
                os.close(r)
                signal.signal(signal.SIGINT, signal.SIG_IGN)  # (the parent handles signals)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                data = memoryview(pickle.dumps(fn(arg), pickle.HIGHEST_PROTOCOL))
                while data:
                    data = data[os.write(w, data) :]
                code = 0
            finally:
                os._exit(code)
        os.close(w)
        return cls(pid, r)

    def result(self) -> Any:
        """The function's result; None when the child failed (the caller does the work itself)."""
        chunks = []
        try:
            while chunk := os.read(self.fd, 1 << 20):
                chunks.append(chunk)
        except BaseException:  # (interrupted: the child is not waited for)
            self.cancel()
            raise
        os.close(self.fd)
        status = os.waitpid(self.pid, 0)[1]
        self.reaped = True
        if status != 0:
            return None
        try:
            return pickle.loads(b"".join(chunks))  # (ours: written by the child just forked)
        except Exception:  # (a truncated result: as a failure)
            return None

    def cancel(self) -> None:
        if self.reaped:
            return
        self.reaped = True
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        for other in self.also_close:
            other.close()
        os.close(self.fd)
        os.waitpid(self.pid, 0)


_READERS: dict[str, BlobReader] = {}  # a worker's own `cat-file --batch` per repository


def _reader(git_dir: str) -> BlobReader:
    reader = _READERS.get(git_dir)
    if reader is None:
        reader = _READERS[git_dir] = BlobReader(git_dir)
    return reader


def _summarize_blob(git_dir: str, sha: str, path: str, module: str) -> ModSummary | None:
    """A module's summary, or None when this worker cannot read it (the checker then summarizes
    it itself, and reports whatever went wrong there, as an error of its own)."""
    reader = _reader(git_dir)
    try:
        data = reader.read(sha)
    except (SourceError, OSError, ValueError):
        _READERS.pop(git_dir, None)
        return None
    return summarize_module(data, path, module)


def _worker_init() -> None:
    # Workers inherit the CLI's handlers (SIGTERM -> KeyboardInterrupt); the parent handles signals.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
