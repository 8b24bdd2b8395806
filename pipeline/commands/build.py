"""`pipeline build`: the whole chain for a model (`--model`), or one rendered context (`--context DIR`)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import TYPE_CHECKING

import click

from pipeline.app import App, complete_model, pass_app
from pipeline.errors import PipelineError, UsageError
from pipeline.stages import STAGE_ORDER

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.orchestrate import BuildRequest


def _summary_table(app: App) -> str:
    rows = [("stage", "status", "duration", "figure")]
    for rec in app.log.stages:
        rows.append((rec.name, rec.status, f"{rec.seconds:.1f}s", rec.figure))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]:>{widths[2]}}  {r[3]}" for r in rows]
    return "\n".join(lines)


@click.command(name="build")
@click.option(
    "--model",
    help="Run the whole chain for this model (recipes/<model>.yaml).",
    shell_complete=complete_model,
)
@click.option("--context", "context_dir", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Only build this rendered context (from `pipeline render`).")  # fmt: skip
@click.option("--atom", "atom_ref", help="ATOM ref to pin (default: [sources] atom_ref).")
@click.option("--aiter", "aiter_ref", help="aiter ref to pin (default: [sources] aiter_ref).")
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository.")
@click.option("--aiter-repo", metavar="URL|PATH", help="aiter repository.")
@click.option(
    "--auto", "auto_aiter", is_flag=True, help="Pin the newest aiter compatible with ATOM (`pin --auto`)."
)
@click.option(
    "--base-image",
    metavar="REF",
    help="Base image; NAME:TAG@sha256:DIGEST where no registry answers ([image] base_image).",
)
@click.option(
    "--submodules",
    type=click.Choice(["mirror", "in-build"]),
    help="aiter's submodules from our mirrors, or fetched in the build at their pinned SHA.",
)
@click.option("--lock", "lock_file", type=click.Path(dir_okay=False, path_type=Path),
              help="Build exactly this lock file instead of pinning.")  # fmt: skip
@click.option("--from", "from_stage", type=click.Choice(STAGE_ORDER), help="First stage to run.")
@click.option("--until", type=click.Choice(STAGE_ORDER), help="Last stage to run.")
@click.option("--resume", type=click.Path(exists=True, file_okay=False, path_type=Path),
              help="Resume this run directory: stages done for the same inputs are skipped.")  # fmt: skip
@click.option(
    "--repin",
    is_flag=True,
    help="With --resume: pin the run's refs again (a run otherwise keeps its pin; says what moved).",
)
@click.option("--registry", help="Registry to push verified tags to (default: [tag] registry).")
@click.option(
    "--offline",
    is_flag=True,
    help="No network for pin: local-path sources are mirrored, URLs read from existing mirrors, no "
    "registry asked ([sources] offline).",
)
@click.option("--tag", help="With --context: tag for the built image.")
@click.option("--docker-host", help="Docker engine, e.g. ssh://user@host (default: $DOCKER_HOST or local).")
@click.option("--no-cache", "nocache", is_flag=True, help="With --context: do not use the build cache.")
@click.option(
    "--print",
    "print_plan",
    is_flag=True,
    help="Print the resolved plan (spec, the stages that would run and why, the image and tags it "
    "would make) and do nothing (like `docker buildx bake --print`).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON on stdout.")
@pass_app
def command(
    app: App,
    model: str | None,
    context_dir: Path | None,
    atom_ref: str | None,
    aiter_ref: str | None,
    atom_repo: str | None,
    aiter_repo: str | None,
    auto_aiter: bool,
    base_image: str | None,
    submodules: str | None,
    lock_file: Path | None,
    from_stage: str | None,
    until: str | None,
    resume: Path | None,
    repin: bool,
    registry: str | None,
    offline: bool,
    tag: str | None,
    docker_host: str | None,
    nocache: bool,
    print_plan: bool,
    as_json: bool,
) -> None:
    """Run the whole chain for a model (pin → patch → check → render → build → smoke → tag),
    or, with --context DIR, build an already rendered context.

    \b
    Everything goes into a run directory (runs/<date>-<model>-<id>/): the spec, the lock,
    each stage's log and result, the Dockerfile, the verdict and the record. A rerun with
    --resume skips what already succeeded for the same inputs and starts at the failure.
    Without MI355 GPUs the run stops after build (exit 9) with the image kept as a candidate.
    """
    _refuse_contradictions(
        context_dir=context_dir,
        lock_file=lock_file,
        given={
            "--model": model is not None,
            "--atom": atom_ref is not None,
            "--aiter": aiter_ref is not None,
            "--atom-repo": atom_repo is not None,
            "--aiter-repo": aiter_repo is not None,
            "--auto": auto_aiter,
            "--base-image": base_image is not None,
            "--submodules": submodules is not None,
            "--lock": lock_file is not None,
            "--from": from_stage is not None,
            "--until": until is not None,
            "--resume": resume is not None,
            "--offline": offline,
            "--tag": tag is not None,
            "--no-cache": nocache,
            "--print": print_plan,
        },
    )
    settings = app.settings(
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        docker_host=docker_host,
        registry=registry,
        base_image=base_image,
        submodules=submodules,
    )
    if context_dir is not None:
        _build_context(app, context_dir, tag=tag, nocache=nocache, as_json=as_json)
        return
    if model is None and resume is None:
        raise UsageError("pass --model MODEL (the whole chain) or --context DIR (build a rendered context).")
    from pipeline.orchestrate import BuildRequest, RunResult, execute

    req = BuildRequest(
        model=model or "",
        atom_ref=atom_ref,
        aiter_ref=aiter_ref,
        base_image=base_image,
        lock=lock_file,
        from_stage=from_stage,
        until=until,
        resume=resume,
        registry=registry,
        offline=offline,
        auto_aiter=auto_aiter,
        repin=repin,
    )
    if print_plan:
        _print_plan(app, req, settings, as_json=as_json)
        return
    if resume is None:
        from pipeline.gc import prune_runs

        prune_runs(settings, app.log)  # the default retention, before this run counts
    result: RunResult | None = None
    try:
        result = execute(req, settings, app.log, app.env)
        if result.error is not None and "\n" in result.error.message:
            # a report below the error (check's findings): the report first, the table and the
            # one-line error last, where a CI log ends
            head, report = result.error.message.split("\n", 1)
            app.log.info(report.rstrip())
            result.error = copy.copy(result.error)
            result.error.message = head
    finally:
        if app.log.stages:  # nothing ran: no empty table
            app.log.info("\n" + _summary_table(app))
            app.log.publish_summary(f"pipeline build {model or resume}")
    if as_json:
        app.emit_json(
            {
                "run_dir": str(result.run_dir),
                "stages": [s.__dict__ for s in result.states],
                "stopped": str(result.error) if result.error else None,
            }
        )
    if result.error is not None:
        raise result.error


def _print_plan(app: App, req: BuildRequest, settings: Settings, *, as_json: bool) -> None:
    """What `build` would do, resolved as it would resolve it, with nothing run or written."""
    import io

    from pipeline.log import Logger
    from pipeline.orchestrate import (
        Decision,
        config_line,
        decide,
        refuse_contradictions,
        resolve_spec,
        resumed,
        stage_range,
    )
    from pipeline.runs import RunDir
    from pipeline.stages import TABLE, render
    from pipeline.stages.base import Context, StageData, Upstream, inputs_record, local

    order = TABLE.order()
    rd = RunDir.existing(req.resume) if req.resume is not None else None
    env = app.env
    if rd is not None:  # decided as `execute` decides: the run's own settings, every stage by default
        spec = rd.read_spec()
        refuse_contradictions(req, settings, spec)
        settings, env = resumed(spec, settings, env, Logger(stream=io.StringIO()))
        spec = spec.model_copy(update={"stages": stage_range(order, req.from_stage, req.until)})
    else:
        spec = resolve_spec(req, settings, order)
    ctx = Context(settings=settings, log=app.log, env=env, work_dir=rd.path if rd else Path("."))
    up, rerun, image_ref = Upstream(), False, ""
    stages: list[dict[str, str]] = []
    for name in order:
        prev = rd.state(name) if rd is not None else None
        if name not in spec.stages:
            action, why = "no", "outside --from/--until"
            if rd is not None and prev is not None and prev.status == "ok":
                up.set(name, TABLE[name].load().Outputs.model_validate(local(prev.outputs, rd.path)))
        elif rd is None:
            action, why = "run", "a new run"
        elif rerun:
            action, why = "run", "a stage before it runs"
        else:
            stage = TABLE[name].load()
            try:
                inputs = stage.plan(ctx, spec, up)
                choice = decide(name, prev, inputs_record(name, inputs, stage.reads(ctx, inputs), rd.path))
            except PipelineError as e:
                choice = Decision(True, f"its inputs cannot be planned here: {e.message}")
            if choice.run:
                action, why, rerun = "run", choice.why, True
            else:
                assert prev is not None  # decide() runs a stage with no record
                action = "skip"
                why = (
                    f"done earlier ({prev.figure}); the run keeps it"
                    if choice.kept
                    else f"{choice.why} ({prev.figure})"
                )
                outputs: StageData = stage.Outputs.model_validate(local(prev.outputs, rd.path))
                up.set(name, outputs)
                if isinstance(outputs, render.Outputs):
                    image_ref = outputs.image_ref
        stages.append({"stage": name, "action": action, "why": why})
    tags = {
        "candidate": image_ref or f"{spec.repository}:candidate-<inputs digest, known after render>",
        "registry": spec.registry,
        "tag": settings.tag.tag_template,
        "moving_tags": ", ".join(settings.tag.moving_tags) + (", latest" if settings.tag.push_latest else ""),
    }
    if as_json:
        app.emit_json({"config_file": settings.config_file or None, "spec": spec.model_dump(mode="json"),
                       "run_dir": str(rd.path) if rd else None, "stages": stages, "image": tags})  # fmt: skip
        return
    lines = ["plan (--print: nothing is run or written)", f"  {config_line(settings)}"]
    lines += [
        f"  {line}" for line in spec.summary_lines(settings.image.base_image, settings.smoke.docker_host)
    ]
    lines.append(f"  run dir    {rd.path if rd else 'new, under ' + settings.paths.runs_dir}")
    lines += [f"  {s['stage']:<6} {s['action']:<4}  {s['why']}" for s in stages]
    lines.append(f"  image      {tags['candidate']}")
    pushed = f"pushed to {spec.registry}" if spec.registry else "no registry: tagged nowhere"
    lines.append(f"  tags       {tags['tag']}; moving {tags['moving_tags'] or '(none)'} ({pushed})")
    app.echo("\n".join(lines))


# Flags that only the whole chain (--model) reads, and those that only --context reads.
_CHAIN_ONLY = ("--model", "--atom", "--aiter", "--atom-repo", "--aiter-repo", "--auto", "--base-image",
               "--submodules", "--lock", "--from", "--until", "--resume", "--offline", "--print")  # fmt: skip
_CONTEXT_ONLY = ("--tag", "--no-cache")
# What a lock fixes: pinning flags would be ignored with --lock.
_LOCK_FIXES = ("--atom", "--aiter", "--atom-repo", "--aiter-repo", "--auto", "--base-image")


def _refuse_contradictions(
    *, context_dir: Path | None, lock_file: Path | None, given: dict[str, bool]
) -> None:
    """A flag the chosen mode would ignore is a usage error, never silently dropped."""
    if context_dir is not None:
        ignored = [f for f in _CHAIN_ONLY if given[f]]
        if ignored:
            raise UsageError(
                f"--context builds a rendered context as it is; {', '.join(ignored)} "
                f"{'belongs' if len(ignored) == 1 else 'belong'} to the whole chain (--model) and would "
                "be ignored.",
                hint="Drop --context to run the chain for the model, or drop "
                f"{', '.join(ignored)} to build the context.",
            )
        return
    ignored = [f for f in _CONTEXT_ONLY if given[f]]
    if ignored:
        raise UsageError(
            f"{', '.join(ignored)} only apply with --context DIR; the whole chain names and tags its own "
            "candidate.",
            hint=f"Drop {', '.join(ignored)}, or build a rendered context with --context DIR.",
        )
    if lock_file is not None:
        ignored = [f for f in _LOCK_FIXES if given[f]]
        if ignored:
            raise UsageError(
                f"--lock {lock_file} builds exactly that lock (its sources, commits and base image); "
                f"{', '.join(ignored)} would be ignored.",
                hint=f"Drop {', '.join(ignored)} to build the lock, or drop --lock to pin anew "
                "(`--auto` picks the newest compatible aiter).",
            )


def _build_context(app: App, context_dir: Path, *, tag: str | None, nocache: bool, as_json: bool) -> None:
    from pipeline.image.context import read_manifest
    from pipeline.stages import build

    ctx = app.context("build")
    try:
        with app.log.stage("build", str(context_dir)) as rec:
            out = build.run(
                ctx,
                build.Inputs(
                    context=context_dir,
                    inputs_digest=read_manifest(context_dir).inputs_digest,
                    tag=tag,
                    nocache=nocache,
                    registry=ctx.settings.tag.registry,
                    repository=ctx.settings.image.repository,
                ),
            )
            rec.status = "skipped" if out.skipped else "ok"
            rec.figure = out.figure()
    finally:
        ctx.close()
    if as_json:
        app.emit_json(
            {
                "image_id": out.image,
                "image_ref": out.ref,
                "candidate": out.candidate,
                "skipped": out.skipped,
                "found_in": out.found_in,
                "pushed": out.pushed,
                "inputs_digest": read_manifest(context_dir).inputs_digest,
                "steps": out.steps,
                "cached_steps": out.cached_steps,
                "aiter_cached": out.aiter_cached,
                "log": str(out.log) if out.log else None,
            }
        )
    else:
        state = "exists (not rebuilt)" if out.skipped else "built"
        app.echo(f"{out.ref}  {out.image[:19]}  {state}")
