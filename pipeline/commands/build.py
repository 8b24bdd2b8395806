"""`pipeline build` (stage not built yet)."""

import click

from pipeline.errors import NotImplementedStage


@click.command(name="build", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def command(args: tuple[str, ...]) -> None:
    """Run the whole chain for a model (pin → check → patch → render → build → smoke → tag),
    or, with --context DIR, build an already rendered context."""
    raise NotImplementedStage("build")
