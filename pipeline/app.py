"""The per-invocation context every command receives (as click's `ctx.obj`).

It holds the raw inputs (environment mapping, config file, verbosity), the
logger, and opens run directories. Settings are resolved on demand with the
command's own flag overrides, so the cascade is applied in one place.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline.log import Logger

if TYPE_CHECKING:  # pydantic costs a third of a second: `--help` and `--version` never load it
    from pipeline.config import Settings
    from pipeline.stages.base import Context


@dataclass
class App:
    env: Mapping[str, str]
    config_file: Path | None = None
    verbosity: int = 0
    log: Logger = field(default_factory=Logger)
    run_dir: Path | None = None
    _settings: Settings | None = None

    @classmethod
    def create(cls, *, config_file: Path | None, verbosity: int, env: Mapping[str, str] | None = None) -> App:
        env = dict(os.environ if env is None else env)
        log = Logger.from_env(env, verbosity=verbosity)  # (SECRET_ENV masked)
        return cls(env=env, config_file=config_file, verbosity=verbosity, log=log)

    def settings(self, **overrides: Any) -> Settings:
        """Resolve the cascade with this command's flags (None = flag not given)."""
        if self._settings is not None and all(v is None for v in overrides.values()):
            return self._settings
        from pipeline.config import load_settings

        s = load_settings(config_file=self.config_file, env=self.env, overrides=overrides)
        if self._settings is None:  # said once per invocation
            self._announce(s)
        self._settings = s
        return s

    def _announce(self, s: Settings) -> None:
        from pipeline.config import unknown_env

        for warning in unknown_env(self.env):
            self.log.warn(warning)
        if s.config_file and self.config_file is None and Path(s.config_file).parent != Path.cwd():
            self.log.info(f"configuration: {s.config_file} (found above the working directory)")

    def open_run(self, label: str, run_dir: Path | None = None) -> Path:
        """Create (or reuse) the run directory and send the full log there."""
        if run_dir is None:
            import secrets
            import time

            from pipeline.gc import prune_runs

            prune_runs(self.settings(), self.log)  # the default retention, before this run counts
            base = Path(self.settings().paths.runs_dir)
            stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
            run_dir = base / f"{stamp}-{label}-{secrets.token_hex(3)}"
        run_dir.mkdir(parents=True, exist_ok=True)
        self.run_dir = run_dir
        self.log.attach(run_dir)
        self.log.debug(f"run directory {run_dir}")
        return run_dir

    def discard_run(self) -> None:
        """Remove the run directory this command opened (a failed pin leaves no run behind)."""
        if self.run_dir is None:
            return
        import shutil

        self.log.close()
        self.log.log_file = None
        shutil.rmtree(self.run_dir, ignore_errors=True)
        self.run_dir = None

    def context(self, run: str | None = None, *, work_dir: Path | None = None) -> Context:
        """The stage Context of a single-stage command: its settings, log and environment.

        With `run`, the command keeps its files and full log in a new run directory
        (`runs/<date>-<run>-<id>`); else in `work_dir` (default: the current directory).
        """
        from pipeline.stages.base import Context

        work = (self.run_dir or self.open_run(run, work_dir)) if run is not None else (work_dir or Path.cwd())
        return Context(settings=self.settings(), log=self.log, env=self.env, work_dir=work)

    def emit_json(self, data: Any) -> None:
        """Machine-readable result on stdout (human output goes to stderr)."""
        import json

        sys.stdout.write(self.log.redact(json.dumps(data, indent=2, sort_keys=True, default=str)) + "\n")
        sys.stdout.flush()

    def echo(self, text: str) -> None:
        """Human-readable result on stdout."""
        click.echo(self.log.redact(text))


pass_app = click.make_pass_decorator(App)


def complete_model(
    ctx: click.Context, param: click.Parameter, incomplete: str
) -> list[click.shell_completion.CompletionItem]:
    """Shell completion for --model: the recipes in [paths] recipes_dir (as resolved here)."""
    from click.shell_completion import CompletionItem

    from pipeline.config import load_settings
    from pipeline.errors import PipelineError

    try:
        recipes = Path(load_settings(env=os.environ).paths.recipes_dir)
        names = sorted({p.stem for p in recipes.glob("*.y*ml")})
    except (PipelineError, OSError):
        return []
    return [CompletionItem(n) for n in names if n.startswith(incomplete)]
