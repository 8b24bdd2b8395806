"""What the check benchmarks share: whole-process measurement and the peers run beside us.

`measure(cmd)` runs one process and reports its wall time, its CPU time (its own and every
child it waited for: git, the scan workers) and its peak memory summed over the whole process
tree, sampled from /proc (a worker pool's RSS counts, not only the largest process).

The peer is `willitbreak` (PyPI), "reports only the changes that hit your call sites". It has no
local-path mode, but it reads a pre-filled cache: `<cache>/<package>-<version>/` holding the
package and a `.willitbreak-complete` marker. `git archive` of each aiter commit fills it, so it
runs on exactly the pair we check. griffe's breaking-change finder runs on the same two trees.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# Bare mirrors of ROCm/ATOM and ROCm/aiter, named by the environment (never a path of one machine).
ATOM_MIRROR = os.environ.get("ATOM_MIRROR", "")
AITER_MIRROR = os.environ.get("AITER_MIRROR", "")


def have_mirrors(*which: str) -> bool:
    """Are the named mirrors (default: both) set and present?"""
    return all(m and Path(m).is_dir() for m in (which or (ATOM_MIRROR, AITER_MIRROR)))


# Named in the issue, printed as a reference only (it needs torch installed to mean anything).
MYPY_REFERENCE_S = 15.0


@dataclass
class Run:
    wall_s: float
    cpu_s: float
    peak_mb: float
    code: int
    stdout: str
    stderr: str


def _tree_rss_kb(root: int) -> int:
    """RSS of `root` and all its descendants, from /proc. Sampled every 10 ms while the measured
    run shares the machine's two cores: only processes younger than the root are read (a pid
    above it), unless the pid counter wrapped since (then all): a read of every process's stat
    took ~10 % of a core from the run measured."""
    parents: dict[int, int] = {}
    rss: dict[int, int] = {}
    floor = root if _last_pid() >= root else 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) < floor:
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
            fields = stat[stat.rindex(b")") + 2 :].split()
            pid = int(entry)
            parents[pid] = int(fields[1])
            rss[pid] = int(fields[21]) * (os.sysconf("SC_PAGE_SIZE") // 1024)
        except (OSError, ValueError, IndexError):
            continue
    tree = {root}
    grew = True
    while grew:
        grew = False
        for pid, ppid in parents.items():
            if ppid in tree and pid not in tree:
                tree.add(pid)
                grew = True
    return sum(rss.get(p, 0) for p in tree)


def _last_pid() -> int:
    try:
        with open("/proc/sys/kernel/ns_last_pid", "rb") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 0  # (unknown: every process is read)


def measure(cmd: Sequence[str], env: Mapping[str, str] | None = None, cwd: Path | None = None) -> Run:
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        list(cmd), env=dict(env) if env is not None else None, cwd=cwd,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    peak = 0
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_rss_kb(proc.pid))
            done.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    readers = [
        threading.Thread(target=lambda: out_chunks.append(proc.stdout.read() if proc.stdout else b"")),
        threading.Thread(target=lambda: err_chunks.append(proc.stderr.read() if proc.stderr else b"")),
    ]
    for r in readers:
        r.start()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    done.set()
    sampler.join()
    for r in readers:
        r.join()
    proc.returncode = os.waitstatus_to_exitcode(status)
    return Run(
        wall, usage.ru_utime + usage.ru_stime, max(peak, usage.ru_maxrss) / 1024, proc.returncode,
        b"".join(out_chunks).decode(errors="replace"), b"".join(err_chunks).decode(errors="replace"),
    )  # fmt: skip


def cpu_steal() -> tuple[int, int]:
    """(steal, total) CPU ticks since boot, from /proc/stat: on a virtual machine, the time its host
    ran something else while this machine had work (a figure taken then is slower than this code)."""
    try:
        with open("/proc/stat") as f:
            ticks = [int(x) for x in f.readline().split()[1:]]
    except (OSError, ValueError):
        return 0, 0
    return (ticks[7] if len(ticks) > 7 else 0), sum(ticks)


def steal_since(start: tuple[int, int]) -> str:
    now = cpu_steal()
    total = now[1] - start[1]
    return f"{100 * (now[0] - start[0]) / total:.0f} %" if total > 0 else "unknown"


def bytecode_env(tmp: Path) -> dict[str, str]:
    """This machine sets PYTHONDONTWRITEBYTECODE; an installed tool has its bytecode compiled."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update(PYTHONPATH=str(ROOT), PYTHONPYCACHEPREFIX=str(tmp / "pycache"))
    return env


def interpreter_floor(env: Mapping[str, str]) -> tuple[float, float]:
    """(wall of `python -c pass`, wall of `python -S -c pass`): what no tool can go below here."""
    full = min(measure([sys.executable, "-c", "pass"], env).wall_s for _ in range(3))
    bare = min(measure([sys.executable, "-S", "-c", "pass"], env).wall_s for _ in range(3))
    return full, bare


def archive(repo: str, rev: str, subdir: str, dest: Path) -> None:
    """`git archive rev subdir` unpacked under dest (the mirrors stay read-only)."""
    data = subprocess.run(
        ["git", f"--git-dir={repo}", "archive", "--format=tar", rev, subdir],
        check=True, capture_output=True,
    ).stdout  # fmt: skip
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        tar.extractall(dest, filter="data")


@dataclass
class PeerResult:
    name: str
    wall_s: float | None
    sites: list[tuple[str, int]]  # (path, line) of each call site it reports
    note: str


def willitbreak(atom_rev: str, old_aiter: str, new_aiter: str, work: Path) -> PeerResult:
    """willitbreak on ATOM × (old aiter -> new aiter), fed from a pre-filled cache."""
    exe = shutil.which("willitbreak")
    if exe is None:
        return PeerResult("willitbreak", None, [], "not installed (`pip install willitbreak`)")
    cache = work / "wib-cache"
    for label, rev in (("old", old_aiter), ("new", new_aiter)):
        dest = cache / f"aiter-0+{label}{rev[:10]}"
        archive(AITER_MIRROR, rev, "aiter", dest)
        (dest / ".willitbreak-complete").write_text("git archive", encoding="utf-8")
    code = work / "atom-src"
    archive(ATOM_MIRROR, atom_rev, "atom", code)
    cmd = [
        exe, "aiter", "--from", f"0+old{old_aiter[:10]}", "--to", f"0+new{new_aiter[:10]}",
        "--cache", str(cache), "--json", str(code / "atom"),
    ]  # fmt: skip
    run = measure(cmd, cwd=code)
    try:
        payload = json.loads(run.stdout)
    except json.JSONDecodeError:
        return PeerResult("willitbreak", run.wall_s, [], f"exit {run.code}: {run.stderr.strip()[:300]}")
    sites: list[tuple[str, int]] = []
    for hit in _walk_hits(payload):
        path = str(hit.get("path") or hit.get("file") or "")
        line = hit.get("line") or hit.get("lineno")
        if path and isinstance(line, int):
            rel = path.split("atom-src/", 1)[-1]
            sites.append((rel, line))
    return PeerResult("willitbreak", run.wall_s, sorted(set(sites)), f"exit {run.code}")


def _walk_hits(node: object) -> list[dict[str, object]]:
    """Every dict in the JSON that names a file and a line (its call-site records)."""
    out: list[dict[str, object]] = []
    if isinstance(node, dict):
        if ("path" in node or "file" in node) and ("line" in node or "lineno" in node):
            out.append(node)
        for v in node.values():
            out.extend(_walk_hits(v))
    elif isinstance(node, list):
        for v in node:
            out.extend(_walk_hits(v))
    return out


def griffe_breakages(old_aiter: str, new_aiter: str, work: Path, function: str) -> PeerResult:
    """griffe's breaking changes between the two aiter trees (API only: it knows no call sites)."""
    try:
        import griffe
    except ImportError:
        return PeerResult("griffe", None, [], "not installed (`pip install griffe`)")
    roots = {}
    for label, rev in (("old", old_aiter), ("new", new_aiter)):
        roots[label] = work / f"griffe-{label}"
        archive(AITER_MIRROR, rev, "aiter", roots[label])
    t0 = time.perf_counter()
    try:
        old = griffe.load("aiter", search_paths=[str(roots["old"])], allow_inspection=False)
        new = griffe.load("aiter", search_paths=[str(roots["new"])], allow_inspection=False)
        found = list(griffe.find_breaking_changes(old, new))
    except Exception as e:  # a peer's failure is a printed result, not ours
        return PeerResult("griffe", time.perf_counter() - t0, [], f"failed: {type(e).__name__}: {e}")
    wall = time.perf_counter() - t0
    hits = [b for b in found if function in str(getattr(b.obj, "path", ""))]
    return PeerResult(
        "griffe", wall, [],
        f"{len(found)} API breakages in aiter, {len(hits)} on `{function}` "
        "(no call sites: it does not read ATOM)",
    )  # fmt: skip


def scratch(prefix: str) -> Path:
    return Path(tempfile.mkdtemp(prefix=prefix))
