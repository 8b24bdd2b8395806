"""render_context on fixture repositories made by code (git tier: real git, no docker)."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import tomllib
from pathlib import Path

import pytest

from pipeline import labels
from pipeline.config import Settings, load_settings
from pipeline.errors import RenderError
from pipeline.gitw import GitRepo
from pipeline.image.context import MANIFEST, PAIR_NAME, RenderedContext, read_manifest
from pipeline.image.render import render_context
from pipeline.lock import Lock
from tests.fixtures.build_repos import (
    AITER_BUILD_CMD,
    ATOM_INSTALL_CMD,
    CK_PATH,
    BuildRepos,
    fake_wheelhouse,
    make_build_repos,
    run_git,
)

TEMPLATES = Path(__file__).resolve().parents[2] / "dockerfiles"
BASE = "atom-pipeline-test/bookworm-python3:1"
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def repos(tmp_path_factory: pytest.TempPathFactory) -> BuildRepos:
    return make_build_repos(tmp_path_factory.mktemp("upstreams"))


def settings(tmp_path: Path, submodules: str = "mirror") -> Settings:
    env = {
        "PIPELINE_BASE_IMAGE": BASE,
        "PIPELINE_REPOSITORY": "atom-pipeline-test/atom",
        "PIPELINE_AITER_BUILD_CMD": AITER_BUILD_CMD,
        "PIPELINE_ATOM_INSTALL_CMD": ATOM_INSTALL_CMD,
        "PIPELINE_SUBMODULES": submodules,
        "PIPELINE_WHEELS_DIR": str(fake_wheelhouse(tmp_path / "wheels")),
        "PIPELINE_CACHE_DIR": str(tmp_path / "cache"),
    }
    return load_settings(env=env, cwd=tmp_path)


def render(
    repos: BuildRepos,
    out: Path,
    *,
    lock: Lock | None = None,
    ck: bool = True,
    submodules: str = "mirror",
    atom_tree: str | None = None,
    recipe: Path | None = None,
    atom: Path | None = None,
    with_settings: Settings | None = None,
) -> RenderedContext:
    """render_context of the fixture lock into `out`: the patched ATOM tree of `atom` (default: the
    fixture's ATOM), with `settings(out.parent, submodules)` unless `with_settings` is given."""
    return render_context(
        lock=lock or repos.lock(base_ref=BASE, base_digest=DIGEST),
        atom=GitRepo(atom or repos.atom),
        atom_tree_sha=atom_tree or repos.patched_sha,
        aiter=GitRepo(repos.aiter),
        submodule_repos={CK_PATH: GitRepo(repos.ck) if ck else None},
        recipe_path=recipe or repos.recipe,
        settings=with_settings or settings(out.parent, submodules),
        out_dir=out,
        templates_dir=TEMPLATES,
    )


def test_context_holds_patched_atom_aiter_with_submodule_lock_and_ignore(
    repos: BuildRepos, tmp_path: Path
) -> None:
    ctx = render(repos, tmp_path / "ctx")
    d = ctx.dir
    assert (d / "Dockerfile").read_text().startswith("# Rendered by atom-image-pipeline")
    assert "split-kv-cache" in (d / "atom/atom/models/minimax_m3.py").read_text()  # the patched tree
    assert (d / "atom/install_atom.py").is_file()
    assert (d / "aiter/aiter/ops/fused_qknorm_idxrqknorm.py").is_file()
    assert (d / "aiter" / CK_PATH / "include/ck.hpp").is_file()  # submodule from its mirror
    # the image carries the pair it is built from, not a model's lock
    pair = (d / PAIR_NAME).read_text()
    assert tomllib.loads(pair) == repos.lock(base_ref=BASE, base_digest=DIGEST).pair()
    assert "model" not in tomllib.loads(pair) and "MiniMax" not in pair
    assert "**/.git" in (d / ".dockerignore").read_text()
    assert not list(d.rglob(".git"))
    manifest = json.loads((d / MANIFEST).read_text())
    assert manifest["inputs_digest"] == ctx.inputs_digest == ctx.labels[labels.INPUTS_DIGEST]
    assert (
        read_manifest(d).image_ref
        == ctx.image_ref
        == f"atom-pipeline-test/atom:candidate-{ctx.inputs_digest[:12]}"
    )
    text = ctx.dockerfile.read_text()
    assert "git fetch" not in text and f" {AITER_BUILD_CMD}\n" in text
    assert f"RUN {AITER_BUILD_CMD}\n" in (d / "Dockerfile.classic").read_text()
    tree = GitRepo(repos.atom).git("rev-parse", f"{repos.patched_sha}^{{tree}}")
    assert ctx.labels["org.atom-image-pipeline.atom.tree"] == tree
    # aiter's own requirements.txt (from its tree) goes in before the aiter tree
    assert "COPY aiter/requirements.txt /tmp/aiter-requirements.txt" in text
    # the wheelhouse is linked in, not copied
    wheels = tmp_path / "wheels"
    assert sorted(p.name for p in (d / "wheels").iterdir()) == sorted(p.name for p in wheels.iterdir())
    assert all(os.path.samefile(p, wheels / p.name) for p in (d / "wheels").iterdir())
    # the parity report, against the fixture upstream Dockerfile at the pinned ATOM
    head = f"parity with upstream atom_image at ATOM {repos.atom_sha[:10]}: 7 steps"
    assert ctx.parity_summary.startswith(head)
    assert "upstream gained" not in ctx.parity_summary
    assert ctx.parity_summary in (d / "parity.md").read_text()
    # what the self-check will verify in the image
    expected = manifest["selfcheck"]
    patched = (d / "atom/atom/models/minimax_m3.py").read_bytes()
    assert expected["patched_files"] == {"atom/models/minimax_m3.py": hashlib.sha256(patched).hexdigest()}
    assert expected["tools"] == ["lm_eval"] and expected["modules"] == ["atom.benchmarks.benchmark_serving"]
    assert expected["aiter_dir"] == "/app/aiter-test" and expected["lm_eval_version"] == "0.4.13"


def test_rerender_hard_links_unchanged_files(repos: BuildRepos, tmp_path: Path) -> None:
    first = render(repos, tmp_path / "ctx")
    kept = first.dir / "aiter/aiter/ops/fused_qknorm_idxrqknorm.py"
    changed = first.dir / "atom/atom/models/minimax_m3.py"
    before = {p: p.stat().st_ino for p in (kept, changed)}
    other = repos.repatch("-reuse")
    second = render(other, tmp_path / "ctx", lock=other.lock(base_ref=BASE, base_digest=DIGEST))
    assert second.inputs_digest != first.inputs_digest
    assert kept.stat().st_ino == before[kept]  # the same file, linked: no copy, same mtime
    assert changed.stat().st_ino != before[changed] and "split-kv-cache-reuse" in changed.read_text()
    third = render(repos, tmp_path / "fresh")  # a new directory reuses the previous render too
    assert (third.dir / "atom/install_atom.py").stat().st_nlink >= 2
    assert third.inputs_digest == first.inputs_digest


def test_without_a_wheelhouse_offline_is_refused_online_uses_the_index(
    repos: BuildRepos, tmp_path: Path
) -> None:
    s = settings(tmp_path)
    empty = tmp_path / "no-wheels"
    empty.mkdir()
    s = s.model_copy(update={"paths": s.paths.model_copy(update={"wheels_dir": str(empty)})})

    def go(st: Settings, out: Path) -> RenderedContext:
        return render(repos, out, with_settings=st)

    offline = s.model_copy(update={"image": s.image.model_copy(update={"offline_build": True})})
    with pytest.raises(RenderError, match=r"scripts/setup\.sh image-wheelhouse") as e:
        go(offline, tmp_path / "ctx")
    assert "lm_eval-0.4.13" in str(e.value)
    assert not (tmp_path / "ctx").exists() and not list(tmp_path.glob(".ctx.*"))  # nothing half-done
    online = go(s, tmp_path / "ctx2")  # the pins then come from the index, and render says so
    assert any("no wheelhouse" in n for n in online.notes)
    text = online.dockerfile.read_text()
    assert "python3 -m pip install 'lm-eval[api]==0.4.13' setuptools_scm==10.3.4 && \\" in text
    assert "--no-index" not in text


def test_render_is_deterministic_and_rerender_replaces(repos: BuildRepos, tmp_path: Path) -> None:
    a = render(repos, tmp_path / "a")
    b = render(repos, tmp_path / "b")
    assert a.dockerfile.read_bytes() == b.dockerfile.read_bytes()
    assert a.inputs_digest == b.inputs_digest
    (a.dir / "stale-file").write_text("x")
    again = render(repos, tmp_path / "a")  # a previous render is replaced whole
    assert again.inputs_digest == a.inputs_digest and not (a.dir / "stale-file").exists()


def test_patch_only_change_changes_digest(repos: BuildRepos, tmp_path: Path) -> None:
    other = repos.repatch("-v2")
    a = render(repos, tmp_path / "a")
    b = render(other, tmp_path / "b", lock=other.lock(base_ref=BASE, base_digest=DIGEST))
    assert a.inputs_digest != b.inputs_digest
    assert "split-kv-cache-v2" in (b.dir / "atom/atom/models/minimax_m3.py").read_text()


def test_two_models_whose_locks_pin_one_pair_render_one_image(repos: BuildRepos, tmp_path: Path) -> None:
    """Locks that differ only by model (and asked refs), each with its own recipe: one inputs
    digest, one candidate, byte-identical Dockerfiles and image files."""
    lock = repos.lock(base_ref=BASE, base_digest=DIGEST)
    other = lock.model_copy(update={"model": "Kimi-K2.5-MXFP4"})
    other = other.model_copy(
        update={
            "sources": other.sources.model_copy(update={"atom": other.atom.model_copy(update={"ref": "v1"})})
        }
    )
    recipe = tmp_path / "Kimi-K2.5-MXFP4.yaml"
    recipe.write_text(repos.recipe.read_text().replace("name: MiniMax-M3-MXFP4", "name: Kimi-K2.5-MXFP4"))
    a = render(repos, tmp_path / "a", lock=lock)
    b = render(repos, tmp_path / "b", lock=other, recipe=recipe)
    assert lock.digest() != other.digest()
    assert a.inputs_digest == b.inputs_digest and a.image_ref == b.image_ref and a.labels == b.labels
    for name in ("Dockerfile", "Dockerfile.classic", PAIR_NAME):
        assert (a.dir / name).read_bytes() == (b.dir / name).read_bytes(), name
    # a different patch series is a different image
    repatched = repos.repatch("-v3")
    c = render(repatched, tmp_path / "c", lock=repatched.lock(base_ref=BASE, base_digest=DIGEST))
    assert c.inputs_digest != a.inputs_digest
    assert c.labels[labels.PAIR_DIGEST] != a.labels[labels.PAIR_DIGEST] == lock.pair_digest()


def test_unpatched_lock_uses_locked_commit(repos: BuildRepos, tmp_path: Path) -> None:
    lock = repos.lock(base_ref=BASE, base_digest=DIGEST, patched=False)
    ctx = render(repos, tmp_path / "c", lock=lock, atom_tree=repos.atom_sha)
    assert "old-single-kv-cache" in (ctx.dir / "atom/atom/models/minimax_m3.py").read_text()
    assert json.loads(ctx.labels[labels.PATCHES]) == []
    with pytest.raises(RenderError, match="applies no patch"):
        render(repos, tmp_path / "d", lock=lock, atom_tree=repos.patched_sha)


def test_missing_submodule_mirror_stops_and_names_it(repos: BuildRepos, tmp_path: Path) -> None:
    out = tmp_path / "ctx"
    with pytest.raises(RenderError) as e:
        render(repos, out, ck=False)
    assert CK_PATH in str(e.value) and "--submodules in-build" in str(e.value)
    assert not out.exists() and not list(tmp_path.glob(".ctx.*"))  # nothing half-done


def test_in_build_submodule_is_fetched_at_pinned_sha(repos: BuildRepos, tmp_path: Path) -> None:
    ctx = render(repos, tmp_path / "ctx", ck=False, submodules="in-build")
    text = ctx.dockerfile.read_text()
    assert f"git fetch -q --depth 1 file://{repos.ck} {repos.ck_sha}" in text
    assert f'test "$(git rev-parse HEAD)" = {repos.ck_sha}' in text
    assert not (ctx.dir / "aiter" / CK_PATH / "include").exists()


def test_missing_recipe_names_path(repos: BuildRepos, tmp_path: Path) -> None:
    with pytest.raises(RenderError, match=r"no-such\.yaml"):
        render(repos, tmp_path / "ctx", recipe=tmp_path / "recipes/no-such.yaml")


def test_patched_commit_must_descend_from_lock(repos: BuildRepos, tmp_path: Path) -> None:
    clone = tmp_path / "atom-clone"
    subprocess.run(["git", "clone", "-q", "--bare", str(repos.atom), str(clone)], check=True)
    tree = GitRepo(clone).git("rev-parse", f"{repos.patched_sha}^{{tree}}")
    orphan = run_git(clone, "commit-tree", tree, "-m", "same tree, unrelated history")
    with pytest.raises(RenderError, match="does not descend"):
        render(repos, tmp_path / "ctx", atom=clone, atom_tree=orphan)
    with pytest.raises(RenderError, match="not in the mirror"):
        render(repos, tmp_path / "ctx", atom_tree=repos.aiter_sha)


def test_refuses_to_overwrite_a_foreign_directory(repos: BuildRepos, tmp_path: Path) -> None:
    out = tmp_path / "precious"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    with pytest.raises(RenderError, match="refusing"):
        render(repos, out)
    assert (out / "notes.txt").read_text() == "mine"


def test_edited_dockerfile_is_detected(repos: BuildRepos, tmp_path: Path) -> None:
    ctx = render(repos, tmp_path / "ctx")
    ctx.dockerfile.write_text(ctx.dockerfile.read_text() + "RUN echo sneaky\n")
    with pytest.raises(RenderError, match="edited after render"):
        read_manifest(ctx.dir)


def test_tree_with_export_attributes_is_refused(repos: BuildRepos, tmp_path: Path) -> None:
    clone = tmp_path / "atom-attrs"
    subprocess.run(["git", "clone", "-q", str(repos.atom), str(clone)], check=True)
    run_git(clone, "checkout", "-q", repos.patched_sha)
    (clone / ".gitattributes").write_text("install_atom.py export-ignore\n")
    run_git(clone, "add", "-A")
    run_git(clone, "commit", "-q", "-m", "drop a file from archives")
    head = run_git(clone, "rev-parse", "HEAD")
    with pytest.raises(RenderError, match="export-ignore"):
        render(repos, tmp_path / "ctx", atom=clone, atom_tree=head)
    assert not (tmp_path / "ctx").exists()


# -- faults during render (issue 26 §6) ------------------------------------------------------


def test_a_full_cache_during_render_names_the_cache_and_leaves_no_half_mirror(
    repos: BuildRepos, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The run directory and the cache on two file systems (links fail), the cache full."""
    import errno
    import shutil

    from pipeline.errors import DiskError, ExitCode

    out = tmp_path / "run" / "context"
    out.parent.mkdir()
    shared = tmp_path / "run" / "cache" / "contexts" / repos.lock(base_ref=BASE, base_digest=DIGEST).model
    real_copy = shutil.copy2
    copied: list[str] = []

    def cross_device(src: object, dst: object, *a: object, **k: object) -> None:
        raise OSError(errno.EXDEV, "Invalid cross-device link", str(src), None, str(dst))

    def copy_until_full(src: str, dst: str, *a: object, **k: object) -> object:
        if str(shared) in str(dst) and len(copied) >= 3:
            raise OSError(errno.ENOSPC, "No space left on device", str(src))  # as copy2 names it
        copied.append(str(dst))
        return real_copy(src, dst, *a, **k)

    monkeypatch.setattr(os, "link", cross_device)
    monkeypatch.setattr(shutil, "copy2", copy_until_full)
    with pytest.raises(DiskError) as e:
        render(repos, out)
    assert e.value.exit_code == ExitCode.DISK
    msg = str(e.value)
    assert f"could not write the shared build context {shared}" in msg and "is full (ENOSPC)" in msg
    assert str(out) not in msg
    assert not shared.exists()  # not left half mirrored
    assert sorted(p.name for p in shared.parent.iterdir() if not p.name.endswith(".lock")) == []


def test_a_killed_renders_leftovers_are_swept_by_the_next(repos: BuildRepos, tmp_path: Path) -> None:
    out = tmp_path / "context"
    dead = subprocess.Popen(["true"])
    dead.wait()
    left = [tmp_path / f".context.{dead.pid}.x1y2z3", tmp_path / f".context.{dead.pid}.old"]
    for d in left:
        (d / "atom").mkdir(parents=True)
        (d / "atom" / "big.py").write_text("x = 1\n" * 1000)
    alive = tmp_path / f".context.{os.getppid()}.a1b2c3"  # another render still running
    alive.mkdir()
    render(repos, out)
    assert not any(d.exists() for d in left)
    assert alive.is_dir()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".context.")) == [alive.name]


def test_the_selfchecks_file_list_is_gits_view_a_renames_old_path_included(tmp_path: Path) -> None:
    from pipeline.image.render import patched_files

    work = tmp_path / "atom"
    work.mkdir()

    def run(*args: str) -> str:
        return subprocess.run(
            ["git", "-C", str(work), *args], check=True, capture_output=True, text=True
        ).stdout

    run("init", "-q", "-b", "main")
    (work / "atom").mkdir()
    (work / "atom" / "old_name.py").write_text("x = 1\n" * 20)
    run("add", ".")
    run("commit", "-q", "-m", "base")
    base = run("rev-parse", "HEAD").strip()
    run("mv", "atom/old_name.py", "atom/new_name.py")
    run("-c", "diff.renames=true", "commit", "-q", "-m", "rename")
    head = run("rev-parse", "HEAD").strip()
    files = patched_files(GitRepo(work), base, head)
    assert files == {
        "atom/new_name.py": hashlib.sha256(b"x = 1\n" * 20).hexdigest(),
        "atom/old_name.py": "",  # the self-check verifies it is gone from the image
    }
