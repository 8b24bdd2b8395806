"""`pipeline build`: build a rendered context (`--context DIR`); the end-to-end chain comes later."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.config import Settings
from pipeline.dockerw import Engine
from pipeline.errors import InfraError, NotImplementedStage, TagError, UsageError
from pipeline.imagebuild import BuildOutcome, RemoteLookup, build_image
from pipeline.log import Logger
from pipeline.render import candidate_tag


def registry_lookup(settings: Settings, env: dict[str, str], log: Logger) -> RemoteLookup | None:
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


@click.command(name="build")
@click.option("--model", help="Run the whole chain for this model (pin → … → tag). Not built yet.")
@click.option("--context", "context_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Build this rendered context (from `pipeline render`).")  # fmt: skip
@click.option("--tag", help="Tag for the built image (default: <repository>:candidate-<inputs digest 12>).")
@click.option("--docker-host", help="Docker engine, e.g. ssh://user@host (default: $DOCKER_HOST or local).")
@click.option("--no-cache", "nocache", is_flag=True, help="Do not use the engine's build cache.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def command(
    app: App,
    model: str | None,
    context_dir: Path | None,
    tag: str | None,
    docker_host: str | None,
    nocache: bool,
    as_json: bool,
) -> None:
    """Run the whole chain for a model (pin → check → patch → render → build → smoke → tag),
    or, with --context DIR, build an already rendered context.

    \b
    An image that already carries the context's inputs digest is not rebuilt.
    The full build log is written to the run directory.
    """
    if context_dir is None:
        if model is None:
            raise UsageError(
                "pass --model MODEL (the whole chain) or --context DIR (build a rendered context)."
            )
        raise NotImplementedStage("build --model (end-to-end)")
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
