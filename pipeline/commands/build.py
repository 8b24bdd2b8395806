"""`pipeline build`: the whole chain for a model (`--model`), or one rendered context (`--context DIR`)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.dockerw import Engine
from pipeline.errors import UsageError
from pipeline.imagebuild import BuildOutcome, build_image, registry_lookup
from pipeline.orchestrate import BuildRequest, RunResult, execute
from pipeline.runs import STAGE_ORDER


def build_context_command(
    app: App,
    context_dir: Path,
    *,
    tag: str | None = None,
    docker_host: str | None = None,
    nocache: bool = False,
    run_dir: Path | None = None,
) -> BuildOutcome:
    """Build an already rendered context; what `pipeline build --context DIR` does.

    The orchestrator calls this with its own run directory.
    """
    settings = app.settings(docker_host=docker_host)
    if run_dir is None:
        run_dir = app.run_dir or app.open_run("build")
    with app.log.stage("build", str(context_dir)) as rec:
        engine = Engine.connect(settings.smoke.docker_host or None, env=app.env)
        try:
            outcome = build_image(
                engine,
                context_dir,
                tag=tag,
                log=app.log,
                run_dir=run_dir,
                remote_lookup=registry_lookup(settings, dict(app.env), app.log),
                nocache=nocache,
            )
        finally:
            engine.close()
        if outcome.skipped:
            rec.status = "skipped"
            rec.figure = f"exists: {outcome.image_id[:19] or outcome.found_in}"
        else:
            rec.figure = f"{outcome.cached_steps}/{outcome.steps} steps cached"
    return outcome


def _summary_table(result: RunResult | None, app: App) -> str:
    rows = [("stage", "status", "duration", "figure")]
    for rec in app.log.stages:
        rows.append((rec.name, rec.status, f"{rec.seconds:.1f}s", rec.figure))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    return "\n".join(lines)


@click.command(name="build")
@click.option("--model", help="Run the whole chain for this model (recipes/<model>.yaml).")
@click.option("--context", "context_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Only build this rendered context (from `pipeline render`).")  # fmt: skip
@click.option("--atom", "atom_ref", help="ATOM ref to pin (default: [sources] atom_ref).")
@click.option("--aiter", "aiter_ref", help="aiter ref to pin (default: [sources] aiter_ref).")
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository.")
@click.option("--aiter-repo", metavar="URL|PATH", help="aiter repository.")
@click.option("--base-image", help="Base image reference (default: [image] base_image).")
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Build exactly this lock file instead of pinning.")  # fmt: skip
@click.option("--from", "from_stage", type=click.Choice(STAGE_ORDER), help="First stage to run.")
@click.option("--until", type=click.Choice(STAGE_ORDER), help="Last stage to run.")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Resume this run directory: stages done for the same inputs are skipped.")  # fmt: skip
@click.option("--registry", help="Registry to push verified tags to (default: [tag] registry).")
@click.option(
    "--offline",
    is_flag=True,
    help="No network for pin: local-path sources are mirrored, URLs read from existing mirrors, no "
    "registry asked ([sources] offline).",
)
@click.option("--tag", help="With --context: tag for the built image.")
@click.option("--docker-host", help="Docker engine, e.g. ssh://user@host (default: $DOCKER_HOST or local).")
@click.option("--no-cache", "nocache", is_flag=True, help="With --context: do not use the build cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def command(
    app: App,
    model: str | None,
    context_dir: Path | None,
    atom_ref: str | None,
    aiter_ref: str | None,
    atom_repo: str | None,
    aiter_repo: str | None,
    base_image: str | None,
    lock_file: Path | None,
    from_stage: str | None,
    until: str | None,
    resume: Path | None,
    registry: str | None,
    offline: bool,
    tag: str | None,
    docker_host: str | None,
    nocache: bool,
    as_json: bool,
) -> None:
    """Run the whole chain for a model (pin → check → patch → render → build → smoke → tag),
    or, with --context DIR, build an already rendered context.

    \b
    Everything goes into a run directory (runs/<date>-<model>-<id>/): the spec, the lock,
    each stage's log and result, the Dockerfile, the verdict and the record. A rerun with
    --resume skips what already succeeded for the same inputs and starts at the failure.
    Without MI355 GPUs the run stops after build (exit 9) with the image kept as a candidate.
    """
    if context_dir is not None:
        _build_context(app, context_dir, tag=tag, docker_host=docker_host, nocache=nocache, as_json=as_json)
        return
    if model is None and resume is None:
        raise UsageError("pass --model MODEL (the whole chain) or --context DIR (build a rendered context).")
    settings = app.settings(
        atom_repo=atom_repo, aiter_repo=aiter_repo, docker_host=docker_host, registry=registry
    )
    req = BuildRequest(
        model=model or "",
        atom_ref=atom_ref,
        aiter_ref=aiter_ref,
        base_image=base_image,
        lock=lock_file,
        from_stage=from_stage,
        until=until,
        resume=resume,
        docker_host=docker_host,
        registry=registry,
        offline=offline,
    )
    result: RunResult | None = None
    try:
        result = execute(req, settings, app.log, app.env)
    finally:
        table = _summary_table(result, app)
        app.log.info("\n" + table)
        title = f"pipeline build {model or resume}"
        app.log.publish_summary(title)
    if as_json:
        app.emit_json(
            {
                "run_dir": str(result.run_dir),
                "stages": [s.__dict__ for s in result.states],
                "stopped": str(result.error) if result.error else None,
            }
        )
    if result.error is not None:
        raise result.error


def _build_context(
    app: App, context_dir: Path, *, tag: str | None, docker_host: str | None, nocache: bool, as_json: bool
) -> None:
    outcome = build_context_command(app, context_dir, tag=tag, docker_host=docker_host, nocache=nocache)
    if as_json:
        app.emit_json(
            {
                "image_id": outcome.image_id,
                "image_ref": outcome.image_ref,
                "skipped": outcome.skipped,
                "found_in": outcome.found_in,
                "inputs_digest": outcome.inputs_digest,
                "steps": outcome.steps,
                "cached_steps": outcome.cached_steps,
                "aiter_cached": outcome.aiter_cached,
                "log": str(outcome.log_path) if outcome.log_path else None,
            }
        )
    else:
        state = "exists (not rebuilt)" if outcome.skipped else "built"
        app.echo(f"{outcome.image_ref}  {outcome.image_id[:19]}  {state}")
