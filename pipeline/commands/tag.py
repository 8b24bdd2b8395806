"""`pipeline tag`: tag and push a verified image by digest, with a verification record."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, pass_app


@click.command(name="tag")
@click.option("--image", required=True, help="The local image to tag (reference or ID).")
@click.option(
    "--verdict",
    "verdict_path",
    required=True,
    type=click.Path(path_type=Path),
    help="The smoke verdict (verdict.json, or its run directory); the record is written next to it.",
)
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The lock file the image was built from (default: locks/<model>.toml).",
)
@click.option(
    "--recipe",
    "recipe_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The recipe the image was smoke-tested with (default: the one the verdict names).",
)
@click.option("--registry", help="Registry host[:port] to push to (setting [tag] registry).")
@click.option("--repository", help="Repository to push to (setting [image] repository).")
@click.option(
    "--cosign/--no-cosign",
    default=None,
    help="Attest the record to the pushed digest with cosign (setting [tag] cosign).",
)
@click.option(
    "--push-latest/--no-push-latest",
    default=None,
    help="Also move `latest` (setting [tag] push_latest).",
)
@click.option(
    "--allow-older",
    is_flag=True,
    help="Move the moving tags even onto an image older than the one they hold (said loudly).",
)
@click.option("--docker-host", help="Docker engine to use (default: DOCKER_HOST or the local socket).")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def command(
    app: App,
    image: str,
    verdict_path: Path,
    lock_path: Path | None,
    recipe_path: Path | None,
    registry: str | None,
    repository: str | None,
    cosign: bool | None,
    push_latest: bool | None,
    allow_older: bool,
    docker_host: str | None,
    as_json: bool,
) -> None:
    """Tag and push a verified image by digest.

    \b
    Refuses unless the smoke verdict passed and is bound to this image, its
    recipe and its lock file. Pushes the immutable tag first, reads its digest
    back from the registry, writes record.json next to the verdict, and only
    then moves the moving tags (e.g. <model>-verified) to that digest, forward
    only (by the image's created date; --allow-older to go back).
    Credentials: PIPELINE_REGISTRY_USER / PIPELINE_REGISTRY_PASSWORD or the
    Docker config; never printed.
    """
    from pipeline.dockerw import Engine
    from pipeline.tag import check_passed, read_tag_verdict, tag_verified

    settings = app.settings(registry=registry, repository=repository, cosign=cosign, push_latest=push_latest)
    app.open_run("tag")
    # a missing or failed verdict is refused before reaching for the engine or the registry
    with app.log.stage("verdict", str(verdict_path)):
        check_passed(read_tag_verdict(verdict_path), image)
    engine = Engine.connect(docker_host or settings.smoke.docker_host or None, env=app.env, log=app.log)
    try:
        with app.log.stage("tag", image) as rec:
            result = tag_verified(
                engine,
                image=image,
                verdict_path=verdict_path,
                lock=lock_path,
                recipe_path=recipe_path,
                settings=settings,
                registry=None,  # already folded into settings above
                log=app.log,
                env=app.env,
                allow_older=allow_older,
            )
            rec.figure = f"{result.immutable_ref} @ {result.digest[:19]}"
    finally:
        engine.close()
    if as_json:
        app.emit_json(result.as_json())
    else:
        app.echo(result.pinned_ref)
        for tag in result.moved:
            app.echo(f"  {tag} → {result.digest}")
        app.echo(f"record: {result.record_path}")
