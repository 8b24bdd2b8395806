"""Pure parts of `pipeline.sources`: URLs, mirror names, retries, error classes, base image."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from pipeline import retry, sources
from pipeline.config import load_settings
from pipeline.errors import DiskError, InfraError, SourceError, TagError, UsageError
from pipeline.gitw import GitResult
from pipeline.lock import BaseImagePin
from pipeline.log import Logger
from pipeline.sources import (
    is_local,
    mirror_name,
    mirror_path,
    normalise_url,
    pin_base_image,
    resolve_relative_url,
    strip_credentials,
    validate_model,
)
from pipeline.sources.mirrors import _classify, _with_retries

DIGEST = "sha256:" + "1" * 64


def log_buf() -> tuple[Logger, io.StringIO]:
    buf = io.StringIO()
    return Logger(stream=buf), buf


@pytest.mark.parametrize(
    ("url", "local"),
    [
        ("/work/.mirror/ROCm+ATOM/repo", True),
        ("../ATOM", True),
        ("./x:y", True),
        ("ATOM", True),
        ("~/src/aiter", True),
        ("https://github.com/ROCm/ATOM.git", False),
        ("file:///srv/ATOM", False),
        ("git://127.0.0.1:9418/ATOM", False),
        ("git@github.com:ROCm/ATOM.git", False),
        ("host:path/repo", False),
    ],
)
def test_is_local(url: str, local: bool) -> None:
    assert is_local(url) is local


def test_normalise_url(tmp_path: Path) -> None:
    assert normalise_url("repos/../ATOM/", cwd=tmp_path) == str(tmp_path / "ATOM")
    assert normalise_url("  https://github.com/ROCm/ATOM.git ") == "https://github.com/ROCm/ATOM.git"
    assert normalise_url("https://me:s3cret@example.com/x.git") == "https://example.com/x.git"
    with pytest.raises(UsageError):
        normalise_url("  ")


def test_strip_credentials() -> None:
    assert strip_credentials("https://tok@example.com:8443/a/b.git") == "https://example.com:8443/a/b.git"
    assert strip_credentials("ssh://git@example.com/a.git") == "ssh://git@example.com/a.git"
    assert strip_credentials("git@github.com:ROCm/ATOM.git") == "git@github.com:ROCm/ATOM.git"


def test_mirror_names_are_readable_unique_and_stable() -> None:
    a = mirror_name("https://github.com/ROCm/ATOM.git")
    assert a.startswith("github.com-ROCm-ATOM-")
    assert a == mirror_name("https://github.com/ROCm/ATOM")  # same repository, same mirror
    assert a != mirror_name("https://github.com/ROCm/aiter.git")
    assert a != mirror_name("https://example.com/github.com/ROCm/ATOM.git")
    local = mirror_name("/work/.mirror/ROCm+ATOM/repo")
    assert "/" not in local and "+" not in local and not local.startswith(".")
    assert len(mirror_name("https://h/" + "x" * 500)) < 80


def test_mirror_path_under_the_cache_dir(tmp_path: Path) -> None:
    s = load_settings(env={}, cwd=tmp_path, overrides={"cache_dir": str(tmp_path / "c")})
    p = mirror_path(s, "https://github.com/ROCm/ATOM.git")
    assert p.parent == tmp_path / "c" / "mirrors" and p.suffix == ".git"
    default = load_settings(env={}, cwd=tmp_path)
    assert "atom-image-pipeline" in str(mirror_path(default, "x"))


@pytest.mark.parametrize(
    ("parent", "url", "want"),
    [
        (
            "https://github.com/ROCm/aiter.git",
            "../composable_kernel.git",
            "https://github.com/ROCm/composable_kernel.git",
        ),
        ("https://github.com/ROCm/aiter.git", "./sub", "https://github.com/ROCm/aiter.git/sub"),
        ("https://github.com/ROCm/aiter.git/", "../../other/ck", "https://github.com/other/ck"),
        ("git@github.com:ROCm/aiter.git", "../ck.git", "git@github.com:ROCm/ck.git"),
        ("/srv/up/aiter", "../ck", "/srv/up/ck"),
        ("git://127.0.0.1:9418/aiter", "../ck", "git://127.0.0.1:9418/ck"),
        ("/srv/up/aiter", "https://github.com/ROCm/ck.git", "https://github.com/ROCm/ck.git"),
    ],
)
def test_resolve_relative_url(parent: str, url: str, want: str) -> None:
    assert resolve_relative_url(parent, url) == want


def test_relative_url_above_the_root_is_an_error() -> None:
    with pytest.raises(SourceError, match="climbs above"):
        resolve_relative_url("https://github.com/aiter", "../../../x")


@pytest.mark.parametrize("good", ["MiniMax-M3-MXFP4", "m", "a.b_c-1"])
def test_valid_models(good: str) -> None:
    assert validate_model(good) == good


@pytest.mark.parametrize("bad", ["", ".hidden", "../x", "a/b", "a b", "-x", "x" * 101, "é"])
def test_invalid_models(bad: str) -> None:
    with pytest.raises(UsageError):
        validate_model(bad)


def test_classify_unreachable_auth_and_other() -> None:
    unreachable = "fatal: unable to connect to 127.0.0.1:\n127.0.0.1[0: 127.0.0.1]: errno=Connection refused"
    assert isinstance(_classify(unreachable, "git://x", "fetching"), InfraError)
    dns = (
        "Cloning into bare repository 'x'...\nfatal: unable to access 'https://h/': Could not resolve host: h"
    )
    err = _classify(dns, "https://h/", "cloning")
    assert (
        isinstance(err, InfraError) and "Could not resolve host" in err.message
    )  # the fatal line, not the first
    auth = "fatal: could not read Username for 'https://github.com': terminal prompts disabled"
    err2 = _classify(auth, "https://github.com/x/private", "cloning")
    assert type(err2) is SourceError and "credentials" in err2.message
    other = "fatal: remote error: access denied or repository not exported: /nothing"
    assert type(_classify(other, "git://x", "fetching")) is SourceError


def test_classify_a_full_or_read_only_cache_as_a_disk_error() -> None:
    # what git prints when our mirror's file system fills up mid-fetch, and when it is read-only:
    # the last fatal line misleads ("not a git repository", a remote failure), the errno text does not
    full = (
        "error: unable to write file ./objects/pack/tmp_pack_Xy12: No space left on device\n"
        "fatal: index-pack failed\nfatal: not a git repository: '/c/mirrors/x.git'"
    )
    err = _classify(full, "https://github.com/ROCm/ATOM.git", "fetching")
    assert isinstance(err, DiskError) and "is full (ENOSPC)" in err.message
    assert err.exit_code == 14 and "cache_dir" in (err.hint or "")
    ro = "fatal: could not create work tree dir '/c/mirrors/y': Read-only file system"
    assert "read-only (EROFS)" in _classify(ro, "/srv/aiter", "cloning").message


def test_retries_only_when_unreachable_with_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    sleeps: list[float] = []
    monkeypatch.setattr(retry.time, "sleep", sleeps.append)
    calls: list[int] = []

    def unreachable() -> GitResult:
        calls.append(1)
        return GitResult(128, "", "fatal: unable to access 'x': Connection refused")

    log, buf = log_buf()
    with pytest.raises(InfraError, match="gave up after 4 attempts"):
        _with_retries(unreachable, url="https://u", action="fetching", retries=3, log=log, backoff=0.5)
    assert len(calls) == 4 and sleeps == [0.5, 1.0, 2.0]
    assert buf.getvalue().count("retrying") == 3

    calls.clear()

    def not_found() -> GitResult:
        calls.append(1)
        return GitResult(128, "", "fatal: repository 'x' not found")

    with pytest.raises(SourceError):
        _with_retries(not_found, url="https://u", action="fetching", retries=3, log=None)
    assert len(calls) == 1  # no retry for an answer

    answers = iter([GitResult(128, "", "Connection timed out"), GitResult(0, "", "")])
    _with_retries(lambda: next(answers), url="https://u", action="fetching", retries=1, log=None, backoff=0)


def test_base_image_digest_from_registry_or_kept_as_given() -> None:
    log, buf = log_buf()
    pinned = pin_base_image("rocm/pytorch:x", log=log, resolver=lambda ref: DIGEST)
    assert pinned == BaseImagePin(ref="rocm/pytorch:x", digest=DIGEST)

    kept = pin_base_image("rocm/pytorch:x", log=log, resolver=lambda ref: None)
    assert kept.digest == "" and "kept as given" in buf.getvalue()

    def down(ref: str) -> str | None:
        raise InfraError("registry unreachable")

    assert pin_base_image("rocm/pytorch:x", log=log, resolver=down).digest == ""

    def refused(ref: str) -> str | None:
        raise TagError("the registry docker.io has no image rocm/pytorch:x.", hint="Check the image name.")

    with pytest.raises(SourceError, match="has no image"):
        pin_base_image("rocm/pytorch:x", log=log, resolver=refused)

    def bug(ref: str) -> str | None:
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError):  # bugs are not hidden as "no registry"
        pin_base_image("rocm/pytorch:x", log=log, resolver=bug)

    called: list[str] = []
    explicit = pin_base_image("img@" + DIGEST, log=log, resolver=lambda r: called.append(r) or None)
    assert explicit.digest == DIGEST and called == []

    prev = BaseImagePin(ref="rocm/pytorch:x", digest=DIGEST)
    assert pin_base_image("rocm/pytorch:x", log=log, resolver=lambda r: None, previous=prev) == prev
    other = BaseImagePin(ref="rocm/pytorch:y", digest=DIGEST)
    assert pin_base_image("rocm/pytorch:x", log=log, resolver=lambda r: None, previous=other).digest == ""

    with pytest.raises(UsageError):
        pin_base_image("  ", log=log)


def test_long_fetch_progress_reaches_quiet_output(monkeypatch: pytest.MonkeyPatch) -> None:
    from pipeline import progress as progress_mod

    clock = [100.0]
    monkeypatch.setattr(sources.mirrors.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(progress_mod.time, "monotonic", lambda: clock[0])
    log, buf = log_buf()  # verbosity 0: detail lines are not shown
    shown = sources.FetchProgress(
        log, "https://h/aiter.git", after=5, progress=progress_mod.Progress(buf, live=False, interval_s=10)
    )
    shown("Receiving objects:   1% (1/100)")
    assert buf.getvalue() == ""  # a quick fetch stays quiet
    clock[0] += 6
    shown("Receiving objects:  20% (20/100)")
    clock[0] += 3
    shown("Receiving objects:  30% (30/100)")  # too soon for another line
    clock[0] += 8
    shown("Receiving objects:  70% (70/100)")
    lines = buf.getvalue().splitlines()
    assert [ln.split(" · ")[0] for ln in lines] == [
        "  … fetch https://h/aiter.git: 20 objects / 100 objects (20%)",
        "  … fetch https://h/aiter.git: 70 objects / 100 objects (70%), 6.4 objects/s",
    ]
