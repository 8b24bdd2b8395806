"""Build a rendered context with the Docker engine (classic builder, via pipeline.dockerw).

`build_image` first looks for an image that already carries the context's
inputs digest label (locally, then optionally in the target registry): same
inputs, same image, so nothing is built. Otherwise it checks the pinned base
image is there (or pullable), builds with per-step progress, streams the full
build log into the run directory and tags the result as a *candidate*
(`<repository>:candidate-<digest 12>`); release tags are the tag stage's job.
A failed build tags nothing and raises `BuildError` naming the failing step
with the last lines of its output.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from pipeline import labels
from pipeline.config import Settings
from pipeline.dockerw import BuiltImage, Engine, ImageInfo
from pipeline.errors import BuildError, InfraError, PipelineError, TagError
from pipeline.log import Logger
from pipeline.render import candidate_tag, read_manifest

BUILD_LOG = "build.log"
TAIL_LINES = 20

# Looks an inputs digest up in the target registry: returns where an image with it was found, or None.
RemoteLookup = Callable[[str], str | None]

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")


@dataclass(frozen=True)
class BuildOutcome:
    image_id: str
    skipped: bool  # an image with the same inputs digest existed: nothing was built
    cached_steps: int
    log_path: Path | None
    image_ref: str = ""  # the candidate tag (or the tag asked for)
    inputs_digest: str = ""
    steps: int = 0
    aiter_cached: bool | None = None  # every step of the aiter stage came from the cache
    found_in: str = ""  # "local" or the registry reference, when skipped


def split_ref(ref: str) -> tuple[str, str]:
    """`repo[:tag]` -> (repo as written, tag); the tag defaults to `latest` (pipeline.imageref's grammar)."""
    from pipeline.errors import UsageError
    from pipeline.imageref import parse_image_ref

    try:
        parsed = parse_image_ref(ref)
    except UsageError as e:
        raise BuildError(f"cannot tag an image as {ref!r}: {e.message}", hint=e.hint) from None
    if parsed.digest:
        raise BuildError(f"cannot tag an image as {ref!r}: a tag, not a digest, is needed.")
    return parsed.given, parsed.tag or "latest"


def stage_cached(built: BuiltImage, stage: str) -> bool | None:
    """True if every step of the stage `FROM ... AS <stage>` (FROM excluded) came from the cache."""
    inside = False
    steps: list[str] = []
    for s in built.steps:
        m = _STEP.match(s)
        instr = m.group(3) if m else s
        if instr.upper().startswith("FROM "):
            inside = instr.lower().endswith(f" as {stage}")
            continue
        if inside:
            steps.append(s)
    if not steps:
        return None
    return all(s in built.cached for s in steps)


def _ensure_tag(engine: Engine, info: ImageInfo, ref: str) -> None:
    if ref not in info.tags:
        repo, tag = split_ref(ref)
        engine.tag(info.id, repo, tag)


def _check_base(engine: Engine, base: str, log: Logger) -> None:
    """The pinned base image must be on the engine or pullable; else an error naming it."""
    if engine.image(base) is not None:
        return
    from pipeline.imageref import parse_image_ref

    parsed = parse_image_ref(base)  # render checked it: a pinned reference
    repo, digest = parsed.given, parsed.digest or ""
    pull_ref = f"{repo}@{digest}" if digest else base
    log.info(f"base image {pull_ref} is not on the engine; pulling it")
    try:
        engine.pull(pull_ref)
    except PipelineError as e:
        raise BuildError(
            f"base image {repo} (digest {digest or 'none'}) is not on the Docker engine and could not be "
            f"pulled: {e.message}",
            hint="Log in to its registry or load the image onto the engine (docker load / docker pull), "
            "or re-pin the base image with `pipeline pin`.",
            evidence=e.evidence,
        ) from None


def build_image(
    engine: Engine,
    context: Path,
    *,
    tag: str | None,
    log: Logger,
    run_dir: Path | None,
    extra_labels: Mapping[str, str] | None = None,
    remote_lookup: RemoteLookup | None = None,
    nocache: bool = False,
) -> BuildOutcome:
    """Build `context` (rendered by `pipeline render`) unless its inputs were built already."""
    manifest = read_manifest(context)
    digest = manifest.inputs_digest
    ref = tag or manifest.image_ref
    split_ref(ref)  # refuse a bad tag before any work

    existing = sorted(engine.images_with_label(labels.INPUTS_DIGEST, digest), key=lambda i: i.id)
    if existing:
        info = existing[0]
        _ensure_tag(engine, info, ref)
        log.info(f"an image with inputs digest {digest[:12]} exists: {info.id[:19]}; nothing to build")
        return BuildOutcome(
            image_id=info.id,
            skipped=True,
            cached_steps=0,
            log_path=None,
            image_ref=ref,
            inputs_digest=digest,
            found_in="local",
        )
    if remote_lookup is not None:
        where = remote_lookup(digest)
        if where is not None:
            log.info(f"the registry has an image with inputs digest {digest[:12]}: {where}; nothing to build")
            return BuildOutcome(
                image_id="",
                skipped=True,
                cached_steps=0,
                log_path=None,
                image_ref=ref,
                inputs_digest=digest,
                found_in=where,
            )

    _check_base(engine, manifest.base_image, log)

    log_path = (run_dir / BUILD_LOG).absolute() if run_dir is not None else None
    fh: IO[str] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = log_path.open("w", encoding="utf-8")

    def on_line(line: str) -> None:
        if fh is not None:
            fh.write(log.redact(line) + "\n")
            fh.flush()
        m = _STEP.match(line)
        if m:
            log.info(f"  step {m.group(1)}/{m.group(2)}: {_short(m.group(3))}")
        elif line.strip() == "---> Using cache":
            log.detail("    (from cache)")
        elif line.strip():
            log.debug(line)

    try:
        built = engine.build(context, tag=ref, labels=extra_labels, on_line=on_line, nocache=nocache)
    except BuildError as e:
        raise _failure(e, log_path) from None
    except InfraError:
        raise
    finally:
        if fh is not None:
            fh.close()

    built_info = engine.image(built.id)
    if built_info is None or built_info.labels.get(labels.INPUTS_DIGEST) != digest:
        raise BuildError(
            f"the built image {built.id[:19]} does not carry the inputs digest label {digest[:12]}.",
            hint="The Dockerfile template must keep its LABEL block; render again from the shipped template.",
        )
    aiter_cached = stage_cached(built, "aiter")
    log.info(
        f"built {built.id[:19]} as {ref}: {len(built.steps)} steps, {built.cached_steps} from cache"
        + ("; aiter stage from cache" if aiter_cached else "")
    )
    return BuildOutcome(
        image_id=built.id,
        skipped=False,
        cached_steps=built.cached_steps,
        log_path=log_path,
        image_ref=ref,
        inputs_digest=digest,
        steps=len(built.steps),
        aiter_cached=aiter_cached,
    )


def _short(text: str, width: int = 100) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


def _failure(err: BuildError, log_path: Path | None) -> BuildError:
    """The failing step and the last lines of its output, in the message itself."""
    tail = ""
    marker = "--- last lines of the failing step ---\n"
    if err.evidence and marker in err.evidence:
        tail = err.evidence.split(marker, 1)[1]
    lines = [ln for ln in tail.splitlines() if ln.strip()][-TAIL_LINES:]
    shown = "\n".join(f"    {ln}" for ln in lines)
    where = f"The full build log is {log_path}." if log_path else "Run with a run directory to keep the log."
    return BuildError(
        err.message.split(" The full build log")[0]
        + (f"\n  last lines of the failing step:\n{shown}" if shown else ""),
        hint=f"Nothing was tagged. {where}",
        evidence=err.evidence,
    )


def registry_lookup(settings: Settings, env: Mapping[str, str], log: Logger) -> RemoteLookup | None:
    """When [tag] registry is set: find the candidate tag of an inputs digest in the target registry.

    Only candidate tags are looked up (they name the inputs digest); an unreachable registry is a
    warning, never a reason not to build.
    """
    registry = settings.tag.registry
    if not registry:
        return None
    from pipeline.registry import RegistryClient, credentials_for, parse_image_ref

    target = parse_image_ref(f"{registry.rstrip('/')}/{settings.image.repository}")
    client = RegistryClient(target.registry, credentials=credentials_for(target.registry, env), retries=1)

    def lookup(digest: str) -> str | None:
        tag = candidate_tag(digest)
        try:
            found = client.manifest_digest(target.repository, tag)
        except (InfraError, TagError) as e:
            log.warn(f"could not look for an existing image in {target.name}: {e.message}")
            return None
        return f"{target.name}:{tag}@{found}" if found else None

    return lookup
