"""The summary caches stay bounded: a scheduled CI keeps one cache dir for months."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pipeline.compat import pysource
from pipeline.compat.pysource import SummaryCache, prune_files


def _filled(tmp_path: Path, n: int) -> SummaryCache:
    c = SummaryCache.open("aiter", tmp_path)
    for i in range(n):
        c.data[f"blob{i}:aiter/m{i}.py"] = "x" * 1000
    c.dirty = True
    c.save()
    return c


def test_an_oversized_summary_pickle_keeps_its_newest_and_recently_read_entries(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _filled(tmp_path, 100)
    size = (tmp_path / f"compat-aiter-v{pysource.SCHEMA}.pickle").stat().st_size
    monkeypatch.setattr(pysource, "MAX_CACHE_BYTES", size // 5)  # the cache is now 5x over

    c = SummaryCache.open("aiter", tmp_path)
    got = c.get_many(None, [("aiter/m3.py", "blob3")], lambda b, p: "never called")  # type: ignore[arg-type]
    assert got == {"aiter/m3.py": "x" * 1000}
    c.data["blob100:aiter/m100.py"] = "new"
    c.dirty = True
    c.save()

    kept = SummaryCache.open("aiter", tmp_path).data
    assert 5 <= len(kept) <= 15  # about half the cap: a tenth of the entries
    assert "blob3:aiter/m3.py" in kept and "blob100:aiter/m100.py" in kept
    assert "blob0:aiter/m0.py" not in kept and "blob50:aiter/m50.py" not in kept


def test_a_cache_under_its_cap_keeps_everything(tmp_path: Path) -> None:
    _filled(tmp_path, 100)
    c = SummaryCache.open("aiter", tmp_path)
    c.data["blob100:aiter/m100.py"] = "new"
    c.dirty = True
    c.save()
    assert len(SummaryCache.open("aiter", tmp_path).data) == 101


def test_prune_files_keeps_the_newest(tmp_path: Path) -> None:
    for i in range(6):
        f = tmp_path / f"compat-reach-v7-tree{i}-v16.pickle"
        f.write_bytes(b"")
        os.utime(f, (1000 + i, 1000 + i))
    (tmp_path / "compat-reach-files-v7-v16.pickle").write_bytes(b"")
    prune_files(tmp_path, "compat-reach-v7-*.pickle", 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "compat-reach-files-v7-v16.pickle",
        "compat-reach-v7-tree4-v16.pickle",
        "compat-reach-v7-tree5-v16.pickle",
    ]


def test_values_stay_pickled_until_read_and_only_new_ones_are_pickled_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _filled(tmp_path, 3)
    c = SummaryCache.open("aiter", tmp_path)
    assert c.data["blob1:aiter/m1.py"] == "x" * 1000
    c.data["blob9:aiter/m9.py"] = ["new"]
    pickled: list[object] = []
    real = pysource.pickle.dumps
    monkeypatch.setattr(pysource.pickle, "dumps", lambda v, **k: pickled.append(v) or real(v, **k))
    c.dirty = True
    c.save()
    assert pickled == [["new"]]  # the value only read, and those never read, kept their bytes
    again = SummaryCache.open("aiter", tmp_path).data
    assert dict(again) == {
        **{f"blob{i}:aiter/m{i}.py": "x" * 1000 for i in range(3)},
        "blob9:aiter/m9.py": ["new"],
    }


def test_a_value_that_no_longer_unpickles_is_absent(tmp_path: Path) -> None:
    _filled(tmp_path, 2)
    c = SummaryCache.open("aiter", tmp_path)
    dict.__setitem__(c.data, "blob0:aiter/m0.py", pysource._Packed(b"not a pickle"))
    assert "blob0:aiter/m0.py" not in c.data
    assert c.data.get("blob0:aiter/m0.py") is None
    assert dict(c.data) == {"blob1:aiter/m1.py": "x" * 1000}


def test_a_cache_file_of_the_old_whole_pickle_shape_reads_as_empty(tmp_path: Path) -> None:
    f = tmp_path / f"compat-aiter-v{pysource.SCHEMA}.pickle"
    f.write_bytes(pysource.pickle.dumps({"blob0:aiter/m0.py": "x"}))
    assert dict(SummaryCache.open("aiter", tmp_path).data) == {}
