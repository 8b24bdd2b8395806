"""`pipeline pin` end to end through `pipeline.cli.main`, on fixture upstreams."""

from __future__ import annotations

import importlib
import json
import sys
import types
from pathlib import Path

import pytest

from pipeline import retry, sources
from pipeline.cli import main
from pipeline.errors import ExitCode
from pipeline.lock import Lock, PatchPin
from tests.fixtures.upstream_repos import Upstreams, free_port, make_upstreams

DIGEST = "sha256:" + "f" * 64
REAL_DEFAULT_RESOLVER = sources.default_digest_resolver


@pytest.fixture
def ups(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Upstreams:
    monkeypatch.setattr(retry, "BACKOFF_SECONDS", 0.01)
    monkeypatch.setattr(
        sources.pinning, "default_digest_resolver", lambda ref, env=None: None
    )  # no registry in tests
    for name in list(__import__("os").environ):
        if name.startswith("PIPELINE_") or name.startswith("GITHUB_"):
            monkeypatch.delenv(name)
    work = tmp_path / "work"
    (work / "recipes").mkdir(parents=True)
    recipe = (Path(__file__).resolve().parents[1] / "servers" / "recipe-test.yaml").read_text()
    for model in ("MiniMax-M3-MXFP4", "M"):  # pin refuses a model without a recipe
        (work / "recipes" / f"{model}.yaml").write_text(
            recipe.replace("name: Smoke-Test-Tiny", f"name: {model}")
        )
    monkeypatch.chdir(work)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    return make_upstreams(tmp_path)


def pin_args(ups: Upstreams, *extra: str) -> list[str]:
    return [
        "pin",
        "--model",
        "MiniMax-M3-MXFP4",
        "--atom-repo",
        ups.atom.url,
        "--aiter-repo",
        ups.aiter.url,
        "--base-image",
        "base/img:1@" + DIGEST,
        *extra,
    ]


def test_pin_writes_lock_then_is_a_noop(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(pin_args(ups, "--atom", "v1.0", "--aiter", ups.shas["aiter_split"][:8])) == 0
    out = capsys.readouterr().out
    lock_path = Path("locks/MiniMax-M3-MXFP4.toml")
    lock = Lock.load(lock_path)
    assert lock.atom.sha == ups.shas["atom_1"] and lock.atom.ref == "v1.0"
    assert lock.aiter.sha == ups.shas["aiter_split"] and lock.aiter.ref == ups.shas["aiter_split"][:8]
    assert lock.aiter.submodules[0].sha == ups.shas["ck_2"]
    assert lock.base_image.digest == DIGEST
    assert ups.shas["atom_1"] in out and ups.shas["aiter_split"] in out
    assert "ATOM: MiniMax-M3 model" in out and "3rdparty/composable_kernel" in out
    assert "lock written" in out

    mtime = lock_path.stat().st_mtime_ns
    assert main(pin_args(ups, "--atom", "v1.0", "--aiter", ups.shas["aiter_split"][:8])) == 0
    assert "lock unchanged" in capsys.readouterr().out
    assert lock_path.stat().st_mtime_ns == mtime


def test_json_output_and_env_sources(
    ups: Upstreams, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PIPELINE_ATOM_REPO", ups.atom.file_url)
    monkeypatch.setenv("PIPELINE_AITER_REPO", ups.aiter.url)
    monkeypatch.setenv("PIPELINE_AITER_REF", "release/v0.1")
    code = main(["pin", "--model", "M", "--base-image", "b@" + DIGEST, "--lock", "out/m.toml", "--json"])
    assert code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["changed"] is True and data["lock"] == "out/m.toml"
    assert data["sources"]["atom"]["url"] == ups.atom.file_url
    assert data["sources"]["atom"]["ref"] == "main" and data["sources"]["atom"]["sha"] == ups.shas["atom_2"]
    assert data["sources"]["aiter"]["sha"] == ups.shas["aiter_old"]
    (sub,) = data["sources"]["aiter"]["submodules"]
    assert sub["sha"] == ups.shas["ck_1"] and sub["mirrored"] is True
    assert data["base_image"] == {"ref": "b@" + DIGEST, "digest": DIGEST}
    assert data["lock_sha256"] == Lock.load(Path("out/m.toml")).digest()


def test_config_file_sources(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    Path("pipeline.toml").write_text(
        f'[sources]\natom_repo = "{ups.atom.url}"\naiter_repo = "{ups.aiter.url}"\natom_ref = "dev"\n'
    )
    assert main(["pin", "--model", "M", "--base-image", "b@" + DIGEST]) == 0
    assert Lock.load(Path("locks/M.toml")).atom.sha == ups.shas["atom_1"]


def test_unknown_ref_exit_code_and_message(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(pin_args(ups, "--aiter", "mian")) == ExitCode.SOURCE
    err = capsys.readouterr().err
    assert "aiter ref 'mian' not found" in err and ups.aiter.url in err and "main" in err
    assert not Path("locks/MiniMax-M3-MXFP4.toml").exists()  # nothing half-done


def test_unreachable_url_is_an_infra_error(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    dead = f"git://127.0.0.1:{free_port()}/ATOM"
    assert main(pin_args(ups, "--atom-repo", dead)) == ExitCode.INFRA
    err = capsys.readouterr().err
    assert dead in err and "attempts" in err


def test_corrupt_lock_names_file_and_line(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(pin_args(ups)) == 0
    path = Path("locks/MiniMax-M3-MXFP4.toml")
    lines = path.read_text().splitlines()
    lines[4] = 'sha = "not a sha'  # unterminated string on line 5
    path.write_text("\n".join(lines) + "\n")
    capsys.readouterr()
    assert main(pin_args(ups)) == ExitCode.SOURCE
    err = capsys.readouterr().err
    assert str(path) in err and "line 5" in err


def test_patches_survive_only_unchanged_shas(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(pin_args(ups)) == 0
    path = Path("locks/MiniMax-M3-MXFP4.toml")
    patched = Lock.load(path).with_patches(
        (PatchPin(name="0001-a.patch", sha256="0" * 64, status="applied"),)
    )
    patched.save(path)
    assert main(pin_args(ups)) == 0
    assert Lock.load(path).patches == patched.patches
    assert "lock unchanged" in capsys.readouterr().out
    ups.atom.commit({"new": "1"}, "upstream moved")
    assert main(pin_args(ups)) == 0
    out = capsys.readouterr().out
    assert Lock.load(path).patches == () and "dropped" in out


def test_offline_flag(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    urls = ["--atom-repo", ups.atom.file_url, "--aiter-repo", ups.aiter.file_url]
    assert main([*pin_args(ups, "--offline"), *urls]) == ExitCode.SOURCE  # URLs: only existing mirrors
    assert "no mirror" in capsys.readouterr().err
    assert main(pin_args(ups, "--offline")) == 0  # local paths are mirrored offline too
    assert main([*pin_args(ups), *urls]) == 0  # now the URLs have mirrors
    ups.atom.commit({"new": "1"}, "not fetched offline")
    capsys.readouterr()
    assert main([*pin_args(ups, "--offline", "--json"), *urls]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["sources"]["atom"]["sha"] == ups.shas["atom_2"]  # the mirror as it was


def test_invalid_model_is_a_usage_error(ups: Upstreams, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["pin", "--model", "../x"]) == ExitCode.USAGE
    assert "invalid model name" in capsys.readouterr().err


def _fake_compat(
    newest: str | None, breaking: str | None, explanation: str = "the walk's reason"
) -> types.ModuleType:
    # The pin stage also gates on reach (`pipeline.compat.reach`): that stays the real module, loaded
    # before the fake package replaces its parent (else the test passes only after another imported it).
    importlib.import_module("pipeline.compat.reach")
    mod = types.ModuleType("pipeline.compat")
    calls: list[tuple[str, str]] = []

    def search_compatible(atom, atom_rev, aiter, aiter_head, *, cache_dir=None, patches=None, adjust=None):  # type: ignore[no-untyped-def]
        calls.append((atom_rev, aiter_head))

        def info(sha):  # type: ignore[no-untyped-def]
            return aiter.commit_info(sha) if sha else None

        return types.SimpleNamespace(
            newest_compatible=info(newest),
            first_breaking=info(breaking),
            report_at_head=None,
            commits_examined=2,
            explanation=explanation,
        )

    mod.search_compatible = search_compatible  # type: ignore[attr-defined]
    mod.calls = calls  # type: ignore[attr-defined]
    return mod


def test_auto_pins_newest_compatible_and_reports_first_breaking(
    ups: Upstreams, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    fake = _fake_compat(ups.shas["aiter_old"], ups.shas["aiter_split"])
    monkeypatch.setitem(sys.modules, "pipeline.compat", fake)
    assert main(pin_args(ups, "--auto", "--json")) == 0
    data = json.loads(capsys.readouterr().out)
    assert fake.calls == [(ups.shas["atom_2"], ups.shas["aiter_split"])]  # type: ignore[attr-defined]
    assert data["sources"]["aiter"]["sha"] == ups.shas["aiter_old"]
    assert data["sources"]["aiter"]["ref"] == "auto:main"
    assert data["auto"]["first_breaking"]["sha"] == ups.shas["aiter_split"]
    assert data["auto"]["requested"]["sha"] == ups.shas["aiter_split"]


def test_auto_with_no_compatible_aiter_is_incompatible(
    ups: Upstreams, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pipeline.compat", _fake_compat(None, ups.shas["aiter_old"]))
    assert main(pin_args(ups, "--auto")) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    assert "no aiter commit" in err and "without patches" in err and ups.shas["aiter_old"] in err
    assert "the walk's reason" in err  # why nothing fits, from the search
    assert not Path("locks/MiniMax-M3-MXFP4.toml").exists()


def test_no_compatible_aiter_is_said_once(
    ups: Upstreams, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The search's own sentence ("no aiter commit up to … is compatible …") is not said twice."""
    said = (
        f"no aiter commit up to {ups.shas['aiter_split'][:10]} is compatible with ATOM "
        f"{ups.shas['atom_2'][:10]} without patches: every commit keeps a breaking call."
    )
    monkeypatch.setitem(sys.modules, "pipeline.compat", _fake_compat(None, ups.shas["aiter_split"], said))
    assert main(pin_args(ups, "--auto")) == ExitCode.INCOMPATIBLE
    err = capsys.readouterr().err
    assert err.count("is compatible with ATOM") == 1 and "every commit keeps a breaking call" in err
    assert ups.shas["aiter_split"][:10] in err.split("keeps a breaking call", 1)[1]  # the first breaking


def test_base_image_digest_through_the_registry_module(
    ups: Upstreams, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.oci.registry

    seen: list[tuple[str, bool]] = []

    def fake_resolve(ref: str, *, timeout: float = 10.0, env: object = None, **kw: object) -> str | None:
        seen.append((ref, isinstance(env, dict) and "PIPELINE_CACHE_DIR" in env))
        return DIGEST

    monkeypatch.setattr(sources.pinning, "default_digest_resolver", REAL_DEFAULT_RESOLVER)
    monkeypatch.setattr(pipeline.oci.registry, "resolve_digest", fake_resolve)
    args = pin_args(ups)
    args[args.index("--base-image") + 1] = "rocm/pytorch:tag"
    assert main([*args, "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["base_image"] == {"ref": "rocm/pytorch:tag", "digest": DIGEST}
    assert seen == [("rocm/pytorch:tag", True)]  # the environment is passed for Docker config credentials


def test_full_mirror_cache_is_a_disk_error_with_nothing_written(
    ups: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import subprocess

    cache = tmp_path / "tiny-cache"
    cache.mkdir()
    # 16 KiB: room for the cache's directories and lock files, none for a mirror's objects
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=16k", "tmpfs", str(cache)], check=True)
    try:
        monkeypatch.setenv("PIPELINE_CACHE_DIR", str(cache))
        code = main(pin_args(ups))
    finally:
        subprocess.run(["umount", "-l", str(cache)], check=False)
    err = capsys.readouterr().err
    assert code == ExitCode.DISK, err
    assert "is full" in err and "Traceback" not in err and "not a git repository" not in err
    assert not Path("locks/MiniMax-M3-MXFP4.toml").exists()


def test_a_pin_failing_on_an_unusable_cache_leaves_no_run_directory(
    ups: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "not-a-dir").write_text("")
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "not-a-dir" / "cache"))  # a file in the way
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    assert main(pin_args(ups)) == ExitCode.USAGE
    err = capsys.readouterr().err
    assert "not-a-dir/cache/mirrors" in err and "Not a directory" in err and "Traceback" not in err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_a_pin_failing_on_a_read_only_cache_is_exit_14_and_leaves_no_run_directory(
    ups: Upstreams, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import errno

    cache = tmp_path / "ro-cache"
    real_mkdir = Path.mkdir

    def read_only(self: Path, *a: object, **k: object) -> None:
        if str(self).startswith(str(cache)):  # tests run as root: a mode cannot make it read-only
            raise OSError(errno.EROFS, "Read-only file system", str(self))
        real_mkdir(self, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "mkdir", read_only)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(cache))
    monkeypatch.setenv("PIPELINE_RUNS_DIR", str(tmp_path / "runs"))
    assert main(pin_args(ups)) == ExitCode.DISK
    assert "read-only" in capsys.readouterr().err
    assert not (tmp_path / "runs").exists() or list((tmp_path / "runs").iterdir()) == []


def test_no_registry_for_the_base_digest_is_exit_11_unless_opted_out(
    ups: Upstreams, capsys: pytest.CaptureFixture[str]
) -> None:
    """No registry answers and the reference has no digest: exit 11 (the table's), no lock
    (render would refuse it one stage later); `--no-base-digest` pins the sources alone."""
    args = [a if a != "base/img:1@" + DIGEST else "base/img:1" for a in pin_args(ups)]
    lock_path = Path("locks/MiniMax-M3-MXFP4.toml")
    assert main(args) == ExitCode.INFRA
    err = capsys.readouterr().err
    assert "no registry answered" in err and "base/img:1" in err and "--no-base-digest" in err
    assert not lock_path.exists()
    assert main([*args, "--no-base-digest"]) == 0
    assert Lock.load(lock_path).base_image.digest == ""
    assert "kept as given" in capsys.readouterr().err
    # a digest given by hand once is kept for the same image when no registry answers
    assert main(pin_args(ups)) == 0
    assert main(args) == 0 and Lock.load(lock_path).base_image.digest == DIGEST
