"""Small file-system helpers shared by the stages.

- Reading: `read_text`/`read_bytes` are the one way a file a user names is read:
  bounded by size, regular files only (never `/dev/zero` or a pipe), and every
  way it can be unreadable (missing, a directory, not UTF-8, permission, a name
  too long) is one of our errors naming the file, never a traceback.
- Writing: `atomic_write_text` never leaves half a file, and the file gets
  the mode any other tool would give it (the umask for a new file, the old
  mode on a rewrite); `make_temp_dir` likewise for directories.
- Locking: `hold_lock` is the one cross-process lock (a `filelock.FileLock`
  with our wait message and exit 13).
"""

from __future__ import annotations

import errno
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pipeline.errors import PipelineError, RunLocked, UsageError

if TYPE_CHECKING:
    import filelock

# -- reading ---------------------------------------------------------------------------


def unreadable(path: Path, what: str, e: OSError | UnicodeDecodeError) -> str:
    """One sentence saying why `path` (a `what`: "lock file", "recipe", ...) cannot be read."""
    if isinstance(e, UnicodeDecodeError):
        return (
            f"{what} {path} is not UTF-8 text (byte {e.start} is {e.object[e.start : e.start + 1]!r}); "
            "it must be saved as UTF-8."
        )
    if isinstance(e, FileNotFoundError):
        return f"{what} {path} does not exist."
    if isinstance(e, IsADirectoryError):
        return f"{what} {path} is a directory, not a file."
    if isinstance(e, NotADirectoryError):
        return f"{what} {path} is not reachable: a part of its path is a file, not a directory."
    if isinstance(e, PermissionError):
        return f"{what} {path} cannot be read: permission denied."
    if e.errno == errno.ENAMETOOLONG:
        problem = path_problem(path) or "it is too long for the file system"
        return f"{what} path {shorten(str(path))} is too long for the file system: {problem}."
    return f"{what} {path} cannot be read: {e.strerror or e}."


#: The most a file given by a user (lock, recipe, series, patch, verdict, plan, configuration)
#: may hold: far above any real one, far below what would hurt a shared host.
MAX_USER_FILE = 16 << 20


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n} bytes"


def read_bytes(
    path: Path,
    *,
    what: str,
    error: type[PipelineError] = UsageError,
    hint: str | None = None,
    limit: int = MAX_USER_FILE,
    follow_symlinks: bool = True,
) -> bytes:
    """The bytes of the regular file `path`, at most `limit` of them, or `error` naming the file.

    A device, FIFO or socket (`/dev/zero`, a pipe) is refused before a byte is read, and a file
    over `limit` is refused by its size: nothing a user names can make us read without end.
    With `follow_symlinks=False` a symbolic link is refused too.
    """
    path = Path(path)
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)  # a FIFO must not block the open
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if e.errno == errno.ELOOP and not follow_symlinks and path.is_symlink():
            raise error(
                f"{what} {path} is a symbolic link; refused: it must be a regular file.", hint=hint
            ) from None
        raise error(unreadable(path, what, e), hint=hint) from None
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise error(unreadable(path, what, IsADirectoryError(errno.EISDIR, "")), hint=hint)
        if not stat.S_ISREG(st.st_mode):
            raise error(
                f"{what} {path} is not a regular file (a device, pipe or socket); refused.", hint=hint
            )
        if st.st_size > limit:
            raise error(
                f"{what} {path} is {_size(st.st_size)}, over the limit of {_size(limit)}; refused.",
                hint=hint,
            )
        chunks: list[bytes] = []
        got = 0
        while got <= limit:  # the file may grow while we read: never more than limit + 1
            chunk = os.read(fd, min(1 << 20, limit + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > limit:
            raise error(f"{what} {path} grew over the limit of {_size(limit)}; refused.", hint=hint)
        return b"".join(chunks)
    except OSError as e:
        raise error(unreadable(path, what, e), hint=hint) from None
    finally:
        os.close(fd)


def read_text(
    path: Path,
    *,
    what: str,
    error: type[PipelineError] = UsageError,
    hint: str | None = None,
    limit: int = MAX_USER_FILE,
    follow_symlinks: bool = True,
) -> str:
    """The UTF-8 text of `path` (bounded as `read_bytes`), or `error` naming the file and what is wrong."""
    data = read_bytes(path, what=what, error=error, hint=hint, limit=limit, follow_symlinks=follow_symlinks)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise error(unreadable(Path(path), what, e), hint=hint) from None


def path_problem(path: Path) -> str | None:
    """Why `path` cannot even be asked about (a name or path over the system's limit), else None."""
    text = str(path)
    try:
        max_name = os.pathconf("/", "PC_NAME_MAX")
        max_path = os.pathconf("/", "PC_PATH_MAX")
    except (OSError, ValueError):
        max_name, max_path = 255, 4096
    if len(os.fsencode(text)) >= max_path:
        return f"the path is {len(text)} characters long, over the system's limit of {max_path}"
    for part in Path(text).parts:
        size = len(os.fsencode(part))
        if size > max_name:
            return f"a name in it is {size} bytes long, over the system's limit of {max_name}"
    return None


def shorten(value: str, keep: int = 60) -> str:
    """`value` for a message: at most `keep` characters (its start and end), saying how long it was."""
    if len(value) <= keep:
        return repr(value)
    half = keep // 2
    return f"{value[:half]!r}…{value[-half:]!r} ({len(value)} characters)"


# -- writing ---------------------------------------------------------------------------


def _umask() -> int:
    try:  # thread-safe where available (Linux >= 4.7)
        for line in Path("/proc/self/status").read_text(encoding="ascii").splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def new_file_mode() -> int:
    """The mode `open(path, "w")` would give a new file here (0666 less the umask)."""
    return 0o666 & ~_umask()


def atomic_write_text(
    path: Path, text: str, *, what: str = "file", error: type[PipelineError] = UsageError
) -> None:
    """Write via a temp file in the same directory and `os.replace` (never half a file).

    A new file gets the umask's mode; a rewritten file keeps its mode (mkstemp alone would
    make every file 0600). A path that cannot be written (a directory, no permission, a name
    over the limit) is `error`, naming the file.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.is_dir():
            raise IsADirectoryError(errno.EISDIR, "Is a directory", str(path))
        try:
            mode = stat.S_IMODE(path.stat().st_mode)
        except FileNotFoundError:
            mode = new_file_mode()
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:40]}.", suffix=".tmp")
    except OSError as e:
        raise error(unwritable(path, what, e)) from None
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except OSError as e:
        Path(tmp).unlink(missing_ok=True)
        raise error(unwritable(path, what, e)) from None
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def unwritable(path: Path, what: str, e: OSError) -> str:
    if isinstance(e, IsADirectoryError):
        return f"cannot write {what} {path}: it is a directory."
    if e.errno == errno.ENAMETOOLONG:
        problem = path_problem(path) or "it is too long for the file system"
        return f"cannot write {what} {shorten(str(path))}: {problem}."
    if isinstance(e, PermissionError):
        return f"cannot write {what} {path}: permission denied."
    return f"cannot write {what} {path}: {e.strerror or e}."


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=True) + "\n")


def make_temp_dir(parent: Path, prefix: str, suffix: str = ".tmp") -> Path:
    """`tempfile.mkdtemp` in `parent`, with the mode `mkdir` would give (for dirs renamed into place)."""
    path = Path(tempfile.mkdtemp(prefix=prefix, suffix=suffix, dir=parent))
    path.chmod(0o777 & ~_umask())
    return path


def sha256_file(path: Path) -> str:
    import hashlib  # (OpenSSL's: loaded by the digests only, not by every import of this module)

    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def sha256_bytes(data: bytes) -> str:
    import hashlib

    return hashlib.sha256(data).hexdigest()


# -- locking ---------------------------------------------------------------------------


def acquire_lock(
    lock_file: Path,
    *,
    wait: float,
    busy: str,
    hint: str,
    on_wait: Callable[[], None] | None = None,
) -> filelock.BaseFileLock:
    """Take the cross-process lock `lock_file`, waiting up to `wait` seconds, else `RunLocked` (exit 13).

    `busy` says who holds it (the error's message); `on_wait` is called once when we have to wait.
    """
    import filelock  # not at import time: the CLI starts faster

    from pipeline.errors import disk_error

    lock = filelock.FileLock(str(lock_file))
    try:
        lock_file.parent.mkdir(parents=True, exist_ok=True)
        lock.acquire(timeout=0)
    except filelock.Timeout:  # (an OSError too: caught first)
        if on_wait is not None:
            on_wait()
        try:
            lock.acquire(timeout=wait)
        except filelock.Timeout:
            raise RunLocked(busy, hint=hint) from None
    except OSError as e:  # no room, read-only, a file where a directory should be: named, no traceback
        raise disk_error(e, "create") or UsageError(unwritable(lock_file, "lock file", e)) from None
    return lock


@contextmanager
def hold_lock(
    lock_file: Path,
    *,
    wait: float,
    busy: str,
    hint: str,
    on_wait: Callable[[], None] | None = None,
) -> Iterator[filelock.BaseFileLock]:
    lock = acquire_lock(lock_file, wait=wait, busy=busy, hint=hint, on_wait=on_wait)
    try:
        yield lock
    finally:
        lock.release()


def remove_held_lock(lock: filelock.BaseFileLock) -> None:
    """Delete a lock file we hold (before releasing it), when what it guarded is gone.

    Safe with filelock >= 4: a waiter that opened the old file notices it was unlinked and
    retries on the path.
    """
    Path(lock.lock_file).unlink(missing_ok=True)
