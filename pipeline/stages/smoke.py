"""smoke: serve the model's recipe from the image on MI355 and gate on what it really answers.

Chat, GSM8K through lm_eval, the serving benchmark (pipeline.smoke); the verdict
is bound to the image, recipe and the model's lock (whose pair the image's label names). No
GPUs here stops a run (not a failure): the image stays a candidate and the hint says how to
finish on a GPU host.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pipeline.errors import NoHardware, PipelineError
from pipeline.stages import build as build_stage
from pipeline.stages.base import Context, StageData, Upstream
from pipeline.stages.spec import BuildSpec

if TYPE_CHECKING:
    from pipeline.oci.engine import EngineAPI

NAME = "smoke"
STOPS: tuple[type[Exception], ...] = (NoHardware,)


class Inputs(StageData):
    image: str  # the candidate by digest (`REPO@sha256:…`, pulled when absent), an image ID or a reference
    candidate: str = ""  # the tag to name in hints (the candidate)
    model: str
    recipe: Path
    # the model's lock: verified where the mirrors are, bound to the image's pair label, and
    # recorded in the verdict
    lock: Path | None = None
    out_dir: Path  # verdict.json, summary.md, junit.xml, server logs
    run_all: bool = False
    quick: bool = False
    gsm8k_limit: int | None = None
    bench_concurrencies: tuple[int, ...] | None = None
    bench_tolerance: float | None = None
    ready_timeout_s: float | None = None
    preflight_via: Literal["auto", "local", "container"] = "auto"
    labels: tuple[tuple[str, str], ...] = ()
    docker_host: str = ""  # recorded so a run on another engine is a different run


class Outputs(StageData):
    verdict: Path
    passed: bool
    reason: str
    # what the smoke test ran, resolved once at its start: `REPO@sha256:…`, else the image ID
    image: str = ""
    resolved_from: str = ""  # the tag it was given, when it was given one

    def figure(self) -> str:
        return "all gates passed" if self.passed else self.reason


def plan(ctx: Context, spec: BuildSpec, up: Upstream) -> Inputs:
    built = up.get("build", build_stage.Outputs)
    return Inputs(
        image=built.candidate or built.image,
        candidate=built.ref,
        model=spec.model,
        recipe=spec.recipe_path,
        lock=ctx.work_dir / "lock.toml",
        out_dir=ctx.work_dir / "smoke",
        run_all=ctx.settings.smoke.run_all_checks,
        docker_host=ctx.settings.smoke.docker_host,
    )


def reads(ctx: Context, inputs: Inputs) -> Iterable[Path]:
    return [inputs.recipe, *([inputs.lock] if inputs.lock is not None else [])]


def by_digest(ctx: Context, engine: EngineAPI, image: str) -> str:
    """`image` resolved once to what it is now, so that nothing later reads a name that may move:
    a `REPO@sha256:…` or an image ID as given; a tag, to the registry's manifest digest when the
    name has a registry (`host[:port]/…`; not Docker Hub, never asked) that holds it, else to the
    engine's digest of that repository (`RepoDigests`), else to the image ID."""
    from pipeline.oci.ref import DIGEST_RE, DOCKER_HUB_ALIASES
    from pipeline.oci.registry import RegistryClient, credentials_for
    from pipeline.validate import image_reference

    if "@sha256:" in image or DIGEST_RE.match(image) or _is_short_id(image):
        return image
    ref = image_reference(image, what="--image")
    if ref.registry not in DOCKER_HUB_ALIASES:
        client = RegistryClient(ref.registry, credentials=credentials_for(ref.registry, ctx.env), retries=1)
        try:
            digest = client.manifest_digest(ref.repository, ref.reference)
        except PipelineError as e:
            ctx.log.warn(f"could not ask {ref.registry} for {image} ({e.message}); using the engine's image")
            digest = None
        if digest:
            pinned = f"{ref.name}@{digest}"
            ctx.log.info(f"{image} is {pinned} in its registry; the smoke test runs that digest")
            return pinned
    info = engine.image(image)
    if info is None:
        return image  # the smoke test says it is absent, and how to give it
    held = [image_reference(d) for d in info.digests if "@" in d]
    pinned = next((f"{ref.name}@{d.digest}" for d in held if d.name == ref.name), info.id)
    ctx.log.info(f"{image} is {pinned} on the engine; the smoke test runs that")
    return pinned


def _is_short_id(image: str) -> bool:
    return 12 <= len(image) <= 64 and all(c in "0123456789abcdef" for c in image)


def on_engine(ctx: Context, engine: EngineAPI, image: str) -> str:
    """`image`, and when it is a `REPO@sha256:…` reference: pulled by that digest if the engine lacks
    it, and verified to be that digest before anything starts (the tag may have moved meanwhile;
    the digest cannot)."""
    if "@sha256:" not in image:
        return image
    from pipeline.errors import UsageError
    from pipeline.oci.registry import credentials_for
    from pipeline.validate import image_reference

    ref = image_reference(image, what="--image")
    info = engine.image(image)
    if info is None:
        creds = credentials_for(ref.registry, ctx.env)
        ctx.log.info(f"{image} is not on the engine; pulling it by digest")
        info = engine.pull(f"{ref.name}@{ref.digest}", auth_config=creds.auth_config if creds else None)
    held = {(r.name, r.digest) for r in (image_reference(d) for d in info.digests if "@" in d)}
    if (ref.name, ref.digest) not in held:
        raise UsageError(
            f"the image the engine has for {image} is not that digest (it has "
            + (", ".join(sorted(info.digests)) or "no registry digest")
            + "); nothing was started.",
            hint="Remove the image from that engine (`docker image rm`) and run again: it is pulled "
            "by digest.",
        )
    ctx.log.detail(f"{image} is image {info.id[:19]}")
    return image


def _bind_lock(engine: EngineAPI, image: str, lock: Path) -> None:
    """The lock pins the image's pair, checked before run_smoke moves an earlier smoke run aside."""
    from pipeline.stages.verify import bind_lock

    info = engine.image(image)
    if info is not None:  # else the smoke test says the image is absent, and how to give it
        bind_lock(lock, info.labels or {}, image, done="nothing was started")


def run(ctx: Context, inputs: Inputs) -> Outputs:
    from pipeline.errors import SmokeFailed
    from pipeline.lock import Lock
    from pipeline.recipes.recipe import load_recipe
    from pipeline.smoke import SmokeOptions, run_smoke
    from pipeline.smoke.verdict import VERDICT_FILE

    recipe = load_recipe(inputs.recipe, allowed_secrets=ctx.settings.recipe_secrets)
    options = SmokeOptions(
        run_all=inputs.run_all,
        quick=inputs.quick,
        gsm8k_limit=inputs.gsm8k_limit,
        bench_concurrencies=inputs.bench_concurrencies,
        bench_tolerance=inputs.bench_tolerance,
        ready_timeout_s=inputs.ready_timeout_s,
        preflight_via=inputs.preflight_via,
        labels=dict(inputs.labels),
    )
    engine = ctx.engine(inputs.docker_host)
    image = by_digest(ctx, engine, inputs.image)
    if inputs.lock is not None:
        from pipeline.stages.verify import verify_here

        verify_here(ctx, inputs.lock, lock_given=False, stage="smoke")
    image = on_engine(ctx, engine, image)
    if inputs.lock is not None:
        _bind_lock(engine, image, inputs.lock)
    try:
        verdict = run_smoke(
            engine,
            image=image,
            recipe=recipe,
            recipe_path=inputs.recipe,
            settings=ctx.settings_with(
                smoke={"docker_host": inputs.docker_host, "run_all_checks": inputs.run_all}
            ),
            env=ctx.env,
            run_dir=inputs.out_dir,
            log=ctx.log,
            options=options,
            lock=Lock.load(inputs.lock) if inputs.lock is not None else None,
        )
    except NoHardware as e:
        if ctx.resume_command:
            ref = image if "@sha256:" in image else (inputs.candidate or image)
            e.hint = (
                f"The image is kept as an untagged candidate ({ref}). Smoke it on an MI355 host with "
                f"`pipeline smoke --image {ref} --model {inputs.model}"
                + (f" --lock {inputs.lock}" if inputs.lock is not None else "")
                + " --docker-host ssh://USER@GPU-HOST`, "
                f"then run `{ctx.resume_command}`."
            )
        raise
    path = inputs.out_dir / VERDICT_FILE
    summary = inputs.out_dir / "summary.md"
    if summary.is_file():
        ctx.log.publish_summary(f"smoke {recipe.name}", summary.read_text(encoding="utf-8"))
    if not verdict.passed:
        raise SmokeFailed(
            f"smoke test of {inputs.image} with {recipe.name} failed: {verdict.reason}.",
            hint=f"Verdict, summary and server log: {path}, {summary}, {inputs.out_dir / 'server.log'}.",
        )
    ctx.log.info(f"smoke test passed: {verdict.reason}; verdict {path}")
    resolved_from = inputs.image if image != inputs.image else ""
    return Outputs(verdict=path, passed=True, reason=verdict.reason, image=image, resolved_from=resolved_from)
