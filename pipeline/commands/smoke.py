"""`pipeline smoke` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="smoke", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Smoke-test an image with a model recipe on MI355 GPUs."""
    raise NotImplementedStage("smoke")
