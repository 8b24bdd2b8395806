"""`pipeline render` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="render", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Render the Dockerfile and build context from the templates."""
    raise NotImplementedStage("render")
