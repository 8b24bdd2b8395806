"""The `pipeline` command line. The only place that catches our errors.

The commands are the stages of `pipeline.stages.TABLE` (in stage order), each
a thin click layer in `pipeline/commands/<stage>.py` that parses flags into the
stage's Inputs and calls the stage's `run`, plus `rebuild`. The library raises
`PipelineError`s and `main()` turns them into a message and the documented exit code.
Nothing heavy is imported until a command runs: `--help` and `--version` stay fast.
"""

from __future__ import annotations

import errno
import importlib
import os
import signal
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline import __version__
from pipeline.errors import (
    EXIT_CODES,
    ExitCode,
    PipelineError,
    UsageError,
    disk_error,
    interrupted,
    on_sigterm,
)
from pipeline.stages import TABLE

if TYPE_CHECKING:
    from pipeline.app import App  # imported when a command runs: `--help` needs no logger

# command name -> one-line help; each command is `command` in pipeline/commands/<name>.py
COMMANDS: dict[str, str] = {
    **{name: entry.help for name, entry in TABLE.items()},
    "rebuild": "The scheduled job: move the pins, rebuild what changed, report.",
    "impact": "Which ATOM calls an aiter change (base..head) breaks, on which model's path.",
    "recipe": "Import upstream ATOM recipes (recipes/*.md) and report their drift.",
    "gc": "Remove old runs, locks nobody holds and refs/pins/* no lock file names.",
    "config": "Show the resolved settings and where each came from (default, file, environment, flag).",
}
COMPLETE_VAR = "_PIPELINE_COMPLETE"  # click's standard: eval "$(_PIPELINE_COMPLETE=bash_source pipeline)"


class _LazyGroup(click.Group):
    """Imports a command's module only when that command runs (fast `--help`)."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in COMMANDS:
            return None
        mod = importlib.import_module(f"pipeline.commands.{cmd_name}")
        command: click.Command = mod.command
        return command

    def resolve_command(
        self, ctx: click.Context, args: list[str]
    ) -> tuple[str | None, click.Command | None, list[str]]:
        name = args[0] if args else ""
        if name and not name.startswith("-") and name not in COMMANDS and not ctx.resilient_parsing:
            import difflib

            near = difflib.get_close_matches(name, list(COMMANDS), n=1, cutoff=0.6)
            ctx.fail(
                f"No such command {name!r}." + (f" Did you mean {near[0]!r}?" if near else "")
                + " `pipeline --help` lists the commands."
            )  # fmt: skip
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # the help lines come from the table: listing the commands imports none of them
        with formatter.section("Commands"):
            formatter.write_dl(list(COMMANDS.items()))

    def format_epilog(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        super().format_epilog(ctx, formatter)
        from pipeline import envvars  # read when help is shown, not at start-up

        with formatter.section("Configuration"):
            formatter.write_text(envvars.SOURCES)
        with formatter.section("Environment"):
            rows = [
                (f"{envvars.ENV_PREFIX}{key.upper()}", f"[{section}] {key}")
                for section, keys in envvars.settings_by_section().items()
                for key in keys
            ]
            formatter.write_dl(rows + list(envvars.OTHER_ENV.items()))
            formatter.write_text(
                f'Shell completion (bash, zsh, fish): eval "$({COMPLETE_VAR}=bash_source pipeline)"; '
                "zsh_source, fish_source for the others."
            )


def _exit_code_help() -> str:
    return "\n".join(f"  {int(code):>3}  {text}" for code, text in EXIT_CODES.items())


@click.group(
    cls=_LazyGroup,
    context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
    epilog="\b\nExit codes:\n" + _exit_code_help(),
)
@click.version_option(__version__, "--version", prog_name="atom-image-pipeline")
@click.option(
    "--config",
    "config_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Project configuration file (default: ./pipeline.toml if present).",
)
@click.option(
    "-v",
    "--verbose",
    count=True,
    help="More output (-vv for debug). Full logs are always in the run directory.",
)
@click.option(
    "--progress",
    type=click.Choice(["auto", "plain", "tty"]),
    default="auto",
    show_default=True,
    help="Progress output: a live display on a terminal (auto), plain lines (plain, as in CI), or "
    "live even when not detected (tty). Stage marks fall back to ASCII where ✓ ✕ ↷ cannot show.",
)
@click.pass_context
def cli(ctx: click.Context, config_file: Path | None, verbose: int, progress: str) -> None:
    """Ship ROCm ATOM images whose ATOM and aiter are proven compatible.

    \b
    The main job:   pipeline build --model MiniMax-M3-MXFP4
    Stages:         pin → patch → check → render → build → smoke → tag
    """
    from pipeline import progress as progress_mod
    from pipeline.app import App

    progress_mod.MODE = progress
    app = App.create(config_file=config_file, verbosity=verbose)
    ctx.obj = app
    _CURRENT.append(app)
    if ctx.invoked_subcommand is not None and not {"--help", "-h"} & set(_ARGV):
        app.settings()  # fail fast on a bad configuration, before any work


# The App and argv of the invocation in progress (error reporting; help needs no config).
_CURRENT: list[App] = []
_ARGV: list[str] = []


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; returns the exit code (never raises)."""
    if hasattr(signal, "SIGTERM"):
        signal.signal(signal.SIGTERM, on_sigterm)
    _CURRENT.clear()
    _ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    instruction = os.environ.get(COMPLETE_VAR)
    if instruction:  # click's standard shell completion (main() drives the context itself)
        from click.shell_completion import shell_complete

        return shell_complete(cli, {}, "pipeline", COMPLETE_VAR, instruction)
    try:
        ctx = cli.make_context("pipeline", list(_ARGV))
        with ctx:
            cli.invoke(ctx)
        return 0
    except click.exceptions.Exit as e:
        return int(e.exit_code)
    except click.ClickException as e:
        e.show()
        return int(ExitCode.USAGE)
    except (click.exceptions.Abort, KeyboardInterrupt):
        return _report(interrupted())
    except PipelineError as e:
        return _report(e)
    except OSError as e:
        if e.errno == errno.ENAMETOOLONG:  # only a given path or name can be that long: bad input
            return _report(too_long(e))
        disk = disk_error(e)
        if disk is not None:  # a full or read-only disk is not a bug: its own error and exit code
            return _report(disk)
        return _bug()
    except Exception:
        return _bug()
    finally:
        if _CURRENT:
            _CURRENT[-1].log.close()


def _bug() -> int:
    """A bug: keep the traceback in the log, short note on screen."""
    import traceback

    tb = traceback.format_exc()
    if _CURRENT:
        _CURRENT[-1].log.debug(tb)
    click.echo(tb, err=True)
    click.echo("error: internal error in atom-image-pipeline (a bug); please report it.", err=True)
    return int(ExitCode.INTERNAL)


def too_long(e: OSError) -> UsageError:
    name = str(e.filename) if e.filename is not None else ""
    from pipeline.fsutil import path_problem, shorten  # imported on this path only: fast start-up

    problem = path_problem(Path(name)) if name else None
    return UsageError(
        f"the path {shorten(name)} cannot be used: {problem or 'it is too long for the file system'}.",
        hint="Give a shorter path (flags, pipeline.toml or PIPELINE_* variables).",
    )


def _report(err: PipelineError) -> int:
    if _CURRENT:  # (the plain `pipeline check` without the CLI ends the same way: pipeline.plaincheck)
        return _CURRENT[-1].log.report(err)
    click.echo(f"error: {err}", err=True)
    return int(err.exit_code)
