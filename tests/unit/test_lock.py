from pathlib import Path

import pytest

from pipeline.errors import ExitCode, LockFileError
from pipeline.lock import BaseImagePin, Lock, PatchPin, SourcePin, Sources, Submodule

SHA_A = "a" * 40
SHA_B = "b" * 40


def make_lock() -> Lock:
    pin = SourcePin(url="file:///x", ref="main", sha=SHA_A, date="2026-06-24T09:00:00Z", subject="s")
    aiter = SourcePin(
        url="file:///y",
        ref="main",
        sha=SHA_B,
        date="2026-06-23T10:09:28Z",
        subject="t",
        submodules=(Submodule(path="3rdparty/ck", url="file:///ck", sha="c" * 40),),
    )
    return Lock(model="M", sources=Sources(atom=pin, aiter=aiter), base_image=BaseImagePin(ref="base:1"))


def test_roundtrip_and_noop_save(tmp_path: Path) -> None:
    lock = make_lock().with_patches((PatchPin(name="0001-x.patch", sha256="d" * 64, status="applied"),))
    path = tmp_path / "locks" / "M.toml"
    assert lock.save(path) is True
    mtime = path.stat().st_mtime_ns
    assert Lock.load(path) == lock
    assert lock.save(path) is False
    assert path.stat().st_mtime_ns == mtime
    assert Lock.load(path).aiter.submodules[0].sha == "c" * 40


def test_digest_changes_with_inputs() -> None:
    a = make_lock()
    b = a.with_patches((PatchPin(name="0001-x.patch", sha256="d" * 64, status="applied"),))
    assert a.digest() != b.digest() and a.digest() == make_lock().digest()


def test_base_image_pinned_reference() -> None:
    assert BaseImagePin(ref="r/p:1").pinned == "r/p:1"
    d = "sha256:" + "e" * 64
    assert BaseImagePin(ref="r/p:1", digest=d).pinned == f"r/p:1@{d}"


def test_corrupt_lock_names_file_and_line(tmp_path: Path) -> None:
    path = tmp_path / "M.toml"
    path.write_text(make_lock().to_toml().replace('model = "M"', "model = M"))
    with pytest.raises(LockFileError) as e:
        Lock.load(path)
    assert str(path) in str(e.value) and "line" in str(e.value)
    assert e.value.exit_code == ExitCode.SOURCE


def test_invalid_field_names_key_and_line(tmp_path: Path) -> None:
    path = tmp_path / "M.toml"
    path.write_text(make_lock().to_toml().replace(SHA_A, "abc"))
    with pytest.raises(LockFileError) as e:
        Lock.load(path)
    assert "sources.atom.sha" in str(e.value) and "line" in str(e.value)


def test_missing_lock_says_run_pin(tmp_path: Path) -> None:
    with pytest.raises(LockFileError, match="pipeline pin"):
        Lock.load(tmp_path / "nope.toml")


def test_digest_ignores_the_requested_refs_but_not_the_shas() -> None:
    a = make_lock()
    renamed = a.model_copy(
        update={
            "sources": a.sources.model_copy(update={"aiter": a.aiter.model_copy(update={"ref": "auto:main"})})
        }
    )
    assert renamed.to_toml() != a.to_toml()  # the file still says how it was asked
    assert renamed.digest() == a.digest()  # the same commits pin the same image
    moved = a.model_copy(
        update={
            "sources": a.sources.model_copy(update={"aiter": a.aiter.model_copy(update={"sha": "f" * 40})})
        }
    )
    assert moved.digest() != a.digest()


def test_the_pair_digest_is_what_the_image_is_built_from_and_no_model() -> None:
    a = make_lock().with_patches((PatchPin(name="0001-x.patch", sha256="d" * 64, status="applied"),))
    same = a.model_copy(update={"model": "Other-Model"})
    same = same.with_patches(
        (*same.patches, PatchPin(name="0002-y.patch", sha256="e" * 64, status="not-needed"))
    )
    asked = same.model_copy(
        update={
            "sources": same.sources.model_copy(update={"atom": same.atom.model_copy(update={"ref": "v1"})})
        }
    )
    assert a.digest() != same.digest()  # the lock names its model
    assert a.pair_digest() == same.pair_digest() == asked.pair_digest()  # the image does not
    assert "model" not in a.pair()
    other_patch = a.with_patches((PatchPin(name="0001-x.patch", sha256="f" * 64, status="applied"),))
    other_base = a.model_copy(update={"base_image": BaseImagePin(ref="base:1", digest="sha256:" + "1" * 64)})
    other_sub = a.model_copy(
        update={
            "sources": a.sources.model_copy(
                update={
                    "aiter": a.aiter.model_copy(
                        update={
                            "submodules": (Submodule(path="3rdparty/ck", url="file:///ck", sha="9" * 40),)
                        }
                    )
                }
            )
        }
    )
    for other in (other_patch, other_base, other_sub, make_lock()):
        assert other.pair_digest() != a.pair_digest()
