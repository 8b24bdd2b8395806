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
@click.option(
    "--build-attestations",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The build's attestations.json (in its run directory): the record links the build provenance.",
)
@click.option("--docker-host", help="Docker engine to use (default: DOCKER_HOST or the local socket).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Check the verdict against the image and say what would be pushed and moved; push nothing.",
)
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
    build_attestations: Path | None,
    docker_host: str | None,
    dry_run: bool,
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
    from pipeline.release.tag import check_passed, read_tag_verdict
    from pipeline.stages import tag

    settings = app.settings(
        registry=registry,
        repository=repository,
        cosign=cosign,
        push_latest=push_latest,
        docker_host=docker_host,
    )
    if dry_run:
        _dry_run(app, image, verdict_path, lock_path, recipe_path, repository, as_json=as_json)
        return
    ctx = app.context("tag")
    # a missing, failed or self-contradicting verdict is refused before the engine or registry is asked
    with app.log.stage("verdict", str(verdict_path)):
        check_passed(read_tag_verdict(verdict_path), image, recipe_path)
    inputs = tag.Inputs(
        image=image,
        verdict=verdict_path,
        lock=lock_path,
        recipe=recipe_path,
        registry=settings.tag.registry,
        repository=settings.image.repository,
        tag=settings.tag,
        allow_older=allow_older,
        build_attestations=build_attestations,
    )
    try:
        with app.log.stage("tag", image) as rec:
            out = tag.run(ctx, inputs)
            rec.figure = f"{out.ref} @ {out.digest[:19]}"
    finally:
        ctx.close()
    if as_json:
        app.emit_json(
            {
                "immutable_ref": out.ref,
                "digest": out.digest,
                "moved": list(out.moved),
                "record_path": str(out.record),
                "pinned_ref": out.pinned_ref,
                "pushed": out.pushed,
                "attested": out.attested,
            }
        )
    else:
        app.echo(out.pinned_ref)
        for moved in out.moved:
            app.echo(f"  {moved} → {out.digest}")
        app.echo(f"record: {out.record}")


def _dry_run(
    app: App,
    image: str,
    verdict_path: Path,
    lock_path: Path | None,
    recipe_path: Path | None,
    repository: str | None,
    *,
    as_json: bool,
) -> None:
    """The binding checked as a tag would check it; no registry asked, nothing pushed or written."""
    from pipeline.errors import UsageError
    from pipeline.release.tag import check_passed, read_tag_verdict, release_plan

    settings = app.settings()
    check_passed(read_tag_verdict(verdict_path), image)
    if not settings.tag.registry:
        raise UsageError(
            "no registry is configured for the tag stage.",
            hint="Set [tag] registry in pipeline.toml, PIPELINE_REGISTRY, or pass --registry.",
        )
    ctx = app.context()
    try:
        plan = release_plan(
            ctx.engine(),
            image=image,
            verdict_path=verdict_path,
            lock=lock_path,
            recipe_path=recipe_path,
            settings=settings,
            registry=settings.tag.registry,
            repository=repository,
            log=app.log,
        )
    finally:
        ctx.close()
    immutable = f"{plan.target.name}:{plan.immutable}"
    moving = [f"{plan.target.name}:{m}" for m in plan.moving]
    if as_json:
        app.emit_json({"dry_run": True, "image_id": plan.image.id, "push": immutable, "move": moving})
        return
    app.echo(f"would push {immutable}  (image {plan.image.id[:19]}; kept if it already holds this image)")
    for ref in moving:
        app.echo(f"would move {ref} → the digest of {immutable} (forward only)")
    app.echo("dry run: nothing was pushed, moved or recorded.")
