"""The one image-reference grammar: `[registry[:port]/]repository[:tag][@sha256:<64 hex>]`.

Docker's (distribution/reference) rules, with its normalisation: the first path
component is a registry when it contains `.` or `:` or is `localhost`, else the
registry is `docker.io` (single names get `library/`). Render's `image` filter,
imagebuild, the registry client and tag all parse references here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from pipeline.errors import BuildError, UsageError

DOCKER_HUB = "docker.io"
DOCKER_HUB_ALIASES = ("docker.io", "index.docker.io", "registry-1.docker.io", "registry.hub.docker.com")

TAG_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
# distribution/reference: path components are lowercase alphanumerics joined by separators
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
REPOSITORY_RE = re.compile(rf"^{_COMPONENT}(?:/{_COMPONENT})*$")
HOST_RE = re.compile(
    r"^(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9-]+)*|\[[0-9a-fA-F:]+\])(?::\d+)?$"
)
_SHOWN = 200  # long enough for any real reference; a 120 kB argument is cut


def _shown(ref: str) -> str:
    return ref if len(ref) <= _SHOWN else f"{ref[:_SHOWN]}… ({len(ref)} characters)"


@dataclass(frozen=True)
class ImageRef:
    """A normalised image reference, as Docker reads it.

    ``registry`` is ``docker.io`` when the name has none; ``tag`` is None when
    only a digest was given (and also when neither was: use ``reference`` for "latest").
    ``given`` keeps the name as written (without tag or digest), for tagging on the engine.
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None
    given: str = field(default="", compare=False)

    @property
    def name(self) -> str:
        """``registry/repository``: what ``docker tag``/``docker push`` take as the repo."""
        return f"{self.registry}/{self.repository}"

    @property
    def reference(self) -> str:
        """What to ask the registry for: the digest if any, else the tag, else ``latest``."""
        return self.digest or self.tag or "latest"

    def __str__(self) -> str:
        out = self.name
        if self.tag:
            out += f":{self.tag}"
        if self.digest:
            out += f"@{self.digest}"
        return out


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` breaks the registry tag grammar, or None when it is valid."""
    if TAG_RE.match(tag):
        return None
    if not tag:
        return "it is empty"
    if len(tag) > 128:
        return f"it is {len(tag)} characters long (at most 128)"
    bad = sorted({c for c in tag if not (c.isascii() and (c.isalnum() or c in "_.-"))})
    if bad:
        return "it contains " + ", ".join(repr(c) for c in bad[:10])
    return f"it starts with {tag[0]!r} (a tag starts with a letter, digit or _)"


def validate_tag(tag: str, *, what: str = "tag") -> str:
    """Return ``tag`` if it matches the registry tag grammar, else raise a UsageError naming it."""
    problem = tag_problem(tag)
    if problem:
        raise UsageError(
            f"{what} '{_shown(tag)}' is not a valid registry tag: {problem}.",
            hint="Fix the tag (or the tag_template / moving_tags setting that produced it); "
            "the grammar is [A-Za-z0-9_][A-Za-z0-9_.-]{0,127}.",
        )
    return tag


def parse_image_ref(ref: str) -> ImageRef:
    """Parse ``[registry/]repo[:tag][@sha256:...]`` with Docker's normalisation."""
    raw = ref.strip()
    if not raw or any(c.isspace() for c in raw):
        raise UsageError(
            f"'{_shown(ref)}' is not an image reference.", hint="Use [registry/]repository[:tag][@digest]."
        )
    name, digest = raw, None
    if "@" in raw:
        name, digest = raw.split("@", 1)
        if not DIGEST_RE.match(digest):
            raise UsageError(
                f"image reference '{_shown(ref)}' has an invalid digest '{_shown(digest)}'.",
                hint="A digest is sha256: followed by 64 lowercase hex digits.",
            )
    tag: str | None = None
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name, tag = name.rsplit(":", 1)
        validate_tag(tag, what=f"the tag of image reference '{_shown(ref)}'")
    given = name
    first, sep, rest = name.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, rest
        if not HOST_RE.match(registry):
            raise UsageError(f"image reference '{_shown(ref)}' has an invalid registry host '{registry}'.")
    else:
        registry, repository = DOCKER_HUB, name
    if registry in DOCKER_HUB_ALIASES:
        registry = DOCKER_HUB
        if "/" not in repository:
            repository = f"library/{repository}"
    if not REPOSITORY_RE.match(repository) or len(repository) > 255:
        raise UsageError(
            f"image reference '{_shown(ref)}': '{_shown(repository)}' is not a valid repository name.",
            hint="Repository names are lowercase letters, digits and . _ - separated by /.",
        )
    return ImageRef(registry, repository, tag, digest, given)


def split_ref(ref: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo as written, tag); the tag defaults to `latest` (this grammar)."""
    try:
        parsed = parse_image_ref(ref)
    except UsageError as e:
        raise BuildError(f"cannot tag an image as {ref!r}: {e.message}", hint=e.hint) from None
    if parsed.digest:
        raise BuildError(f"cannot tag an image as {ref!r}: a tag, not a digest, is needed.")
    return parsed.given, parsed.tag or "latest"
