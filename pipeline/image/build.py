"""Build a rendered context with the Docker engine: BuildKit (pipeline.oci.buildkit), or classic.

`build_image` first looks for an image that already carries the context's
inputs digest label (locally, then optionally in the target registry): same
inputs, same image, so nothing is built. Otherwise it checks the pinned base
image is there (or pullable), builds with per-step progress, streams the full
build log into the run directory, runs the image self-check (pipeline.image.selfcheck,
no GPU) and only then tags the result as a *candidate*
(`<repository>:candidate-<digest 12>`); release tags are the tag stage's job.
A failed build or self-check tags nothing and raises `BuildError` naming the
failing step (or rule) with its evidence.

Front end ([image] builder): "auto" builds with BuildKit through a docker CLI that can drive it
(the engine's own BuildKit; see pipeline.oci.buildkit for why), else with the classic builder
(`Dockerfile.classic`: no cache mounts, no secrets). BuildKit builds run from a stable
directory per model (`<cache>/contexts/<model>`, a hard-linked mirror of the context), so the
engine receives only the files that changed; with [image] cache_repository they start from
that registry's inline cache and push the checked image there.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from pipeline import labels
from pipeline.config import Settings
from pipeline.errors import BuildError, InfraError, PipelineError, TagError
from pipeline.image.buildprogress import BuildProgress, timings_path
from pipeline.image.context import (
    DOCKERFILE,
    DOCKERFILE_CLASSIC,
    ContextManifest,
    candidate_tag,
    locked_shared_context,
    read_manifest,
)
from pipeline.log import Logger
from pipeline.oci import buildkit
from pipeline.oci.engine import BuiltImage, EngineAPI, ImageInfo
from pipeline.oci.ref import split_ref
from pipeline.progress import Progress

BUILD_LOG = "build.log"
ATTESTATIONS = "attestations.json"  # pipeline.image.provenance writes it
TAIL_LINES = 20

# Looks an inputs digest up in the target registry: returns where an image with it was found, or None.
RemoteLookup = Callable[[str], str | None]

_STEP = re.compile(r"^Step (\d+)/(\d+) : (.*)$")
_BK_STEP = re.compile(r"^\[(\S+) (\d+)/(\d+)\] (.*)$")


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
    builder: str = ""  # "buildkit" (with the CLI's path) or "classic"
    context_bytes: int | None = None  # build context BuildKit transferred (None: classic sends it all)
    selfcheck: Path | None = None  # the self-check report
    attestations: Path | None = None  # what the front end produced (or why not)
    cache_ref: str = ""  # where the build cache was pushed
    pushed: str = ""  # the candidate in the target registry ([tag] registry), `repo:tag@digest`
    # wall seconds per phase: base (check or pull the pinned base), build, selfcheck, cache-push
    phases: Mapping[str, float] = field(default_factory=dict)


def stage_cached(built: BuiltImage, stage: str) -> bool | None:
    """True if every step of the stage `FROM ... AS <stage>` (FROM excluded) came from the cache."""
    inside = False
    steps: list[str] = []
    for s in built.steps:
        bk = _BK_STEP.match(s)
        if bk:
            if bk.group(1) == stage and not bk.group(4).upper().startswith("FROM "):
                steps.append(s)
            continue
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


def _ensure_tag(engine: EngineAPI, info: ImageInfo, ref: str) -> None:
    if ref not in info.tags:
        repo, tag = split_ref(ref)
        engine.tag(info.id, repo, tag)


def _check_base(engine: EngineAPI, base: str, log: Logger) -> None:
    """The pinned base image must be on the engine or pullable; else an error naming it."""
    if engine.image(base) is not None:
        return
    from pipeline.oci.ref import parse_image_ref

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
    engine: EngineAPI,
    context: Path,
    *,
    tag: str | None,
    log: Logger,
    run_dir: Path | None,
    extra_labels: Mapping[str, str] | None = None,
    settings: Settings,
    env: Mapping[str, str],
    remote_lookup: RemoteLookup | None = None,
    nocache: bool = False,
) -> BuildOutcome:
    """The candidate of `context` (rendered by `pipeline render`): found on the engine, found in
    the target registry and pulled, or built (and then pushed there when [tag] registry is set).

    The image it returns is on the engine, tagged as the candidate. `settings` choose the front
    end, network, secrets, registry cache, self-check and target registry; `env` holds the
    build secrets' values and the registry credentials. `remote_lookup` replaces the registry
    lookup `settings` would make.
    """
    manifest = read_manifest(context)
    digest = manifest.inputs_digest
    ref = tag or manifest.image_ref
    split_ref(ref)  # refuse a bad tag before any work

    found = _find(engine, digest, ref, settings, env, log, remote_lookup)
    if found is not None:
        image_id, where = found
        # the image may have been built for another model of the pair: this model's recipe tools
        recipe_tools_check(engine, image_id, manifest, settings, extra_labels, log)
        # found on this engine only: the registry gets it too, so other machines pull it by digest
        pushed = (
            _push_candidate(engine, settings, env, ref, log)
            if where == "local" and settings.tag.registry
            else ""
        )
        return BuildOutcome(
            image_id=image_id,
            skipped=True,
            cached_steps=0,
            log_path=None,
            image_ref=ref,
            inputs_digest=digest,
            found_in=where,
            pushed=pushed,
        )

    phases: dict[str, float] = {}
    t0 = time.monotonic()
    _check_base(engine, manifest.base_image, log)
    phases["base"] = time.monotonic() - t0
    img = settings.image
    secrets = _secret_values(manifest, env)
    cli = _front_end(engine, settings, env, manifest, log)
    if cli is None and secrets:
        raise BuildError(
            f"the build needs the secret(s) {', '.join(secrets)}, which only BuildKit can pass "
            "(never as build arguments), and no BuildKit front end is available here.",
            hint='Use an engine and docker CLI with BuildKit ([image] builder = "buildkit"), or drop '
            "[image] build_secrets.",
        )
    network = manifest.network or img.network
    cache_ref = f"{img.cache_repository}:{cache_tag(manifest.model)}" if img.cache_repository else ""
    aiter_ref = (
        f"{img.cache_repository}:{aiter_cache_tag(manifest.aiter_stage)}"
        if img.cache_repository and manifest.aiter_stage
        else ""
    )
    # buildx: build and keep attestations in the target registry (pushed under a build tag, pulled
    # back by digest for the self-check); the candidate tag is pushed only after the self-check.
    staging = (
        f"{settings.tag.registry.rstrip('/')}/{img.repository}:build-{digest[:12]}"
        if cli is not None and cli.buildx and settings.tag.registry
        else ""
    )

    log_path = (run_dir / BUILD_LOG).absolute() if run_dir is not None else None
    fh: IO[str] | None = None
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        fh = log_path.open("w", encoding="utf-8")

    shown = BuildProgress(
        log,
        timings_path(settings.cache_dir, manifest.model),
        progress=Progress.for_stream(log.stream, env, redact=log.redact),  # CI: plain lines
    )
    # with a live display the bar shows the current step; plain output gets a line per step
    step_line = log.detail if shown.live else log.info

    def on_line(line: str) -> None:
        if fh is not None:
            fh.write(log.redact(line) + "\n")
            fh.flush()
        shown(line)
        m = _STEP.match(line)
        bk = re.match(r"^#\d+ (\[\S+ \d+/\d+\] .*)$", line)
        if m:
            step_line(f"  step {m.group(1)}/{m.group(2)}: {_short(m.group(3))}")
        elif bk:
            step_line(f"  {_short(buildkit._MOUNT.sub('', bk.group(1)))}")
        elif line.strip() == "---> Using cache" or re.match(r"^#\d+ CACHED$", line):
            log.detail("    (from cache)")
        elif line.strip():
            log.debug(line)

    context_bytes: int | None = None
    metadata: dict[str, Any] = {}
    stage_built: BuiltImage | None = None  # aiter's stage, when it was built alone for the cache
    t0 = time.monotonic()
    try:
        if cli is not None:
            builder = f"buildkit ({cli.path} {cli.version})"
            if cli.buildx:
                builder = f"buildx ({cli.path} {cli.version}" + (
                    f", builder {img.buildx_builder})" if img.buildx_builder else ")"
                )
            log.info(
                f"building with {'buildx' if cli.buildx else 'BuildKit'} through {cli.path} {cli.version}"
                + (f", cache from {cache_ref}" if cache_ref else "")
                + (f", aiter's stage from {aiter_ref}" if aiter_ref else "")
            )
            common: dict[str, Any] = dict(
                dockerfile=DOCKERFILE,
                labels=extra_labels,
                nocache=nocache,
                network=network,
                secrets=secrets,
                docker_host=engine.docker_host,
                env=env,
                on_line=on_line,
            )
            with locked_shared_context(settings, manifest.model or "context") as build_dir:
                buildkit.mirror_context(context, build_dir)
                if aiter_ref and not _in_registry(aiter_ref, env, log):
                    t1 = time.monotonic()
                    stage_built = _build_aiter_stage(
                        engine, cli, build_dir, aiter_ref, img.buildx_builder, common, log
                    )
                    phases["aiter-stage"] = time.monotonic() - t1
                bk = buildkit.build(
                    cli,
                    build_dir,
                    cache_from=[r for r in (aiter_ref, cache_ref) if r],
                    buildx=buildkit.BuildxOptions(
                        builder=img.buildx_builder, cache_to=cache_ref, push=staging
                    )
                    if cli.buildx
                    else None,
                    **common,
                )
            built: BuiltImage = bk
            context_bytes = bk.context_bytes
            metadata = bk.metadata
            if staging:
                built = dataclasses.replace(bk, id=_pull_built(engine, staging, bk.metadata, env, log))
        else:
            builder = "classic"
            log.info("building with the classic builder (no BuildKit front end here)")
            dockerfile = DOCKERFILE_CLASSIC if DOCKERFILE_CLASSIC in manifest.dockerfiles else DOCKERFILE
            built = engine.build(
                context,
                dockerfile=dockerfile,
                tag=None,
                labels=extra_labels,
                on_line=on_line,
                nocache=nocache,
            )
    except BuildError as e:
        shown.close(succeeded=False)
        raise _failure(e, log_path) from None
    except BaseException:
        shown.close(succeeded=False)
        raise
    finally:
        if fh is not None:
            fh.close()
    shown.close(succeeded=True)

    phases["build"] = time.monotonic() - t0 - phases.get("aiter-stage", 0.0)
    built_info = engine.image(built.id)
    if built_info is None or built_info.labels.get(labels.INPUTS_DIGEST) != digest:
        raise BuildError(
            f"the built image {built.id[:19]} does not carry the inputs digest label {digest[:12]}.",
            hint="The Dockerfile template must keep its LABEL block; render again from the shipped template.",
        )
    t0 = time.monotonic()
    report = _selfcheck(engine, built.id, manifest, settings, run_dir, extra_labels, log)
    phases["selfcheck"] = time.monotonic() - t0
    repo, tag_name = split_ref(ref)
    engine.tag(built.id, repo, tag_name)
    attestations = _attestations(run_dir, builder, built, manifest, ref, report, cache_ref, metadata, staging)
    t0 = time.monotonic()
    if cli is not None and cli.buildx:
        pushed = cache_ref  # --cache-to exported it
    else:
        pushed = _push_cache(engine, built.id, cache_ref, log) if cache_ref else ""
    if cache_ref:
        phases["cache-push"] = time.monotonic() - t0
    candidate = _push_candidate(engine, settings, env, ref, log) if settings.tag.registry else ""
    # where aiter's stage was built alone first, that build says whether it compiled
    aiter_cached = stage_cached(stage_built if stage_built is not None else built, "aiter")
    log.info(
        f"built {built.id[:19]} as {ref}: {len(built.steps)} steps, {built.cached_steps} from cache"
        + ("; aiter stage from cache" if aiter_cached else "")
        + (f"; {context_bytes / 1e6:.2f} MB of context sent" if context_bytes is not None else "")
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
        builder=builder,
        context_bytes=context_bytes,
        selfcheck=report,
        attestations=attestations,
        cache_ref=pushed,
        pushed=candidate,
        phases=phases,
    )


def cache_tag(model: str) -> str:
    """The moving tag of a model's build cache in [image] cache_repository."""
    return f"buildcache-{model}".lower()


def aiter_cache_tag(stage_key: str) -> str:
    """The tag of aiter's stage in [image] cache_repository: named by that stage's own inputs."""
    return f"aiter-{stage_key[:32]}"


def _in_registry(ref: str, env: Mapping[str, str], log: Logger) -> bool:
    """Whether the registry holds `ref` (an unreachable registry: no, with a warning)."""
    from pipeline.oci.registry import RegistryClient, credentials_for, parse_image_ref

    parsed = parse_image_ref(ref)
    client = RegistryClient(parsed.registry, credentials=credentials_for(parsed.registry, env), retries=1)
    try:
        return client.manifest_digest(parsed.repository, parsed.tag or "latest") is not None
    except (InfraError, TagError) as e:
        log.warn(f"could not look for {ref}: {e.message}; building aiter's stage here")
        return False


def _build_aiter_stage(
    engine: EngineAPI,
    cli: buildkit.CliChoice,
    build_dir: Path,
    aiter_ref: str,
    builder: str,
    common: Mapping[str, Any],
    log: Logger,
) -> BuiltImage:
    """Build the aiter stage alone and put it in the registry cache under its own key.

    buildx exports the stage's cache there (`--cache-to ...,mode=max`); the 20.10 CLI tags the
    stage's image, which carries its inline cache, and pushes it. The full build that follows
    starts from it, as does every other model's build with the same key.
    """
    log.info(f"aiter's stage is not in the registry cache: building it once, for {aiter_ref}")
    if cli.buildx:
        opts = buildkit.BuildxOptions(builder=builder, cache_to=aiter_ref, attest=False, load=False)
        return buildkit.build(cli, build_dir, target="aiter", cache_from=[aiter_ref], buildx=opts, **common)
    built = buildkit.build(cli, build_dir, target="aiter", tag=aiter_ref, cache_from=[aiter_ref], **common)
    repo, tag = split_ref(aiter_ref)
    try:
        engine.push(repo, tag)
    except (TagError, InfraError) as e:
        log.warn(f"could not push aiter's stage to {aiter_ref}: {e.message}; other builds will compile it")
        return built
    log.info(f"aiter's stage pushed to {aiter_ref}")
    return built


def _pull_built(
    engine: EngineAPI, staging: str, metadata: Mapping[str, Any], env: Mapping[str, str], log: Logger
) -> str:
    """The image buildx pushed (with its attestations), pulled onto the engine by digest."""
    from pipeline.oci.registry import credentials_for, parse_image_ref

    digest = str(metadata.get("containerimage.digest", ""))
    if not digest.startswith("sha256:"):
        raise BuildError(
            f"buildx pushed {staging} but its metadata names no image digest (containerimage.digest).",
            hint="Use buildx >= 0.10; the build's metadata file is in the build log's directory.",
        )
    name = staging.rsplit(":", 1)[0]
    parsed = parse_image_ref(staging)
    creds = credentials_for(parsed.registry, env)
    info = engine.pull(f"{name}@{digest}", auth_config=creds.auth_config if creds else None)
    log.info(f"pulled the build {name}@{digest} for the self-check: {info.id[:19]}")
    return info.id


def _secret_values(manifest: ContextManifest, env: Mapping[str, str]) -> dict[str, str]:
    missing = [name for name in manifest.secrets if not env.get(name)]
    if missing:
        raise BuildError(
            f"the build secret(s) {', '.join(missing)} ([image] build_secrets) are not set in the "
            "environment.",
            hint="Export them before building; they reach the build only as BuildKit secrets.",
        )
    return {name: env[name] for name in manifest.secrets}


def _front_end(
    engine: EngineAPI, settings: Settings, env: Mapping[str, str], manifest: ContextManifest, log: Logger
) -> buildkit.CliChoice | None:
    """The BuildKit CLI to use, or None for the classic builder ([image] builder)."""
    choice = settings.image.builder
    if choice == "classic":
        return None
    cli = buildkit.find_cli(settings.image.docker_cli, env)
    ok = cli is not None and buildkit.engine_has_buildkit(engine)
    if ok:
        return cli
    why = "no docker CLI here can drive BuildKit" if cli is None else "the engine has no BuildKit"
    if choice == "buildkit":
        raise BuildError(
            f'[image] builder = "buildkit" but {why}.',
            hint="Install Debian's docker.io (its /usr/bin/docker drives the engine's BuildKit), set "
            '[image] docker_cli, or use builder = "auto" to fall back to the classic builder.',
        )
    log.warn(f"{why}: building with the classic builder")
    return None


def _selfcheck(
    engine: EngineAPI,
    image_id: str,
    manifest: ContextManifest,
    settings: Settings,
    run_dir: Path | None,
    extra_labels: Mapping[str, str] | None,
    log: Logger,
) -> Path | None:
    """Run the self-check; on failure remove the image (its label would pass for a build) and raise."""
    if not settings.image.selfcheck:
        log.warn("the image self-check is off ([image] selfcheck = false)")
        return None
    if manifest.selfcheck is None:
        raise BuildError(
            f"the context {manifest.dir} carries no self-check expectations (rendered by an older version).",
            hint="Render the context again.",
        )
    from pipeline.image import selfcheck

    result = selfcheck.run_selfcheck(
        engine, image_id, manifest.selfcheck, manifest.dir, run_dir=run_dir, labels=extra_labels
    )
    if not result.ok:
        engine.remove_image(image_id, force=True, noprune=True)
        raise selfcheck.failure(result, image_id, run_dir)
    log.info("image self-check passed: aiter and atom are the checked trees, the recipe's tools are there")
    return (run_dir / selfcheck.REPORT) if run_dir is not None else None


def recipe_tools_check(
    engine: EngineAPI,
    image_id: str,
    manifest: ContextManifest,
    settings: Settings,
    extra_labels: Mapping[str, str] | None,
    log: Logger,
) -> None:
    """The model's part of the self-check on an image it found: its recipe's tools are there."""
    if not settings.image.selfcheck or manifest.selfcheck is None:
        return
    require_recipe_tools(
        engine,
        image_id,
        [str(t) for t in manifest.selfcheck.get("tools", [])],
        [str(m) for m in manifest.selfcheck.get("modules", [])],
        model=manifest.model,
        inputs_digest=manifest.inputs_digest,
        log=log,
        labels=extra_labels,
    )


def require_recipe_tools(
    engine: EngineAPI,
    image_id: str,
    tools: list[str],
    modules: list[str],
    *,
    model: str,
    inputs_digest: str,
    log: Logger,
    labels: Mapping[str, str] | None = None,
) -> None:
    """`model`'s recipe tools must be in the image, which may have been built for another model of
    its pair. When they are not, the image is kept (it serves those models) and this model stops."""
    from pipeline.image import selfcheck

    fails = selfcheck.check_recipe_tools(engine, image_id, tools, modules, labels=labels)
    who = model or "this model"
    if fails:
        raise selfcheck.SelfCheckError(
            f"the image {image_id[:19]} (inputs digest {inputs_digest[:12]}) lacks what the recipe of "
            f"{who} runs:\n" + "\n".join(f"  - {f}" for f in fails),
            hint="The image is kept: it serves the other models of its pair. Have the image install the "
            "tool for every model (the template), or change the recipe's checks.",
        )
    if tools or modules:
        log.info(f"{who}'s recipe tools are in {image_id[:19]}: {', '.join([*tools, *modules])}")


def _attestations(
    run_dir: Path | None,
    builder: str,
    built: BuiltImage,
    manifest: ContextManifest,
    ref: str,
    selfcheck_report: Path | None,
    cache_from: str,
    metadata: Mapping[str, Any] | None = None,
    staging: str = "",
) -> Path | None:
    """attestations.json (none from this front end, and why) linking our own build provenance."""
    if run_dir is None:
        return None
    from pipeline.image import provenance

    statement = provenance.build_provenance(
        image_id=built.id,
        image_ref=ref,
        render_manifest=manifest.raw,
        builder=builder,
        selfcheck=selfcheck_report,
        cache_from=cache_from,
        steps=len(built.steps),
        cached_steps=built.cached_steps,
    )
    unsupported = (
        buildkit.ATTESTATIONS_UNSUPPORTED
        if builder.startswith("buildkit")
        else "not produced: the classic builder has no provenance (SLSA) or SBOM attestations"
    )
    attested: dict[str, Any] | None = None
    if builder.startswith("buildx"):
        digest = str((metadata or {}).get("containerimage.digest", ""))
        if staging and digest:
            attested = {"ref": f"{staging.rsplit(':', 1)[0]}@{digest}", "metadata": dict(metadata or {})}
        else:
            unsupported = (
                "not kept: buildx made provenance and SBOM attestations, but --load into the engine drops "
                "them; set [tag] registry so the build is pushed with them"
            )
    return provenance.write_build_attestations(
        run_dir, builder=builder, unsupported=unsupported, statement=statement, attested=attested
    )


def _push_cache(engine: EngineAPI, image_id: str, cache_ref: str, log: Logger) -> str:
    """Push the checked image (it carries the inline cache) as the model's build cache."""
    repo, tag = split_ref(cache_ref)
    try:
        engine.tag(image_id, repo, tag)
        digest = engine.push(repo, tag)
    except (TagError, InfraError) as e:
        log.warn(f"could not push the build cache to {cache_ref}: {e.message}")
        return ""
    log.info(f"build cache pushed to {cache_ref}@{digest}")
    return f"{cache_ref}@{digest}"


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
    from pipeline.oci.registry import RegistryClient, credentials_for, parse_image_ref

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


def _find(
    engine: EngineAPI,
    digest: str,
    ref: str,
    settings: Settings,
    env: Mapping[str, str],
    log: Logger,
    remote_lookup: RemoteLookup | None,
) -> tuple[str, str] | None:
    """(image ID, "local" or the registry reference) of an image with these inputs, now on the
    engine as the candidate; None when there is none to be had."""
    existing = sorted(engine.images_with_label(labels.INPUTS_DIGEST, digest), key=lambda i: i.id)
    if existing:
        info = existing[0]
        _ensure_tag(engine, info, ref)
        log.info(f"an image with inputs digest {digest[:12]} exists: {info.id[:19]}; nothing to build")
        return info.id, "local"
    lookup = remote_lookup if remote_lookup is not None else registry_lookup(settings, env, log)
    where = lookup(digest) if lookup is not None else None
    if where is None:
        return None
    log.info(f"the registry has an image with inputs digest {digest[:12]}: {where}; nothing to build")
    return _pull_found(engine, where, ref, env, log), where


def _pull_found(engine: EngineAPI, found: str, candidate: str, env: Mapping[str, str], log: Logger) -> str:
    """The registry holds the candidate: pull it by digest and tag it locally as the candidate."""
    from pipeline.oci.registry import credentials_for
    from pipeline.validate import image_reference

    ref = image_reference(found)
    creds = credentials_for(ref.registry, env)
    info = engine.pull(f"{ref.name}@{ref.digest}", auth_config=creds.auth_config if creds else None)
    repo, tag = split_ref(candidate)
    engine.tag(info.id, repo, tag)
    log.info(f"pulled {ref.name}@{ref.digest} as {candidate}: {info.id[:19]}")
    return info.id


def _push_candidate(
    engine: EngineAPI, settings: Settings, env: Mapping[str, str], candidate: str, log: Logger
) -> str:
    """Push the candidate tag to the target registry, where `registry_lookup` looks on the next run;
    `repo:tag@digest`, or "" (a warning) when the push failed."""
    from pipeline.errors import sentence
    from pipeline.oci.registry import credentials_for

    registry = settings.tag.registry.rstrip("/")
    repo, tag = split_ref(candidate)
    target = f"{registry}/{settings.image.repository}" if not repo.startswith(registry + "/") else repo
    creds = credentials_for(registry, env)
    try:
        if target != repo:
            engine.tag(candidate, target, tag)
        digest = engine.push(target, tag, auth_config=creds.auth_config if creds else None)
    except PipelineError as e:
        log.warn(
            f"could not push the candidate {target}:{tag}: {sentence(e.message)} The next run may rebuild it."
        )
        return ""
    log.detail(f"pushed candidate {target}:{tag}@{digest}")
    return f"{target}:{tag}@{digest}"
