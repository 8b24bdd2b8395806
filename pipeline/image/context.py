"""The rendered build context: its layout, its manifest, its candidate tag, and the model's shared
directory (the engine's build directory, kept under a lock).

One owner for each: render (pipeline.image.render) writes a context and build
(pipeline.image.build) reads it only through `read_manifest`.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.config import Settings
from pipeline.errors import RenderError
from pipeline.fsutil import acquire_lock, sha256_file

MANIFEST = "render.json"


PAIR_NAME = "atom-image.pair.toml"  # Lock.pair(): what the image is built from, no model


DOCKERFILE = "Dockerfile"  # BuildKit (RUN --mount)


DOCKERFILE_CLASSIC = "Dockerfile.classic"  # the same image for engines without BuildKit


WHEELS = "wheels"  # the wheelhouse in the context


PARITY = "parity.md"


FILES_INDEX = ".render-files.json"  # {path: [mode, blob sha]} of the exported trees, for reuse


def check_model(model: str) -> str:
    from pipeline.validate import MODEL_RE  # the one model-name grammar

    if not MODEL_RE.match(model):
        raise RenderError(f"model name {model!r} may only contain letters, digits, '.', '_' and '-'.")
    return model


def candidate_tag(inputs_digest: str) -> str:
    """A candidate tag names the inputs, never a release (the tag stage moves real tags)."""
    return f"candidate-{inputs_digest[:12]}"


@dataclass(frozen=True)
class RenderedContext:
    dir: Path
    dockerfile: Path
    inputs_digest: str
    labels: dict[str, str]
    image_ref: str
    parity_summary: str = ""
    notes: tuple[str, ...] = ()  # what render decided that the user should know (printed as warnings)


def shared_context_dir(settings: Settings, model: str) -> Path:
    """The engine's build directory for a model: a hard-linked mirror of the last context rendered
    or built.

    BuildKit sends only what changed since the last build from the same directory, and render
    hard-links unchanged files from it (a new run directory reuses the last run's files).
    """
    return settings.cache_dir / "contexts" / check_model(model)


@contextlib.contextmanager
def locked_shared_context(settings: Settings, model: str) -> Iterator[Path]:
    """The model's shared context directory, held under an exclusive lock."""
    path = shared_context_dir(settings, model)
    lock = acquire_lock(
        path.parent / f".{path.name}.lock",
        wait=24 * 3600.0,  # another render or build of this model: its turn comes, however long
        busy=f"another render or build holds the shared context {path}",
        hint="Wait for it to finish.",
    )
    try:
        yield path
    finally:
        lock.release()


@dataclass(frozen=True)
class ContextManifest:
    dir: Path
    inputs_digest: str
    image_ref: str
    labels: dict[str, str]
    base_image: str
    model: str = ""
    dockerfiles: tuple[str, ...] = (DOCKERFILE,)  # what this context can be built with
    network: str = ""
    secrets: tuple[str, ...] = ()
    selfcheck: dict[str, Any] | None = None
    aiter_stage: str = ""  # the aiter stage's own key (render.aiter_stage_key); "" from older renders
    raw: dict[str, Any] = field(default_factory=dict)  # the manifest as read (provenance records it)


def read_manifest(context: Path) -> ContextManifest:
    """The render manifest of a context; refuses a context edited after render."""
    path = context / MANIFEST
    dockerfile = context / "Dockerfile"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        digest = str(data["inputs_digest"])
        expected = str(data["dockerfile_sha256"])
    except FileNotFoundError:
        raise RenderError(
            f"{context} is not a rendered build context (no {MANIFEST}).",
            hint="Run `pipeline render --model M -o DIR` first.",
        ) from None
    except (ValueError, KeyError, TypeError) as e:
        raise RenderError(f"{path} is corrupt: {e}.", hint="Render the context again.") from e
    if not dockerfile.is_file() or sha256_file(dockerfile) != expected:
        raise RenderError(
            f"the Dockerfile in {context} is missing or was edited after render.",
            hint="Render the context again; edits would not be covered by the inputs digest.",
        )
    files = dict(data.get("dockerfiles") or {DOCKERFILE: expected})
    for name, sha in files.items():
        if not (context / name).is_file() or sha256_file(context / name) != sha:
            raise RenderError(
                f"{name} in {context} is missing or was edited after render.",
                hint="Render the context again; edits would not be covered by the inputs digest.",
            )
    build = dict(data.get("build") or {})
    return ContextManifest(
        dir=context,
        inputs_digest=digest,
        image_ref=str(data["image_ref"]),
        labels={str(k): str(v) for k, v in dict(data["labels"]).items()},
        base_image=str(data["base_image"]),
        model=str(data.get("model", "")),
        dockerfiles=tuple(files),
        network=str(build.get("network", "")),
        secrets=tuple(str(x) for x in build.get("secrets", ())),
        selfcheck=dict(data["selfcheck"]) if data.get("selfcheck") else None,
        aiter_stage=str(dict(data.get("aiter_stage") or {}).get("key", "")),
        raw=data,
    )
