"""`pipeline check` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="check", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Check every ATOM call of an aiter function against aiter's signatures."""
    raise NotImplementedStage("check")
