"""`pipeline pin`: resolve ATOM and aiter refs to full SHAs and write the lock file.

Every later stage reads only the lock file this writes. Writing is atomic and
skipped when nothing changed (the file keeps its mtime).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from pipeline.app import App, pass_app
from pipeline.config import Settings
from pipeline.lock import SourcePin, default_lock_path, updating
from pipeline.sources import (
    PinResult,
    auto_aiter_chooser,
    commit_json,
    pin,
    submodule_mirror,
    validate_model,
)


@click.command(name="pin")
@click.option("--model", required=True, help="Model name; the lock is locks/<model>.toml by default.")
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
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON object on stdout.")
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
    as_json: bool,
) -> None:
    """Resolve ATOM and aiter refs to full SHAs and write the lock file.

    Sources default to upstream GitHub; set them with --atom-repo/--aiter-repo,
    [sources] in pipeline.toml, or PIPELINE_ATOM_REPO / PIPELINE_AITER_REPO
    (refs: PIPELINE_ATOM_REF / PIPELINE_AITER_REF). Every source is mirrored
    under the cache dir (PIPELINE_CACHE_DIR) and fetched incrementally; later
    stages read only the lock file and these mirrors.
    """
    validate_model(model)
    settings = app.settings(
        atom_repo=atom_repo,
        aiter_repo=aiter_repo,
        atom_ref=atom_ref,
        aiter_ref=aiter_ref,
        base_image=base_image,
    )
    path = lock_path or default_lock_path(Path(settings.paths.locks_dir), model)
    # Held until the command ends: another pin or patch apply of this lock file meanwhile gets exit 13.
    # A corrupt lock stops here, naming file and line.
    previous = click.get_current_context().with_resource(updating(path))

    app.open_run(f"pin-{model}")
    log = app.log
    auto_report: dict[str, Any] = {}
    chooser = (
        auto_aiter_chooser(
            settings.cache_dir,
            log,
            auto_report,
            Path(settings.paths.patches_dir),
            Path(settings.paths.recipes_dir) / f"{model}.yaml",
        )
        if auto
        else None
    )

    with log.stage("pin", model) as rec:
        result = pin(
            settings,
            model=model,
            atom_ref=settings.sources.atom_ref,
            aiter_ref=settings.sources.aiter_ref,
            base_image=settings.image.base_image,
            log=log,
            offline=offline,
            previous=previous,
            choose_aiter=chooser,
            env=app.env,
        )
        lock = result.lock
        changed = lock.save(path)
        rec.figure = f"ATOM {lock.atom.short} · aiter {lock.aiter.short}" + (
            "" if changed else " (unchanged)"
        )

    dropped = previous is not None and bool(previous.patches) and not lock.patches
    if as_json:
        app.emit_json(_as_json(result, path, changed, dropped, auto_report, settings=settings))
    else:
        app.echo(_as_text(result, path, changed, dropped, auto_report, settings=settings))


def _pin_json(p: SourcePin) -> dict[str, Any]:
    return {
        "url": p.url,
        "ref": p.ref,
        "sha": p.sha,
        "date": p.date,
        "subject": p.subject,
        "submodules": [{"path": s.path, "url": s.url, "sha": s.sha} for s in p.submodules],
    }


def _as_json(
    result: PinResult,
    path: Path,
    changed: bool,
    dropped: bool,
    auto: dict[str, Any],
    *,
    settings: Settings,
) -> dict[str, Any]:
    lock = result.lock
    atom = _pin_json(lock.atom)
    aiter = _pin_json(lock.aiter)
    for sub in aiter["submodules"]:
        sub["mirrored"] = _sub_mirrored(settings, sub["url"], sub["sha"])
    out: dict[str, Any] = {
        "model": lock.model,
        "lock": str(path),
        "changed": changed,
        "lock_sha256": lock.digest(),
        "sources": {"atom": atom, "aiter": aiter},
        "base_image": {"ref": lock.base_image.ref, "digest": lock.base_image.digest or None},
        "patches_kept": len(lock.patches),
        "patches_dropped": dropped,
    }
    if auto:
        out["auto"] = {**auto, "requested": commit_json(result.aiter_requested)}
    return out


def _sub_mirrored(settings: Settings, url: str, sha: str) -> bool:
    repo = submodule_mirror(settings, url)
    return repo is not None and repo.rev_parse(sha) is not None


def _as_text(
    result: PinResult,
    path: Path,
    changed: bool,
    dropped: bool,
    auto: dict[str, Any],
    *,
    settings: Settings,
) -> str:
    lock = result.lock
    lines = []
    for name, p in (("ATOM", lock.atom), ("aiter", lock.aiter)):
        lines.append(f"{name:<6} {p.url}")
        lines.append(f"       {p.ref} -> {p.sha}  {p.date}  {p.subject}")
        for s in p.submodules:
            state = "mirrored" if _sub_mirrored(settings, s.url, s.sha) else "NOT mirrored"
            lines.append(f"       submodule {s.path} {s.sha} ({s.url or 'no URL'}; {state})")
    if auto:
        req = result.aiter_requested
        lines.append(
            f"auto   requested aiter head {req.sha[:10]}; pinned newest compatible {lock.aiter.short}"
        )
        fb = auto.get("first_breaking")
        if fb:
            lines.append(f"       first breaking aiter commit {fb['sha'][:10]} {fb['subject']}")
    base = lock.base_image
    digest = base.digest or "(no digest: kept as given)"
    lines.append(f"base   {base.ref}  {digest}")
    if dropped:
        lines.append("patches: dropped from the lock (ATOM or aiter changed); run `pipeline patch` again")
    elif lock.patches:
        lines.append(f"patches: {len(lock.patches)} kept (ATOM and aiter unchanged)")
    lines.append(f"{'lock written' if changed else 'lock unchanged'}: {path}")
    return "\n".join(lines)
