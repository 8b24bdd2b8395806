"""The patch series as a model: `Patch` files with DEP-3 headers, a quilt `series`.

A patch file is a git-style mail (what `git format-patch` writes) whose header
block also carries the DEP-3 fields and ours:

    From: Release Engineering <rel-eng@example.com>
    Date: Thu, 25 Jun 2026 00:00:00 +0000
    Subject: minimax_m3: pass the split KV cache to fused_qknorm_idxrqknorm
    Origin: vendor
    Bug: https://github.com/ROCm/ATOM/issues/1350
    Forwarded: no
    Applied-Upstream: 03a3538243e8 (call sites rewritten upstream)
    Last-Update: 2026-06-25
    X-Atom-Range: d72060af8..03a353824
    X-Aiter-Requires: fused_qknorm_idxrqknorm has kv_cache_v
    X-Patch-Version: 1

    Long description (the commit message body).
    ---
     atom/models/minimax_m3.py | 9 +++++++--
    diff --git a/atom/models/minimax_m3.py b/atom/models/minimax_m3.py
    ...

Parsing is strict: every header line, hunk header and hunk line count is
checked, and errors name the file and line. Paths are checked too: a patch
that touches anything outside the repository (absolute, `..`, `.git/`, a
symlink pointing out) is refused here, before git sees it.
"""

from __future__ import annotations

import hashlib
import posixpath
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from email.utils import parseaddr
from pathlib import Path

from pipeline.errors import PatchError
from pipeline.fsutil import read_bytes, read_text

# -- header fields -----------------------------------------------------------

RANGE = "X-Atom-Range"
AITER_AFTER = "X-Aiter-After"
AITER_REQUIRES = "X-Aiter-Requires"
VERSION = "X-Patch-Version"

#: Our fields (the `X-` namespace is ours: an unknown `X-` field is a typo).
PIPELINE_FIELDS = (RANGE, AITER_AFTER, AITER_REQUIRES, VERSION)
#: DEP-3 fields (https://dep-team.pages.debian.net/deps/dep3/).
DEP3_FIELDS = (
    "Description",
    "Subject",
    "Origin",
    "Bug",
    "Forwarded",
    "Author",
    "From",
    "Reviewed-by",
    "Acked-by",
    "Last-Update",
    "Applied-Upstream",
)
#: Mail transport fields that carry nothing for the commit message.
MAIL_FIELDS = ("Date", "Message-Id", "MIME-Version", "Content-Type", "Content-Transfer-Encoding")

_FIELD = re.compile(r"^([A-Za-z][A-Za-z0-9-]*):(?:[ \t]+(.*))?$")
_MBOX_FROM = re.compile(r"^From [0-9a-f]{40} ")
_SHA = re.compile(r"^[0-9a-f]{7,40}$")
_RANGE = re.compile(r"^([0-9a-f]{7,40})\.\.([0-9a-f]{7,40})?$")
_REQUIRE = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*) (has|lacks) ([A-Za-z_][A-Za-z0-9_]*)$")
_HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@(.*)$")
_SUBJECT_TAG = re.compile(r"^(\[[^\]]*\]\s*)+")
_NAME = re.compile(r"^[0-9]{4}-[A-Za-z0-9][A-Za-z0-9._+-]*\.patch$")
_EXTENDED = (
    "old mode ",
    "new mode ",
    "deleted file mode ",
    "new file mode ",
    "similarity index ",
    "dissimilarity index ",
    "rename from ",
    "rename to ",
    "copy from ",
    "copy to ",
    "index ",
)


def _err(path: Path | str, line: int | None, msg: str, hint: str | None = None) -> PatchError:
    where = f"{path}:{line}" if line else f"{path}"
    return PatchError(
        f"{where}: {msg}", hint=hint or "Fix the patch file (or regenerate it with `pipeline patch export`)."
    )


# -- diff model ----------------------------------------------------------------


@dataclass(frozen=True)
class Hunk:
    header: str  # the `@@ -a,b +c,d @@ ...` line as written
    line: int  # its line number in the patch file
    old_start: int
    old_count: int
    new_start: int
    new_count: int
    lines: tuple[str, ...]  # the hunk body, as written

    @property
    def short(self) -> str:
        return f"@@ -{self.old_start},{self.old_count} +{self.new_start},{self.new_count} @@"


@dataclass(frozen=True)
class FileDiff:
    old_path: str | None  # None for a new file
    new_path: str | None  # None for a deleted file
    line: int  # line number of its `diff --git`
    head: tuple[str, ...]  # `diff --git` .. `+++` lines
    hunks: tuple[Hunk, ...]
    new_mode: str = ""

    @property
    def path(self) -> str:
        return self.new_path or self.old_path or ""

    def hunk_patch(self, hunk: Hunk) -> str:
        """A patch holding only this file header and one hunk (to find which hunks fail)."""
        return "\n".join((*self.head, hunk.header, *hunk.lines)) + "\n"


@dataclass(frozen=True)
class Requirement:
    """`F has P` / `F lacks P`: aiter's function F has (or lacks) a parameter P."""

    function: str
    verb: str  # has | lacks
    param: str

    def __str__(self) -> str:
        return f"{self.function} {self.verb} {self.param}"


@dataclass(frozen=True)
class AtomRange:
    """Applies to ATOM commits that contain `start` and do not contain `end`."""

    start: str
    end: str | None

    def __str__(self) -> str:
        return f"{self.start}..{self.end or ''}"


# -- a patch -------------------------------------------------------------------


@dataclass(frozen=True)
class Patch:
    path: Path
    name: str
    sha256: str  # of the file's bytes: what the lock records
    headers: tuple[tuple[str, str], ...]  # (field, value) in file order, continuations joined with "\n"
    body: str  # long description (commit message body)
    files: tuple[FileDiff, ...]
    strip: int = 1
    # The bytes parsed: the very bytes git is given (never the file re-read, which may have changed).
    data: bytes = field(default=b"", repr=False, compare=False)

    # -- fields ----------------------------------------------------------------
    def field(self, name: str) -> str | None:
        low = name.lower()
        for k, v in self.headers:
            if k.lower() == low:
                return v
        return None

    @property
    def subject(self) -> str:
        subject = self.field("Subject")
        if subject is not None:
            return _SUBJECT_TAG.sub("", " ".join(subject.split())).strip()
        # DEP-3 Description: the first line is the short description.
        return (self.field("Description") or "").split("\n")[0].strip()

    @property
    def author(self) -> tuple[str, str]:
        raw = self.field("From") or self.field("Author") or ""
        name, email = parseaddr(raw.replace("\n", " "))
        return (name or "atom-image-pipeline", email or "noreply@atom-image-pipeline.invalid")

    @property
    def date(self) -> str:
        """Author date for the commit (RFC 2822 or ISO, as git accepts)."""
        d = self.field("Date")
        if d:
            return " ".join(d.split())
        lu = self.field("Last-Update")
        return f"{lu}T00:00:00+0000" if lu else "1970-01-01T00:00:00+0000"

    @property
    def version(self) -> int:
        return int(self.field(VERSION) or "0")

    @property
    def atom_range(self) -> AtomRange:
        m = _RANGE.match(self.field(RANGE) or "")
        assert m is not None  # validated at parse time
        return AtomRange(m.group(1), m.group(2))

    @property
    def aiter_after(self) -> str | None:
        return self.field(AITER_AFTER)

    @property
    def aiter_requires(self) -> tuple[Requirement, ...]:
        raw = self.field(AITER_REQUIRES)
        if not raw:
            return ()
        out = []
        for part in raw.replace("\n", " ").split(";"):
            m = _REQUIRE.match(" ".join(part.split()))
            assert m is not None  # validated at parse time
            out.append(Requirement(m.group(1), m.group(2), m.group(3)))
        return tuple(out)

    @property
    def trailers(self) -> tuple[tuple[str, str], ...]:
        """The fields kept in the commit message (all but From/Date/Subject and mail transport)."""
        skip = {"from", "subject", *(f.lower() for f in MAIL_FIELDS)}
        return tuple((k, v) for k, v in self.headers if k.lower() not in skip)

    def commit_message(self) -> str:
        parts = [self.subject]
        if self.body:
            parts.append(self.body)
        if self.trailers:
            parts.append("\n".join(f"{k}: {v.replace(chr(10), chr(10) + ' ')}" for k, v in self.trailers))
        return "\n\n".join(parts) + "\n"

    @property
    def paths(self) -> tuple[str, ...]:
        seen: dict[str, None] = {}
        for f in self.files:
            for p in (f.old_path, f.new_path):
                if p:
                    seen[p] = None
        return tuple(seen)

    def summary(self) -> str:
        return f"{self.name} v{self.version}: {self.subject} [ATOM {self.atom_range}]"

    # -- parsing ---------------------------------------------------------------
    @classmethod
    def load(cls, path: Path, *, strip: int = 1) -> Patch:
        if not path.exists() and not path.is_symlink():
            raise _err(path, None, "patch file does not exist.", "Add it, or remove it from the series file.")
        # A symlink is refused: what is reviewed in patches/ is what is applied.
        data = read_bytes(path, what="patch file", error=PatchError, follow_symlinks=False)
        return cls.parse(data, path=path, strip=strip)

    @classmethod
    def parse(cls, data: bytes, *, path: Path, strip: int = 1) -> Patch:
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            line = data[: e.start].count(b"\n") + 1
            raise _err(path, line, "not UTF-8 text.") from e
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        headers, i = _parse_headers(lines, path)
        body_lines: list[str] = []
        while i < len(lines) and lines[i] != "---" and not lines[i].startswith("diff --git "):
            body_lines.append(lines[i])
            i += 1
        while i < len(lines) and not lines[i].startswith("diff --git "):
            i += 1  # the diffstat between `---` and the first diff
        if i >= len(lines):
            raise _err(path, None, "no `diff --git` section: not a git-style patch.")
        files = _parse_diff(lines, i, path)
        patch = cls(
            path=path,
            name=path.name,
            sha256=hashlib.sha256(data).hexdigest(),
            headers=tuple(headers),
            body="\n".join(body_lines).strip("\n"),
            files=files,
            strip=strip,
            data=data,
        )
        _validate_fields(patch, lines)
        return patch


def _parse_headers(lines: list[str], path: Path) -> tuple[list[tuple[str, str]], int]:
    headers: list[tuple[str, str]] = []
    i = 0
    if lines and _MBOX_FROM.match(lines[0]):
        i = 1
    seen: dict[str, int] = {}
    while i < len(lines) and lines[i] != "":
        line = lines[i]
        if line[:1] in (" ", "\t"):
            if not headers:
                raise _err(path, i + 1, f"continuation line before any header field: {line!r}.")
            k, v = headers[-1]
            headers[-1] = (k, f"{v}\n{line.strip()}")
        else:
            m = _FIELD.match(line)
            if not m:
                raise _err(path, i + 1, f"malformed header line {line!r}: expected `Field: value`.")
            key, value = m.group(1), (m.group(2) or "").strip()
            if key.lower() in seen:
                raise _err(path, i + 1, f"header field {key} repeated (first on line {seen[key.lower()]}).")
            if key.lower().startswith("x-") and key.lower() not in {f.lower() for f in PIPELINE_FIELDS}:
                raise _err(
                    path,
                    i + 1,
                    f"unknown pipeline field {key}: expected one of {', '.join(PIPELINE_FIELDS)}.",
                )
            seen[key.lower()] = i + 1
            headers.append((key, value))
        i += 1
    if not headers:
        raise _err(path, 1, "no header block: a patch starts with `Field: value` lines (DEP-3).")
    return headers, i + 1


def _validate_fields(patch: Patch, lines: list[str]) -> None:
    def line_of(field_name: str) -> int | None:
        pat = re.compile(rf"^{re.escape(field_name)}:", re.I)
        for n, line in enumerate(lines, 1):
            if pat.match(line):
                return n
            if line == "":
                break
        return None

    p = patch.path
    if not (patch.field("Subject") or patch.field("Description")):
        raise _err(p, 1, "missing Subject (or DEP-3 Description) field.")
    if not (patch.field("Origin") or patch.field("Author") or patch.field("From")):
        raise _err(p, 1, "missing Origin field (DEP-3: required unless Author/From is given).")
    for required in (RANGE, VERSION):
        if patch.field(required) is None:
            raise _err(p, 1, f"missing required field {required}.", _FIELD_HINT)
    rng = patch.field(RANGE) or ""
    if not _RANGE.match(rng):
        raise _err(
            p,
            line_of(RANGE),
            f"{RANGE} {rng!r} is not `START..END` or `START..` (hex commit ids).",
            _FIELD_HINT,
        )
    ver = patch.field(VERSION) or ""
    if not ver.isdigit() or int(ver) < 1:
        raise _err(p, line_of(VERSION), f"{VERSION} {ver!r} is not a positive integer.", _FIELD_HINT)
    after = patch.field(AITER_AFTER)
    if after is not None and not _SHA.match(after):
        raise _err(p, line_of(AITER_AFTER), f"{AITER_AFTER} {after!r} is not a hex commit id.", _FIELD_HINT)
    req = patch.field(AITER_REQUIRES)
    if req is not None:
        for part in req.replace("\n", " ").split(";"):
            if not _REQUIRE.match(" ".join(part.split())):
                raise _err(
                    p,
                    line_of(AITER_REQUIRES),
                    f"{AITER_REQUIRES} condition {part.strip()!r} is not `FUNCTION has|lacks PARAM`.",
                    _FIELD_HINT,
                )
    lu = patch.field("Last-Update")
    if lu is not None and not re.match(r"^\d{4}-\d{2}-\d{2}$", lu):
        raise _err(p, line_of("Last-Update"), f"Last-Update {lu!r} is not YYYY-MM-DD.")


_FIELD_HINT = (
    f"See docs/patches.md: {RANGE}: START..END (ATOM commits containing START but not END), "
    f"{VERSION}: N, optional {AITER_AFTER}: SHA and {AITER_REQUIRES}: FUNCTION has PARAM."
)


# -- diff parsing ----------------------------------------------------------------


def _parse_diff(lines: list[str], i: int, path: Path) -> tuple[FileDiff, ...]:
    files: list[FileDiff] = []
    n = len(lines)
    while i < n:
        line = lines[i]
        if line == "-- " and files:
            _refuse_diff_after_signature(lines, i, path)
            break  # format-patch signature (git version): the rest is not diff
        if not line.startswith("diff --git "):
            raise _err(path, i + 1, f"unexpected line {line!r}: expected `diff --git` or a hunk.")
        start = i
        a, b = _git_header_paths(line, path, i + 1)
        old_path: str | None = a
        new_path: str | None = b
        new_mode = ""
        i += 1
        while i < n and lines[i].startswith(_EXTENDED):
            ext = lines[i]
            if ext.startswith("new file mode "):
                old_path, new_mode = None, ext.split()[-1]
            elif ext.startswith("deleted file mode "):
                new_path = None
            elif ext.startswith("new mode "):
                new_mode = ext.split()[-1]
            elif ext.startswith(("rename from ", "copy from ")):
                old_path = _check_path(ext.split(" ", 2)[2], path, i + 1)
            elif ext.startswith(("rename to ", "copy to ")):
                new_path = _check_path(ext.split(" ", 2)[2], path, i + 1)
            i += 1
        if i < n and (lines[i].startswith("GIT binary patch") or lines[i].startswith("Binary files ")):
            raise _err(
                path, i + 1, "binary patches are not supported.", "Ship binary changes some other way."
            )
        hunks: list[Hunk] = []
        if i < n and lines[i].startswith("--- "):
            if i + 1 >= n or not lines[i + 1].startswith("+++ "):
                raise _err(path, i + 2, "`--- ` line not followed by a `+++ ` line.")
            for ln, prefix in ((i, "a/"), (i + 1, "b/")):
                name = lines[ln][4:].split("\t")[0]
                if name != "/dev/null":
                    if not name.startswith(prefix):
                        raise _err(path, ln + 1, f"path {name!r} lacks the `{prefix}` prefix (-p1).")
                    _check_path(name[2:], path, ln + 1)
            i += 2
            head = tuple(lines[start:i])
            while i < n and lines[i].startswith("@@"):
                hunk, i = _parse_hunk(lines, i, path)
                hunks.append(hunk)
            if not hunks:
                raise _err(path, i + 1, "file header without any hunk.")
        else:
            head = tuple(lines[start:i])
        if new_mode == "120000":
            _check_symlink(new_path or "", hunks, path, start + 1)
        files.append(FileDiff(old_path, new_path, start + 1, head, tuple(hunks), new_mode))
        if i < n and lines[i] and not lines[i].startswith("diff --git ") and lines[i] != "-- ":
            if _HUNK.match(lines[i]) is None and lines[i].startswith("@@"):
                raise _err(path, i + 1, f"malformed hunk header {lines[i]!r}.")
            raise _err(path, i + 1, f"unexpected line {lines[i]!r} after a hunk (hunk line counts wrong?).")
        if i < n and lines[i] == "":
            if all(rest == "" for rest in lines[i:]):
                break  # trailing blank lines at the end of the file
            raise _err(path, i + 1, "blank line after a hunk (hunk line counts wrong?).")
    return tuple(files)


# What starts a diff for `git apply`, which reads on past a mail signature.
_DIFF_STARTS = ("diff ", "--- ", "+++ ", "@@ ", "GIT binary patch", "Binary files ", "Index: ", *_EXTENDED)


def _refuse_diff_after_signature(lines: list[str], sig: int, path: Path) -> None:
    """Refuse a diff hidden after the `-- ` signature line: we would not read it, git would apply it."""
    for j in range(sig + 1, len(lines)):
        if lines[j].startswith(_DIFF_STARTS):
            raise _err(
                path,
                j + 1,
                f"{lines[j][:60]!r} after the signature line {sig + 1} (`-- `): git would apply a diff "
                "there that this check would not read; refused. Nothing was applied.",
                "A signature holds only the git version; put every change above it "
                "(or regenerate the patch with `pipeline patch export`).",
            )


def _parse_hunk(lines: list[str], i: int, path: Path) -> tuple[Hunk, int]:
    header = lines[i]
    m = _HUNK.match(header)
    if not m:
        raise _err(path, i + 1, f"malformed hunk header {header!r}: expected `@@ -a,b +c,d @@`.")
    old_start, new_start = int(m.group(1)), int(m.group(3))
    old_count = int(m.group(2)) if m.group(2) is not None else 1
    new_count = int(m.group(4)) if m.group(4) is not None else 1
    old_left, new_left = old_count, new_count
    j = i + 1
    while old_left > 0 or new_left > 0:
        if j >= len(lines):
            raise _err(
                path, i + 1, f"hunk {header!r} ends early: {old_left} old and {new_left} new lines missing."
            )
        body = lines[j]
        tag = body[:1]
        if tag in (" ", ""):
            old_left -= 1
            new_left -= 1
        elif tag == "-":
            old_left -= 1
        elif tag == "+":
            new_left -= 1
        elif tag == "\\":
            pass
        else:
            raise _err(path, j + 1, f"line {body!r} inside hunk {header!r} (expected ' ', '-', '+' or '\\').")
        if old_left < 0 or new_left < 0:
            raise _err(path, j + 1, f"hunk {header!r} has more lines than its header counts.")
        j += 1
    if j < len(lines) and lines[j].startswith("\\"):
        j += 1
    hunk = Hunk(header, i + 1, old_start, old_count, new_start, new_count, tuple(lines[i + 1 : j]))
    return hunk, j


def _git_header_paths(line: str, path: Path, lineno: int) -> tuple[str, str]:
    rest = line[len("diff --git ") :]
    if rest.startswith('"'):
        raise _err(path, lineno, "quoted (non-ASCII or special) paths are not supported.")
    if not rest.startswith("a/"):
        raise _err(path, lineno, f"`diff --git` paths lack the `a/` prefix: {line!r} (patches are -p1).")
    # `a/X b/X`: prefer the split where both sides agree (paths may contain " b/").
    candidates = [k for k in range(len(rest)) if rest.startswith(" b/", k)]
    if not candidates:
        raise _err(path, lineno, f"malformed `diff --git` line {line!r}.")
    split = next((k for k in candidates if rest[2:k] == rest[k + 3 :]), candidates[0])
    a, b = rest[2:split], rest[split + 3 :]
    return _check_path(a, path, lineno), _check_path(b, path, lineno)


def _check_path(p: str, patch_path: Path, lineno: int) -> str:
    bad = (
        not p
        or p.startswith("/")
        or "\\" in p
        or "\0" in p
        or re.match(r"^[A-Za-z]:", p) is not None
        or any(part in ("..", "") for part in p.split("/"))
        or any(part.lower() == ".git" for part in p.split("/"))
    )
    if bad:
        raise PatchError(
            f"{patch_path}:{lineno}: path {p!r} points outside the repository (or into .git); refused.",
            hint="A patch may only touch files inside the ATOM tree. Nothing was applied.",
        )
    return p


def _check_symlink(p: str, hunks: list[Hunk], patch_path: Path, lineno: int) -> None:
    target = "".join(line[1:] for h in hunks for line in h.lines if line.startswith("+"))
    resolved = posixpath.normpath(posixpath.join(posixpath.dirname(p), target))
    if target.startswith("/") or resolved == ".." or resolved.startswith("../"):
        raise PatchError(
            f"{patch_path}:{lineno}: symlink {p!r} -> {target!r} points outside the repository; refused.",
            hint="A patch may only touch files inside the ATOM tree. Nothing was applied.",
        )


# -- the series ---------------------------------------------------------------


@dataclass(frozen=True)
class PatchSeries:
    """`patches/atom/series` and the patches it lists, in order."""

    directory: Path
    patches: tuple[Patch, ...] = field(default_factory=tuple)

    def __iter__(self) -> Iterator[Patch]:
        return iter(self.patches)

    def __len__(self) -> int:
        return len(self.patches)

    @property
    def series_file(self) -> Path:
        return self.directory / "series"

    def digest(self) -> str:
        """sha256 over (name, file sha256) in order: changes iff the series changes."""
        return series_digest((p.name, p.sha256) for p in self.patches)

    def get(self, name: str) -> Patch:
        for p in self.patches:
            if p.name == name:
                return p
        raise PatchError(f"no patch named {name!r} in {self.series_file}.")

    @classmethod
    def load(cls, directory: Path) -> PatchSeries:
        series = directory / "series"
        if not series.exists() and not series.is_symlink():
            raise PatchError(
                f"no series file at {series}.",
                hint="Create it (one patch file name per line) or set paths.patches_dir.",
            )
        text = read_text(series, what="series file", error=PatchError, follow_symlinks=False)
        patches: list[Patch] = []
        seen: dict[str, int] = {}
        for lineno, raw in enumerate(text.splitlines(), 1):
            line = raw.split(" #", 1)[0].strip() if not raw.lstrip().startswith("#") else ""
            if not line:
                continue
            parts = line.split()
            name, opts = parts[0], parts[1:]
            strip = 1
            for opt in opts:
                if opt in ("-p1", "-p", "1"):
                    continue
                raise _err(
                    series, lineno, f"unsupported option {opt!r} for {name}: git-style patches are -p1."
                )
            if not _NAME.match(name):
                raise _err(series, lineno, f"patch name {name!r} is not `NNNN-slug.patch` (no directories).")
            if name in seen:
                raise _err(series, lineno, f"{name} listed twice (first on line {seen[name]}).")
            seen[name] = lineno
            if not (directory / name).is_file():
                raise _err(series, lineno, f"{name} is listed but {directory / name} does not exist.")
            patches.append(Patch.load(directory / name, strip=strip))
        return cls(directory=directory, patches=tuple(patches))


def series_digest(
    items: Iterator[tuple[str, str]] | list[tuple[str, str]] | tuple[tuple[str, str], ...],
) -> str:
    h = hashlib.sha256()
    for name, sha in items:
        h.update(f"{name} {sha}\n".encode())
    return h.hexdigest()
