"""`pipeline rebuild` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="rebuild", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Scheduled rebuild: move pins, rebuild what changed, report."""
    raise NotImplementedStage("rebuild")
