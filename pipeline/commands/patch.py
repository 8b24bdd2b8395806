"""`pipeline patch` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="patch", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """List, check, apply and export the ATOM patch series."""
    raise NotImplementedStage("patch")
