"""`pipeline rebuild`: the scheduled CI job (see pipeline/rebuild.py)."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, pass_app
from pipeline.errors import ExitCode, PipelineError, UsageError
from pipeline.rebuild import (
    CANDIDATE_FILE,
    PLAN_FILE,
    Plan,
    build_planned,
    overall_exit,
    plan_rebuild,
    rebuild,
    summary_markdown,
)


class RebuildFailed(PipelineError):
    """Carries the worst exit code of the models rebuilt."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.exit_code = ExitCode(code)


@click.command(name="rebuild")
@click.option(
    "--model", "models", multiple=True, help="Recipe to rebuild (repeatable; default: all recipes)."
)
@click.option("--atom", "atom_ref", help="ATOM ref to move to (default: [sources] atom_ref).")
@click.option("--aiter", "aiter_ref", help="aiter ref to move to (default: [sources] aiter_ref).")
@click.option("--registry", help="Registry for verified tags (default: [tag] registry).")
@click.option("--docker-host", help="Docker engine with the GPUs, e.g. ssh://user@gpu-host.")
@click.option("--json", "as_json", is_flag=True, help="Print the outcomes as JSON on stdout.")
@click.option(
    "--write-plan",
    "write_plan",
    type=click.Path(file_okay=False, path_type=Path),
    help="Only pin and check, once for all the models, and write the plan (plan.json, each "
    "model's lock and check report) to this directory; build nothing.",
)
@click.option(
    "--gpu-hosts",
    type=click.IntRange(1, 1000),
    default=1,
    show_default=True,
    help="With --write-plan: how many smoke jobs run at once (the workflow's MI355_RUNNERS); the plan "
    "builds that many images first, so they smoke while the others build.",
)
@click.option(
    "--plan",
    "plan_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Build exactly the pair and locks of this plan (from --write-plan): no pin, no fallback.",
)
@click.option(
    "--build",
    "build_digest",
    metavar="INPUTS_DIGEST",
    help="With --plan: build only the image of this inputs digest (one of the plan's builds) and write "
    "candidate.json, naming it by registry digest, to --candidate-dir. The workflow's build job.",
)
@click.option(
    "--candidate-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=Path("candidate"),
    show_default=True,
    help="Where --build writes candidate.json.",
)
@pass_app
def command(
    app: App,
    models: tuple[str, ...],
    atom_ref: str | None,
    aiter_ref: str | None,
    registry: str | None,
    docker_host: str | None,
    as_json: bool,
    write_plan: Path | None,
    gpu_hosts: int,
    plan_file: Path | None,
    build_digest: str | None,
    candidate_dir: Path,
) -> None:
    """Scheduled rebuild: move the pins, rebuild what changed, report.

    \b
    For each recipe: pin the configured refs, check, patch and render; if the inputs
    digest equals the last released one, nothing is rebuilt. Otherwise build, smoke
    and tag. If aiter's head breaks ATOM and no patch fixes it, fall back to the newest
    compatible aiter and report the break. Obsolete patches are reported.
    The exit code is the worst of the models' (0 when all were released or unchanged).
    With --write-plan: 0 when the plan builds every model, else the worst exit code of
    the models it leaves out (4: no aiter compatible with that model's path), after the
    plan is written whole.
    """
    settings = app.settings(
        atom_ref=atom_ref, aiter_ref=aiter_ref, registry=registry, docker_host=docker_host
    )
    if write_plan is not None and plan_file is not None:
        raise UsageError(
            "--write-plan and --plan exclude each other (the first job writes, the others read)."
        )
    plan = Plan.load(plan_file) if plan_file is not None else None
    if build_digest is not None:
        if plan is None or models:
            raise UsageError("--build takes --plan and no --model (the plan names the digest's models).")
        got = build_planned(
            plan, build_digest, settings, app.log, app.env, registry=registry, out_dir=candidate_dir
        )
        if as_json:
            app.emit_json(got)
        else:
            app.echo(
                f"candidate of {', '.join(got['models'])}: {got['candidate']}\n"
                f"written: {candidate_dir / CANDIDATE_FILE}"
            )
        return
    names = list(models) or (
        sorted(plan.models)
        if plan is not None
        else sorted(p.stem for p in Path(settings.paths.recipes_dir).glob("*.yaml"))
    )
    if not names:
        raise UsageError(f"no recipes found in {settings.paths.recipes_dir}.")
    if write_plan is not None:
        written = plan_rebuild(names, settings, app.log, app.env, write_plan, gpu_hosts=gpu_hosts)
        lines = [f"rebuild plan: ATOM {written.atom[:9]} x aiter {written.aiter[:10]} for every model"]
        lines += [f"  {m}: {e['status']} {e['verdict']}".rstrip() for m, e in sorted(written.models.items())]
        builds = written.builds()
        stages = {b["aiter_stage"] for b in builds}
        lines += [f"  {len(builds)} image(s) to build, {len(stages)} aiter stage(s) to compile"]
        lines += [f"  note: {n}" for n in written.notes]
        app.log.publish_summary("pipeline rebuild --write-plan", "\n".join(lines) + "\n")
        if as_json:
            app.emit_json(written.to_json())
        else:
            app.echo("\n".join(lines) + f"\nwritten: {write_plan / PLAN_FILE}")
        left_out = {m: e for m, e in sorted(written.models.items()) if e["status"] != "ok"}
        if left_out:  # the plan is written whole; the exit says that some models will not build
            worst = max(int(e["exit_code"]) or int(ExitCode.USAGE) for e in left_out.values())
            which = ", ".join(f"{m}: {e['status']}" for m, e in left_out.items())
            raise RebuildFailed(
                worst,
                f"the plan leaves out {len(left_out)} of {len(written.models)} model(s) "
                f"({which}); their jobs will fail "
                f"with the plan's reason. The plan is written: {write_plan / PLAN_FILE}.",
            )
        return
    outcomes = rebuild(names, settings, app.log, app.env, registry=registry, plan=plan)
    md = summary_markdown(outcomes)
    app.log.publish_summary("pipeline rebuild", md)
    if as_json:
        app.emit_json([o.__dict__ for o in outcomes])
    else:
        app.echo(md)
    code = overall_exit(outcomes)
    if code:
        bad = ", ".join(f"{o.model}: {o.status}" for o in outcomes if o.exit_code)
        raise RebuildFailed(code, f"rebuild did not release every model ({bad}); see the table above.")
