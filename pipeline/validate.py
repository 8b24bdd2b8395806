"""One place that validates each value a user gives, where it enters, for every command.

Model names, git refs, image references, tag templates, repository URLs and
numeric settings are checked here, by the CLI flags, by configuration loading and by the
stages, so a bad value fails at `pin` or at the start of `build` with one
message, not an hour later in the tag stage. Echoed values are cut (`shown`):
a 120 kB argument does not fill the log.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from pipeline.errors import ConfigError, UsageError

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.oci.ref import ImageRef

MODEL_MAX = 100
MODEL_RE = re.compile(rf"^[A-Za-z0-9][A-Za-z0-9._-]{{0,{MODEL_MAX - 1}}}$")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
SHOWN_MAX = 80

# sample values of every tag-template field, to try a template before anything is built
TEMPLATE_SAMPLE = {
    "model": "MiniMax-M3-MXFP4",
    "date": "20260101",
    "atom7": "ab9eb78",
    "aiter7": "08f04b8",
    "patchset": "1a2b3c4d",
    "inputs7": "0123456",
}


def shown(value: str, limit: int = SHOWN_MAX) -> str:
    """`value` quoted for a message; a long one is cut and its length said (fsutil.shorten)."""
    from pipeline.fsutil import shorten

    return shorten(value, limit)


def model(name: str) -> str:
    """A model name: also a file name (locks/<model>.toml, recipes/<model>.yaml) and a tag part."""
    if not MODEL_RE.match(name):
        raise UsageError(
            f"invalid model name {shown(name)}: use letters, digits, '.', '-' and '_', starting with a "
            f"letter or digit, at most {MODEL_MAX} characters.",
            hint="For example: --model MiniMax-M3-MXFP4.",
        )
    return name


def ref(value: str, *, what: str = "ref") -> str:
    """A git ref as given (branch, tag, SHA, HEAD, rev~N): never an option, never a control character."""
    text = value.strip()
    if not text or text.startswith("-") or _CONTROL.search(text) or len(text) > 255 or ".." in text:
        raise UsageError(
            f"{what} {shown(value)} is not a git ref.",
            hint="Give a branch, tag, full or short SHA, or HEAD (at most 255 characters).",
        )
    return text


def url(value: str, *, what: str = "repository") -> str:
    """A git URL or local path: no control characters, no option-looking value, no empty string."""
    text = value.strip()
    if not text or text.startswith("-") or _CONTROL.search(text) or len(text) > 4096:
        raise UsageError(
            f"{what} {shown(value)} is not a git URL or path.",
            hint="Give a URL (https://, ssh://, git@host:path, file://) or a local path.",
        )
    return text


# A git URL a Dockerfile may quote (the characters render allows) and git runs no helper for.
_URL_CHARS = r"[^\s'\"\\`$;|&<>(){}]+"
_REMOTE_URL = re.compile(rf"^(?:(?:https?|ssh|git)://{_URL_CHARS}|[\w.-]+@[\w.-]+:{_URL_CHARS})$")
_FILE_URL = re.compile(rf"^file://{_URL_CHARS}$")


def submodule_url_problem(raw: str, resolved: str, *, parent: str, allow_file: bool = False) -> str | None:
    """Why a submodule URL from a `.gitmodules` (`raw`, `resolved` against the superproject's URL
    `parent`) may not be pinned or rendered, else None. The same rules at pin and at render.

    The file is upstream's, not the user's: it may name a remote repository (https, ssh, git,
    scp-like), never an option (`-u…`, `ssh://-oProxyCommand=…`), a remote helper (`ext::`) or
    a path on this host; only a local superproject (a mirror on disk) may name a local sibling.
    `allow_file`: a `file://` URL already vetted against its superproject (render, from a lock).
    """
    import os
    from urllib.parse import urlsplit

    if _CONTROL.search(raw) or raw.strip() != raw or not raw:
        return "it is empty or holds control characters or surrounding spaces"
    if raw.startswith("-"):
        return "it looks like a command-line option"
    if re.match(r"^[A-Za-z0-9+.-]+::", raw):
        return "it names a git remote helper (`transport::`), which runs a program"
    local_parent = "://" not in parent and not re.match(r"^[^@/]+@[^/:]+:|^[^/:]+:", parent)
    local_parent = local_parent or parent.startswith("file://")
    if raw.startswith(("./", "../")):
        if not local_parent:
            return None if _REMOTE_URL.match(resolved) else "it does not resolve to a git URL"
        root = os.path.dirname(os.path.normpath(parent.removeprefix("file://")))
        target = os.path.normpath(resolved.removeprefix("file://"))
        if os.path.commonpath([root, target]) != root:
            return f"it climbs out of {root}, the directory holding the superproject"
        return None
    if _REMOTE_URL.match(raw):
        parts = urlsplit(raw) if "://" in raw else None
        host = parts.netloc.rpartition("@")[2] if parts is not None else raw.split("@", 1)[1]
        if host.startswith("-") or (parts is not None and parts.path.lstrip("/").startswith("-")):
            return "its host or path looks like a command-line option"
        return None
    if _FILE_URL.match(raw) and (local_parent or allow_file):
        return None
    return (
        "it is a path on this host (only a local superproject may name a local submodule)"
        if raw.startswith(("/", "~", "file:")) or "://" not in raw
        else "it is not a git URL (https://, ssh://, git://, user@host:path)"
    )


def image_reference(value: str, *, what: str = "image reference") -> ImageRef:
    """`[registry/]repository[:tag][@sha256:…]`, parsed by the one grammar (pipeline.oci.ref)."""
    from pipeline.oci.ref import parse_image_ref

    try:
        return parse_image_ref(value)
    except UsageError as e:
        raise UsageError(f"{what}: {e.message}", hint=e.hint) from None


def tag_template(template: str, *, setting: str) -> str:
    """A tag template fills with the known fields into a valid registry tag."""
    import string  # (a tag template's check only)

    from pipeline.oci.ref import tag_problem

    fields = ", ".join("{" + f + "}" for f in TEMPLATE_SAMPLE)
    try:
        for _, field, _, _ in string.Formatter().parse(template):
            if field is not None and not field.isidentifier():
                raise ValueError(f"{{{field}}} is not a plain field name")
        tag = string.Formatter().vformat(template, (), dict(TEMPLATE_SAMPLE))
    except KeyError as e:
        raise ConfigError(
            f"[tag] {setting} = {shown(template)} uses an unknown field {{{e.args[0]}}}.",
            hint=f"Known fields: {fields}.",
        ) from None
    except (AttributeError, IndexError, ValueError, TypeError) as e:
        raise ConfigError(
            f"[tag] {setting} = {shown(template)} is not a valid tag template ({type(e).__name__}: {e}).",
            hint=f"Use plain fields only: {fields}.",
        ) from None
    problem = tag_problem(tag)
    if problem:
        raise ConfigError(
            f"[tag] {setting} = {shown(template)} makes tags like {shown(tag)}, which is not a valid "
            f"registry tag: {problem}.",
            hint="Change the template; a tag is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.",
        )
    return template


def check_tag_templates(settings: Settings) -> None:
    """Every tag template of the settings ([tag] tag_template and moving_tags)."""
    tag_template(settings.tag.tag_template, setting="tag_template")
    for t in settings.tag.moving_tags:
        tag_template(t, setting="moving_tags")
