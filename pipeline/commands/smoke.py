"""`pipeline smoke`: run a model's recipe against an image on GPUs; pass only if it really serves it."""

from __future__ import annotations

from pathlib import Path

import click

from pipeline.app import App, complete_model, pass_app
from pipeline.errors import ExitCode, PipelineError, UsageError


def _concurrencies(raw: str | None) -> tuple[int, ...] | None:
    if not raw:
        return None
    try:
        values = tuple(int(p) for p in raw.split(",") if p.strip())
    except ValueError:
        raise UsageError(
            f"--bench-concurrency {raw!r}: expected comma-separated integers, e.g. 4,16."
        ) from None
    if not values or any(v < 1 for v in values):
        raise UsageError(f"--bench-concurrency {raw!r}: expected positive integers.")
    return values


def _labels(raw: tuple[str, ...]) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in raw:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise UsageError(f"--label {item!r}: expected KEY=VALUE.")
        out[key] = value
    return out


@click.command(name="smoke")
@click.option(
    "--image",
    required=True,
    help="Image to test: REPO@sha256:DIGEST (pulled by digest when absent, verified), an image ID, or a "
    "tag, resolved to its digest once (the registry's, else the engine's) and run by it.",
)
@click.option(
    "--model",
    help="Recipe name: recipes/<MODEL>.yaml (e.g. MiniMax-M3-MXFP4).",
    shell_complete=complete_model,
)
@click.option(
    "--recipe",
    "recipe_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Recipe file (instead of --model).",
)
@click.option(
    "--lock",
    "lock_file",
    type=click.Path(dir_okay=False, path_type=Path),
    help="The model's lock (default: locks/<MODEL>.toml when it exists): the verdict binds it to the "
    "image, which must be built from its pair.",
)
@click.option("--docker-host", help="Engine with the GPUs, e.g. ssh://user@mi355-host ([smoke] docker_host).")
@click.option("--run-all", is_flag=True, default=None, help="Run every check even after a gate failed.")
@click.option(
    "--quick", is_flag=True, help="GSM8K on the recipe's quick_limit documents; benchmark's quick rows."
)
@click.option("--limit", "gsm8k_limit", type=click.IntRange(min=1), help="GSM8K documents (lm_eval --limit).")
@click.option("--bench-concurrency", help="Benchmark rows to run, e.g. 4,16,64 (default: the recipe's).")
@click.option("--bench-tolerance", type=click.FloatRange(min=0), help="Relative tolerance, e.g. 0.1 for 10%.")
@click.option("--ready-timeout", type=click.FloatRange(min=1), help="Seconds to wait for readiness.")
@click.option("--hf-cache", help="Hugging Face cache on the engine host ([smoke] hf_cache).")
@click.option("--kfd-topology", help="KFD topology nodes dir on the engine host ([smoke] kfd_topology).")
@click.option(
    "--preflight-via",
    type=click.Choice(["auto", "local", "container"]),
    default="auto",
    show_default=True,
    help="Read the GPU topology here or in a container on the engine.",
)
@click.option(
    "--run-dir", type=click.Path(file_okay=False, path_type=Path), help="Run directory to write to."
)
@click.option("--label", "extra_labels", multiple=True, hidden=True, help="KEY=VALUE label on containers.")
@click.option("--json", "as_json", is_flag=True, help="Print the verdict as JSON on stdout.")
@pass_app
def command(
    app: App,
    image: str,
    model: str | None,
    recipe_file: Path | None,
    lock_file: Path | None,
    docker_host: str | None,
    run_all: bool | None,
    quick: bool,
    gsm8k_limit: int | None,
    bench_concurrency: str | None,
    bench_tolerance: float | None,
    ready_timeout: float | None,
    hf_cache: str | None,
    kfd_topology: str | None,
    preflight_via: str,
    run_dir: Path | None,
    extra_labels: tuple[str, ...],
    as_json: bool,
) -> None:
    """Smoke-test an image with a model recipe on MI355 GPUs.

    \b
    Starts the recipe's server, fails fast on a crash (the exception line is the
    reason), then gates on a chat answer, GSM8K accuracy (lm_eval) and the
    serving benchmark. Writes verdict.json, summary.md and junit.xml to the run
    directory. Exit 0 passed, 8 a gate failed, 9 no GPUs/model here.
    """
    from pipeline.recipes.recipe import find_recipe, load_recipe
    from pipeline.stages import smoke

    if (model is None) == (recipe_file is None):
        raise UsageError("give exactly one of --model NAME or --recipe FILE.")
    settings = app.settings(
        docker_host=docker_host, run_all_checks=run_all, hf_cache=hf_cache, kfd_topology=kfd_topology
    )
    path = (
        recipe_file if recipe_file is not None else find_recipe(str(model), Path(settings.paths.recipes_dir))
    )
    recipe = load_recipe(path, allowed_secrets=settings.recipe_secrets)
    if lock_file is None:
        from pipeline.lock import default_lock_path

        found = default_lock_path(Path(settings.paths.locks_dir), recipe.name)
        lock_file = found if found.is_file() else None
    elif not lock_file.is_file():
        raise UsageError(
            f"lock file {lock_file} does not exist.", hint="Pass the model's lock with --lock FILE."
        )
    ctx = app.context(f"smoke-{recipe.name}", work_dir=run_dir)
    inputs = smoke.Inputs(
        image=image,
        model=recipe.name,
        recipe=path,
        lock=lock_file,
        out_dir=ctx.work_dir,
        run_all=settings.smoke.run_all_checks,
        quick=quick,
        gsm8k_limit=gsm8k_limit,
        bench_concurrencies=_concurrencies(bench_concurrency),
        bench_tolerance=bench_tolerance,
        ready_timeout_s=ready_timeout,
        preflight_via=preflight_via,  # type: ignore[arg-type]  # click.Choice guarantees the literal
        labels=tuple(_labels(extra_labels).items()),
        docker_host=settings.smoke.docker_host,
    )
    try:
        out = smoke.run(ctx, inputs)
    except PipelineError as e:
        if as_json and not (ctx.work_dir / "verdict.json").is_file():
            # stopped before a verdict (no GPUs, no engine, a bad image): --json still answers
            app.emit_json(
                {
                    "model": recipe.name,
                    "image": {"ref": image},
                    "status": "no-hardware" if e.exit_code == ExitCode.NO_HARDWARE else "error",
                    "exit_code": int(e.exit_code),
                    "error": e.message,
                    "run_dir": str(ctx.work_dir),
                }
            )
        raise
    finally:
        if as_json and (ctx.work_dir / "verdict.json").is_file():
            from pipeline.smoke import load_verdict

            app.emit_json(load_verdict(ctx.work_dir / "verdict.json").to_json())
        ctx.close()
    app.log.detail(f"verdict {out.verdict}")
