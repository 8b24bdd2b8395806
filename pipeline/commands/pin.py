"""`pipeline pin` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="pin", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Resolve ATOM and aiter refs to full SHAs and write the lock file."""
    raise NotImplementedStage("pin")
