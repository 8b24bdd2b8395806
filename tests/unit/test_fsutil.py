"""Files the tool reads fail with an error naming the file (never a traceback); files it writes
get the mode any other tool would give them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.config import load_settings
from pipeline.errors import (
    ConfigError,
    ExitCode,
    LockFileError,
    PatchError,
    PipelineError,
    RunLocked,
    UsageError,
)
from pipeline.fsutil import (
    MAX_USER_FILE,
    acquire_lock,
    atomic_write_json,
    atomic_write_text,
    hold_lock,
    read_bytes,
    read_text,
)
from pipeline.lock import Lock
from pipeline.patchq import PatchSeries
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke.verdict import load_verdict
from pipeline.sources import normalise_url

NOT_UTF8 = b"model: amd/\xff\xfeX\n"


@pytest.fixture
def umask() -> Iterator[None]:
    old = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.mark.parametrize(
    ("name", "load", "error", "code"),
    [
        ("recipe.yaml", load_recipe, ConfigError, ExitCode.USAGE),
        ("lock.toml", Lock.load, LockFileError, ExitCode.SOURCE),
        ("pipeline.toml", lambda p: load_settings(env={}, config_file=p), ConfigError, ExitCode.USAGE),
        ("verdict.json", load_verdict, ConfigError, ExitCode.USAGE),
    ],
)
def test_non_utf8_files_are_named_errors(
    tmp_path: Path, name: str, load: object, error: type[PipelineError], code: ExitCode
) -> None:
    path = tmp_path / name
    path.write_bytes(NOT_UTF8)
    with pytest.raises(error) as e:
        load(path)  # type: ignore[operator]
    assert e.value.exit_code == code
    assert str(path) in str(e.value) and "not UTF-8" in str(e.value) and "b'\\xff'" in str(e.value)


def test_non_utf8_series_file_is_a_patch_error(tmp_path: Path) -> None:
    (tmp_path / "series").write_bytes(b"0001-\xff.patch\n")
    with pytest.raises(PatchError, match=r"series file .* is not UTF-8"):
        PatchSeries.load(tmp_path)


def test_lock_path_that_is_a_directory(tmp_path: Path) -> None:
    d = tmp_path / "M.toml"
    d.mkdir()
    with pytest.raises(LockFileError, match="is a directory, not a file"):
        Lock.load(d)
    with pytest.raises(LockFileError, match="it is a directory"):
        atomic_write_text(d, "x", what="lock file", error=LockFileError)
    assert list(tmp_path.iterdir()) == [d]  # no temp file left behind


def test_read_text_names_missing_and_too_long(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"recipe .* does not exist"):
        read_text(tmp_path / "nope.yaml", what="recipe")
    with pytest.raises(UsageError, match="too long for the file system") as e:
        read_text(tmp_path / ("x" * 300), what="recipe")
    assert "300 bytes long" in str(e.value) and "x" * 100 not in str(e.value)  # cut, with its length


def test_repository_path_over_the_name_limit_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="over the system's limit") as e:
        normalise_url(str(tmp_path / ("a" * 300)))
    assert "300 bytes long" in str(e.value)
    assert normalise_url("https://example.invalid/" + "a" * 300 + ".git")  # a URL is not a path


def test_new_files_follow_the_umask(tmp_path: Path, umask: None) -> None:
    atomic_write_text(tmp_path / "a.toml", "x")
    assert mode(tmp_path / "a.toml") == 0o644
    os.umask(0o027)
    atomic_write_json(tmp_path / "b.json", {"x": 1})
    assert mode(tmp_path / "b.json") == 0o640


def test_rewrite_keeps_the_files_mode(tmp_path: Path, umask: None) -> None:
    shared = tmp_path / "shared.toml"
    shared.write_text("old")
    shared.chmod(0o664)
    atomic_write_text(shared, "new")
    assert mode(shared) == 0o664 and shared.read_text() == "new"
    private = tmp_path / "private.toml"
    private.write_text("old")
    private.chmod(0o600)
    atomic_write_text(private, "new")
    assert mode(private) == 0o600


def test_lock_held_elsewhere_is_exit_13(tmp_path: Path) -> None:
    lock_file = tmp_path / "x.lock"
    with hold_lock(lock_file, wait=0, busy="held", hint="h"):
        waited: list[int] = []
        with pytest.raises(RunLocked, match="held") as e:
            acquire_lock(lock_file, wait=0.05, busy="held", hint="wait", on_wait=lambda: waited.append(1))
        assert e.value.exit_code == ExitCode.LOCKED and waited == [1]
    acquire_lock(lock_file, wait=0, busy="held", hint="h").release()  # free again


@pytest.mark.parametrize(
    "argv",
    [
        ["--config", "c" * 300, "pin", "--model", "M"],
        ["check", "--lock", "l" * 300],
        ["pin", "--model", "MiniMax-M3-MXFP4", "--lock", "l" * 300],
        ["pin", "--model", "MiniMax-M3-MXFP4", "--atom-repo", "/" + "a" * 300],
    ],
)
def test_a_path_over_the_limit_is_exit_2_not_a_bug(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from pipeline.cli import main

    monkeypatch.chdir(tmp_path)
    for name in list(os.environ):
        if name.startswith("PIPELINE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIPELINE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("PIPELINE_RECIPES_DIR", str(Path(__file__).resolve().parents[2] / "recipes"))
    code = main(argv)
    err = capsys.readouterr().err
    assert code in (ExitCode.USAGE, ExitCode.SOURCE), err
    assert "Traceback" not in err and "300 bytes long" in err and "x" * 100 not in err


# -- bounded reads (issue 26 §5) ------------------------------------------------------

USER_FILES = [
    ("recipe", load_recipe, ConfigError),
    ("lock file", Lock.load, LockFileError),
    ("smoke verdict", load_verdict, ConfigError),
    ("configuration file", lambda p: load_settings(env={}, config_file=p), ConfigError),
]


@pytest.mark.parametrize(("what", "load", "error"), USER_FILES)
def test_a_device_is_refused_before_a_byte_is_read(what: str, load: object, error: type) -> None:
    with pytest.raises(error) as e:
        load(Path("/dev/zero"))  # type: ignore[operator]
    assert "/dev/zero" in str(e.value)
    assert "not a regular file" in str(e.value)


@pytest.mark.parametrize(("what", "load", "error"), USER_FILES)
def test_a_fifo_neither_blocks_nor_is_read(tmp_path: Path, what: str, load: object, error: type) -> None:
    fifo = tmp_path / "input"
    os.mkfifo(fifo)  # no writer: a plain open() would block for ever
    with pytest.raises(error, match="not a regular file"):
        load(fifo)  # type: ignore[operator]


@pytest.mark.parametrize(("what", "load", "error"), USER_FILES)
def test_a_file_over_the_limit_is_refused_by_its_size(
    tmp_path: Path, what: str, load: object, error: type
) -> None:
    big = tmp_path / "big"
    with big.open("wb") as f:
        f.truncate(MAX_USER_FILE + 1)  # sparse: nothing is written, nothing must be read
    with pytest.raises(error, match=r"over the limit of 16\.0 MiB"):
        load(big)  # type: ignore[operator]


def test_the_cli_refuses_dev_zero_as_lock_and_recipe(capsys: pytest.CaptureFixture[str]) -> None:
    from pipeline.cli import main

    assert main(["check", "--lock", "/dev/zero"]) == ExitCode.SOURCE
    assert "not a regular file" in capsys.readouterr().err
    assert main(["smoke", "--image", "x", "--recipe", "/dev/zero"]) == ExitCode.USAGE
    assert "not a regular file" in capsys.readouterr().err


def test_read_bytes_can_refuse_a_symlink(tmp_path: Path) -> None:
    (tmp_path / "real").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "real")
    assert read_bytes(tmp_path / "link", what="patch") == b"x"
    with pytest.raises(UsageError, match="is a symbolic link; refused"):
        read_bytes(tmp_path / "link", what="patch", follow_symlinks=False)


def test_read_bytes_reads_at_most_the_limit(tmp_path: Path) -> None:
    f = tmp_path / "f"
    f.write_bytes(b"a" * 10)
    assert read_bytes(f, what="x", limit=10) == b"a" * 10
    with pytest.raises(UsageError, match="over the limit of 9 bytes"):
        read_bytes(f, what="x", limit=9)


def test_a_resumed_runs_spec_and_the_parity_list_are_read_bounded(tmp_path: Path) -> None:
    from pipeline.errors import RenderError
    from pipeline.image.parity import load_deliberate
    from pipeline.runs import RunDir

    os.mkfifo(tmp_path / "run.json")  # would block a plain read for ever
    with pytest.raises(UsageError, match=r"run\.json is not a regular file"):
        RunDir(tmp_path).read_spec()
    with pytest.raises(RenderError, match="parity list /dev/zero is not a regular file"):
        load_deliberate(Path("/dev/zero"))
