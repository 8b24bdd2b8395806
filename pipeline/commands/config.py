"""`pipeline config`: the resolved settings, each with where it came from (as `git config --show-origin`)."""

from __future__ import annotations

import click

from pipeline.app import App, pass_app


@click.command(name="config")
@click.option("--json", "as_json", is_flag=True, help="Print the settings as JSON on stdout.")
@pass_app
def command(app: App, as_json: bool) -> None:
    """Show every setting as resolved here, and its origin.

    \b
    Origins: default (the packaged defaults.toml), the project file's path,
    env PIPELINE_<KEY>, or flag. The project file is --config FILE, else the
    first pipeline.toml from the working directory up to the repository root.
    """
    from pipeline.config import SECTIONS

    settings = app.settings()
    rows = [
        (section, key, value, settings.origins.get(key, "default"))
        for section in SECTIONS
        for key, value in getattr(settings, section).model_dump().items()
    ]
    if as_json:
        app.emit_json(
            {
                "config_file": settings.config_file or None,
                "settings": {
                    section: {k: {"value": v, "origin": o} for s, k, v, o in rows if s == section}
                    for section in SECTIONS
                },
            }
        )
        return
    app.echo(f"# configuration file: {settings.config_file or 'none (defaults, environment and flags)'}")
    width = max(len(f"{s}.{k}") for s, k, _, _ in rows)
    for section, key, value, origin in rows:
        app.echo(f"{f'{section}.{key}':<{width}}  {_shown(value):<40}  {origin}")


def _shown(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return ",".join(str(v) for v in value) or '""'
    return str(value) if value != "" else '""'
