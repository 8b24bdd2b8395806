"""`pipeline rebuild`: what a scheduled CI job calls.

For each recipe: pin the configured refs (normally branch heads), run the
chain up to render, and compare the inputs digest with the one last released
for that model (`locks/<model>.released.json`, written after a successful tag).
Unchanged → nothing to do. Changed → build, smoke and tag in the same run.
If aiter's head breaks ATOM's head and the patch series does not fix it, fall
back to the newest compatible aiter (`pin --auto`'s search) and report the
break. Patches that became obsolete upstream are reported.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from pipeline.config import Settings
from pipeline.errors import ExitCode, IncompatibleError, PipelineError
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.orchestrate import BuildRequest, execute
from pipeline.stages import build, pin, render, tag
from pipeline.stages.tag import released_state_path

Outcome = Literal["released", "unchanged", "stopped", "failed"]


@dataclass
class ModelOutcome:
    model: str
    status: Outcome
    exit_code: int
    run_dir: str = ""
    atom: str = ""
    aiter: str = ""
    image: str = ""
    tag: str = ""
    notes: list[str] = field(default_factory=list)


def _read_released(settings: Settings, model: str) -> dict[str, Any]:
    p = released_state_path(Path(settings.paths.locks_dir), model)
    if not p.is_file():
        return {}
    data: dict[str, Any] = json.loads(p.read_text())
    return data


def obsolete_patches(settings: Settings, run_dir: Path) -> list[str]:
    """Patches the run's ATOM no longer needs: already upstream, or ATOM is past their range.

    (A patch that is only "not needed" for this aiter is not obsolete: another aiter may need it.)
    """
    from pipeline.patchq import PatchSeries, check_series
    from pipeline.sources import mirrors_for_lock

    lock = Lock.load(run_dir / "lock.toml")
    atom, aiter = mirrors_for_lock(settings, lock)
    notes = []
    for c in check_series(
        PatchSeries.load(Path(settings.paths.patches_dir)), atom, lock.atom.sha, aiter, lock.aiter.sha
    ):
        end = c.patch.atom_range.end
        end_sha = atom.rev_parse(end) if end else None
        past = end_sha is not None and atom.is_ancestor(end_sha, lock.atom.sha)
        if c.status == "already-upstream" or (c.status == "not-needed" and past):
            notes.append(f"patch {c.patch.name} is obsolete ({c.reason}): drop it from the series")
    return notes


def rebuild_model(
    model: str, settings: Settings, log: Logger, env: Mapping[str, str], *, registry: str | None
) -> ModelOutcome:
    released = _read_released(settings, model)
    req = BuildRequest(model=model, until="render", registry=registry)
    notes: list[str] = []
    result = execute(req, settings, log, env)
    if isinstance(result.error, IncompatibleError):
        # aiter's head breaks ATOM even with our patches: fall back to the newest aiter that
        # does not (`pin --auto`), and say which aiter commit broke it.
        broken = Lock.load(result.run_dir / "lock.toml")
        log.warn(f"{model}: {result.error.message.splitlines()[0]}")
        req = BuildRequest(
            model=model, atom_ref=broken.atom.ref, until="render", registry=registry, auto_aiter=True
        )
        result = execute(req, settings, log, env)
        pinned = result.output("pin", pin.Outputs)
        auto = pinned.auto if pinned is not None else None
        if auto is not None and auto.newest_compatible is not None:
            brk = auto.first_breaking
            notes.append(
                f"aiter {broken.aiter.sha[:10]} breaks ATOM {broken.atom.sha[:9]}"
                + (f"; first breaking aiter commit {brk.sha[:10]} ({brk.subject!r})" if brk else "")
                + f"; fell back to aiter {auto.newest_compatible.sha[:10]} (newest compatible)"
            )
    if result.error is not None:
        raise result.error
    notes += obsolete_patches(settings, result.run_dir)
    rendered = result.output("render", render.Outputs)
    pinned = result.output("pin", pin.Outputs)
    if rendered is None or pinned is None:
        raise PipelineError(f"internal: the run for {model} ended without a render result.")
    outcome = ModelOutcome(
        model, "unchanged", 0, str(result.run_dir), pinned.lock.atom.sha, pinned.lock.aiter.sha
    )
    outcome.notes = notes
    if released.get("inputs_digest") == rendered.inputs_digest:
        outcome.tag = str(released.get("ref", ""))
        outcome.notes.append(f"inputs digest {rendered.inputs_digest[:12]} already released as {outcome.tag}")
        return outcome
    # Changed: the same run goes on through build, smoke and tag.
    resumed = execute(
        BuildRequest(model=model, resume=result.run_dir, until="tag", registry=registry), settings, log, env
    )
    built = resumed.output("build", build.Outputs)
    outcome.image = built.image if built is not None else ""
    if resumed.error is not None:
        outcome.status, outcome.exit_code = "stopped", int(resumed.error.exit_code)
        outcome.notes.append(str(resumed.error))
        return outcome
    tagged = resumed.output("tag", tag.Outputs)
    if tagged is None:  # never call a model released unless the tag stage says so
        raise PipelineError(f"internal: the run for {model} ended without a tag stage result.")
    outcome.status = "released"
    outcome.tag = tagged.ref
    return outcome


def rebuild(
    models: list[str], settings: Settings, log: Logger, env: Mapping[str, str], *, registry: str | None
) -> list[ModelOutcome]:
    outcomes = []
    for model in models:
        try:
            outcomes.append(rebuild_model(model, settings, log, env, registry=registry))
        except PipelineError as e:
            outcomes.append(ModelOutcome(model, "failed", int(e.exit_code), notes=[str(e)]))
    return outcomes


def summary_markdown(outcomes: list[ModelOutcome]) -> str:
    icon = {"released": "✅", "unchanged": "⏸", "stopped": "⚠️", "failed": "❌"}
    rows = ["| model | result | ATOM | aiter | tag | notes |", "|---|---|---|---|---|---|"]
    for o in outcomes:
        notes = "<br>".join(n.splitlines()[0] if n else n for n in o.notes)
        rows.append(
            f"| {o.model} | {icon.get(o.status, '')} {o.status} (exit {o.exit_code}) | {o.atom[:9]} | "
            f"{o.aiter[:10]} | {o.tag} | {notes} |"
        )
    return "### pipeline rebuild\n\n" + "\n".join(rows) + "\n"


def overall_exit(outcomes: list[ModelOutcome]) -> int:
    codes = [o.exit_code for o in outcomes if o.exit_code]
    if not codes:
        return int(ExitCode.OK)
    # Anything but "no GPUs here" wins; a run that only lacked GPUs reports that.
    real = [c for c in codes if c != ExitCode.NO_HARDWARE]
    return max(real) if real else int(ExitCode.NO_HARDWARE)
