"""`pipeline tag` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="tag", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Tag and push a verified image by digest."""
    raise NotImplementedStage("tag")
