"""Repository URLs: local paths vs URLs, credential stripping, mirror names, submodule URLs."""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import urlsplit, urlunsplit

from pipeline.errors import SourceError, UsageError
from pipeline.fsutil import path_problem, shorten

if TYPE_CHECKING:  # (a plain check of two local repositories loads no settings: pipeline.plaincheck)
    from pipeline.config import Settings

_SCP = re.compile(r"^(?:[^@/]+@)?[^/:]+:")  # git@host:path (git's scp-like syntax)


def is_local(url: str) -> bool:
    """True for a local path (as git decides: no `scheme://`, no scp-like `host:`)."""
    if "://" in url:
        return False
    return not _SCP.match(url) or url.startswith(("/", "./", "../", "~"))


def normalise_url(url: str, *, cwd: Path | None = None) -> str:
    """Local paths become absolute; URLs lose embedded credentials; else unchanged."""
    url = url.strip()
    if not url:
        raise UsageError("an empty repository URL was given.", hint="Pass a git URL or a local path.")
    if is_local(url):
        p = Path(url).expanduser()
        if not p.is_absolute():
            p = (cwd or Path.cwd()) / p
        p = Path(os.path.normpath(p))
        problem = path_problem(p)
        if problem is not None:
            raise UsageError(
                f"the repository path {shorten(url)} cannot be used: {problem}.",
                hint="Give the path of a git repository (bare or not), or a git URL.",
            )
        return str(p)
    return strip_credentials(url)


def strip_credentials(url: str) -> str:
    """`https://user:token@host/x` -> `https://host/x` (never written to a lock or log)."""
    if "://" not in url:
        return url
    parts = urlsplit(url)
    if parts.password is None and parts.username is None:
        return url
    host = parts.hostname or ""
    if parts.port:
        host += f":{parts.port}"
    # keep a bare user name for ssh:// (git@host), drop user:password for http(s)
    if parts.scheme.startswith("ssh") and parts.username and parts.password is None:
        host = f"{parts.username}@{host}"
    return urlunsplit((parts.scheme, host, parts.path, parts.query, parts.fragment))


def mirror_name(url: str) -> str:
    """A readable, unique directory name for `url`'s mirror (without `.git`)."""
    key = url.rstrip("/")
    key = key.removesuffix(".git")
    import hashlib  # (here: a plain check of local repositories never loads OpenSSL)

    digest = hashlib.sha256(key.encode()).hexdigest()[:10]
    readable = re.sub(r"^[a-z][a-z0-9+.-]*://", "", key)
    readable = re.sub(r"[^A-Za-z0-9._-]+", "-", readable).strip("-.")
    readable = readable[-60:].lstrip("-.") or "repo"
    return f"{readable}-{digest}"


def mirror_path(settings: Settings, url: str) -> Path:
    return settings.mirrors_dir / f"{mirror_name(normalise_url(url))}.git"


def resolve_relative_url(parent: str, url: str) -> str:
    """Resolve a submodule URL (`../ck.git`, `./x`) against its superproject's URL, as git does."""
    if not url.startswith(("./", "../")):
        return url
    if "://" in parent:
        scheme, rest = parent.split("://", 1)
        host, _, path = rest.partition("/")
        prefix, sep = f"{scheme}://{host}", "/"
    elif not is_local(parent):
        host, _, path = parent.partition(":")
        prefix, sep = host, ":"
    else:
        prefix, sep, path = "", "/", parent
    comps = [c for c in path.split("/") if c]
    rel = url
    while True:
        if rel.startswith("./"):
            rel = rel[2:]
        elif rel.startswith("../"):
            rel = rel[3:]
            if not comps:
                raise SourceError(f"submodule URL {url!r} climbs above its superproject URL {parent!r}.")
            comps.pop()
        else:
            break
    return prefix + sep + "/".join([*comps, rel] if rel else comps)


def validate_model(model: str) -> str:
    """The one model-name check (pipeline.validate), for callers of `pipeline.sources`."""
    from pipeline import validate

    return validate.model(model)
