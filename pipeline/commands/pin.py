"""`pipeline pin`: resolve ATOM and aiter refs to full SHAs and write the lock file (the pin stage).

Every later stage reads only the lock file this writes. Writing is atomic and
skipped when nothing changed (the file keeps its mtime).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

from pipeline import validate
from pipeline.app import App, complete_model, pass_app
from pipeline.errors import PipelineError

if TYPE_CHECKING:
    from pipeline.config import Settings
    from pipeline.lock import SourcePin
    from pipeline.stages.pin import Outputs


@click.command(name="pin")
@click.option(
    "--model",
    required=True,
    help="Model name; the lock is locks/<model>.toml by default.",
    shell_complete=complete_model,
)
@click.option("--atom", "atom_ref", help="ATOM ref: branch, tag, short or full SHA, or HEAD.")
@click.option("--aiter", "aiter_ref", help="aiter ref: branch, tag, short or full SHA, or HEAD.")
@click.option("--atom-repo", metavar="URL|PATH", help="ATOM repository (any git URL or a local path).")
@click.option("--aiter-repo", metavar="URL|PATH", help="aiter repository (any git URL or a local path).")
@click.option(
    "--base-image", metavar="REF", help="Base image reference (digest pinned when a registry answers)."
)
@click.option(
    "--lock",
    "lock_path",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Lock file to write (default: <locks_dir>/<model>.toml).",
)
@click.option(
    "--offline",
    is_flag=True,
    help="No network: local-path sources are mirrored, URLs read from existing mirrors, no registry "
    "asked ([sources] offline).",
)
@click.option(
    "--auto", is_flag=True, help="Pin the newest aiter commit that ATOM's calls are compatible with."
)
@click.option(
    "--no-base-digest",
    "no_base_digest",
    is_flag=True,
    help="When no registry gives the base image digest, pin the sources anyway (exit 0, no digest: "
    "check works, render refuses the lock). Without it that is exit 11.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON object on stdout.")
@click.option(
    "--keep-failed-run", is_flag=True, help="Keep the run directory (and its log) when the pin fails."
)
@pass_app
def command(
    app: App,
    model: str,
    atom_ref: str | None,
    aiter_ref: str | None,
    atom_repo: str | None,
    aiter_repo: str | None,
    base_image: str | None,
    lock_path: Path | None,
    offline: bool,
    auto: bool,
    no_base_digest: bool,
    as_json: bool,
    keep_failed_run: bool,
) -> None:
    """Resolve ATOM and aiter refs to full SHAs and write the lock file.

    Sources default to upstream GitHub; set them with --atom-repo/--aiter-repo,
    [sources] in pipeline.toml, or PIPELINE_ATOM_REPO / PIPELINE_AITER_REPO
    (refs: PIPELINE_ATOM_REF / PIPELINE_AITER_REF). Every source is mirrored
    under the cache dir (PIPELINE_CACHE_DIR) and fetched incrementally; later
    stages read only the lock file and these mirrors.
    """
    from pipeline.lock import Lock, updating
    from pipeline.recipes.recipe import find_recipe
    from pipeline.stages import pin

    validate.model(model)
    settings = app.settings(
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        atom_ref=atom_ref,
        aiter_ref=aiter_ref,
    )
    validate.check_tag_templates(settings)  # a bad tag template fails now, not after build and smoke
    if base_image is not None:
        validate.image_reference(base_image, what="--base-image")
    recipe = find_recipe(model, Path(settings.paths.recipes_dir))  # an unknown model writes no lock
    path = lock_path or Path(settings.paths.locks_dir) / f"{model}.toml"
    if path.is_file():
        Lock.load(path)  # a corrupt lock stops here, naming file and line
    inputs = pin.Inputs(
        model=model,
        atom_repo=validate.url(settings.sources.atom_repo, what="ATOM repository"),
        aiter_repo=validate.url(settings.sources.aiter_repo, what="aiter repository"),
        atom_ref=validate.ref(settings.sources.atom_ref, what="ATOM ref"),
        aiter_ref=validate.ref(settings.sources.aiter_ref, what="aiter ref"),
        base_image=base_image,
        out=path,
        previous=path if path.is_file() else None,
        offline=offline,
        auto=auto,
        recipe=recipe,
        patches_dir=Path(settings.paths.patches_dir),
        base_digest_required=not no_base_digest,
    )
    # held until the command ends: another pin or patch apply of this lock file meanwhile gets exit 13
    previous = click.get_current_context().with_resource(updating(path))
    ctx = app.context(f"pin-{model}")
    try:
        with app.log.stage("pin", model) as rec:
            out = pin.run(ctx, inputs)
            rec.figure = out.figure()
    except (PipelineError, OSError):  # OSError: a full or read-only cache, reported by the CLI
        if not keep_failed_run:
            app.discard_run()  # a failed pin leaves no run directory behind
        raise
    dropped = previous is not None and bool(previous.patches) and not out.lock.patches
    if as_json:
        app.emit_json(_as_json(out, dropped, settings=settings))
    else:
        app.echo(_as_text(out, dropped, settings=settings))


def _pin_json(p: SourcePin) -> dict[str, Any]:
    return {
        "url": p.url,
        "ref": p.ref,
        "sha": p.sha,
        "date": p.date,
        "subject": p.subject,
        "submodules": [{"path": s.path, "url": s.url, "sha": s.sha} for s in p.submodules],
    }


def _as_json(out: Outputs, dropped: bool, *, settings: Settings) -> dict[str, Any]:
    lock = out.lock
    atom = _pin_json(lock.atom)
    aiter = _pin_json(lock.aiter)
    for sub in aiter["submodules"]:
        sub["mirrored"] = _sub_mirrored(settings, sub["url"], sub["sha"])
    data: dict[str, Any] = {
        "model": lock.model,
        "lock": str(out.lock_path),
        "changed": out.changed,
        "lock_sha256": lock.digest(),
        "sources": {"atom": atom, "aiter": aiter},
        "base_image": {"ref": lock.base_image.ref, "digest": lock.base_image.digest or None},
        "patches_kept": len(lock.patches),
        "patches_dropped": dropped,
    }
    if out.auto is not None:
        data["auto"] = out.auto.model_dump(mode="json")
    return data


def _sub_mirrored(settings: Settings, url: str, sha: str) -> bool:
    from pipeline.sources import submodule_mirror

    repo = submodule_mirror(settings, url)
    return repo is not None and repo.rev_parse(sha) is not None


def _as_text(out: Outputs, dropped: bool, *, settings: Settings) -> str:
    lock = out.lock
    lines = []
    for name, p in (("ATOM", lock.atom), ("aiter", lock.aiter)):
        lines.append(f"{name:<6} {p.url}")
        lines.append(f"       {p.ref} -> {p.sha}  {p.date}  {p.subject}")
        for s in p.submodules:
            state = "mirrored" if _sub_mirrored(settings, s.url, s.sha) else "NOT mirrored"
            lines.append(f"       submodule {s.path} {s.sha} ({s.url or 'no URL'}; {state})")
    if out.auto is not None:
        req = out.auto.requested
        lines.append(
            f"auto   requested aiter head {req.sha[:10]}; pinned newest compatible {lock.aiter.short}"
        )
        fb = out.auto.first_breaking
        if fb:
            lines.append(f"       first breaking aiter commit {fb.sha[:10]} {fb.subject}")
    base = lock.base_image
    digest = base.digest or "(no digest: kept as given)"
    lines.append(f"base   {base.ref}  {digest}")
    if dropped:
        lines.append("patches: dropped from the lock (ATOM or aiter changed); run `pipeline patch` again")
    elif lock.patches:
        lines.append(f"patches: {len(lock.patches)} kept (ATOM and aiter unchanged)")
    lines.append(f"{'lock written' if out.changed else 'lock unchanged'}: {out.lock_path}")
    return "\n".join(lines)
