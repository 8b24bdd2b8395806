"""Strict parsing of patch files and the series file (no git involved)."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import ExitCode, PatchError
from pipeline.patchq import Patch, PatchSeries
from pipeline.patchq.pq import slugify, split_message
from tests.fixtures.patch_repos import README_DIFF, patch_text, write_series

GOOD = patch_text(
    atom_range="d72060af8..03a353824",
    diff=README_DIFF,
    extra="X-Aiter-After: 08f04b889a\nX-Aiter-Requires: fused_qknorm_idxrqknorm has kv_cache_v\n",
)


def parse(text: str, name: str = "0001-x.patch") -> Patch:
    return Patch.parse(text.encode(), path=Path(name))


def test_good_patch_fields() -> None:
    p = parse(GOOD)
    assert p.subject == "minimax_m3: split KV cache"
    assert (str(p.atom_range), p.atom_range.start, p.atom_range.end) == (
        "d72060af8..03a353824",
        "d72060af8",
        "03a353824",
    )
    assert p.aiter_after == "08f04b889a"
    assert [str(r) for r in p.aiter_requires] == ["fused_qknorm_idxrqknorm has kv_cache_v"]
    assert p.version == 1
    assert p.author == ("Fixture Author", "fixture@example.invalid")
    assert p.body == "Long description."
    assert p.paths == ("README.md",)
    [f] = p.files
    [h] = f.hunks
    assert (h.old_start, h.old_count, h.new_start, h.new_count) == (1, 3, 1, 4)
    assert h.line == GOOD.split("\n").index("@@ -1,3 +1,4 @@") + 1
    assert len(p.sha256) == 64


def test_commit_message_carries_the_fields_as_trailers() -> None:
    msg = parse(GOOD).commit_message()
    subject, body, trailers = split_message(msg)
    assert subject == "minimax_m3: split KV cache" and body == "Long description."
    assert ("X-Atom-Range", "d72060af8..03a353824") in trailers
    assert ("Origin", "vendor") in trailers
    assert all(k not in ("From", "Date", "Subject") for k, _ in trailers)


def test_subject_tags_and_mbox_line_are_accepted() -> None:
    text = "From 0000000000000000000000000000000000000000 Mon Sep 17 00:00:00 2001\n" + GOOD.replace(
        "Subject: minimax", "Subject: [PATCH 1/2] minimax"
    )
    assert parse(text).subject == "minimax_m3: split KV cache"


@pytest.mark.parametrize(
    ("mutate", "line", "needle"),
    [
        (lambda t: t.replace("Origin: vendor\n", "Origin vendor\n"), 4, "malformed header line"),
        (lambda t: t.replace("Origin: vendor\n", "X-Atom-Rnage: 1234567..\n"), 4, "unknown pipeline field"),
        (lambda t: t.replace("Forwarded: no\n", "Origin: upstream\n"), 5, "repeated"),
        (
            lambda t: t.replace("X-Atom-Range: d72060af8..03a353824", "X-Atom-Range: main..v2"),
            7,
            "X-Atom-Range",
        ),
        (lambda t: t.replace("X-Patch-Version: 1", "X-Patch-Version: one"), 10, "X-Patch-Version"),
        (
            lambda t: t.replace(
                "X-Aiter-Requires: fused_qknorm_idxrqknorm has kv_cache_v", "X-Aiter-Requires: f needs p"
            ),
            9,
            "FUNCTION has|lacks PARAM",
        ),
        (lambda t: t.replace("@@ -1,3 +1,4 @@", "@@ -1,3 +1,4"), None, "malformed hunk header"),
        (lambda t: t.replace("@@ -1,3 +1,4 @@", "@@ -1,3 +1,5 @@"), None, "ends early"),
        (lambda t: t.replace("@@ -1,3 +1,4 @@", "@@ -1,2 +1,3 @@"), None, "after a hunk"),
        (lambda t: t.replace(" ATOM\n", "?ATOM\n"), None, "inside hunk"),
        (
            lambda t: t.replace("diff --git a/README.md b/README.md", "diff --git README.md README.md"),
            None,
            "a/",
        ),
    ],
)
def test_malformed_patches_name_file_and_line(mutate: object, line: int | None, needle: str) -> None:
    text = mutate(GOOD)  # type: ignore[operator]
    with pytest.raises(PatchError) as err:
        parse(text)
    msg = str(err.value)
    assert needle in msg
    assert msg.startswith("0001-x.patch:")
    if line is None:  # diff errors: the line named is the offending one in the diff section
        n = int(msg.split(":", 2)[1])
        assert n > GOOD.split("\n").index("---")
    else:
        assert msg.startswith(f"0001-x.patch:{line}:")
    assert err.value.exit_code == ExitCode.PATCH


def test_missing_required_field() -> None:
    with pytest.raises(PatchError, match="missing required field X-Atom-Range"):
        parse(GOOD.replace("X-Atom-Range: d72060af8..03a353824\n", ""))


def test_no_diff_is_an_error() -> None:
    with pytest.raises(PatchError, match="no `diff --git`"):
        parse(GOOD.split("diff --git")[0])


@pytest.mark.parametrize(
    "evil",
    ["../../etc/passwd", "/etc/passwd", "a/../../x", ".git/hooks/post-checkout", "sub/.git/config"],
)
def test_paths_outside_the_repository_are_refused(evil: str) -> None:
    text = GOOD.replace("a/README.md", f"a/{evil}").replace("b/README.md", f"b/{evil}")
    with pytest.raises(PatchError, match="outside the repository"):
        parse(text)


def test_symlink_pointing_outside_is_refused() -> None:
    diff = (
        "diff --git a/link b/link\nnew file mode 120000\n--- /dev/null\n+++ b/link\n"
        "@@ -0,0 +1 @@\n+../../../etc\n\\ No newline at end of file\n"
    )
    with pytest.raises(PatchError, match="symlink"):
        parse(patch_text(atom_range="1234567..", diff=diff))
    inside = diff.replace("+../../../etc", "+atom/models")
    assert parse(patch_text(atom_range="1234567..", diff=inside)).files[0].new_mode == "120000"


def test_series_file(tmp_path: Path) -> None:
    d = write_series(tmp_path / "p", {"0001-a.patch": GOOD, "0002-b.patch": GOOD.replace("KV", "kv")})
    (d / "series").write_text("# comment\n\n0001-a.patch -p1\n0002-b.patch  # trailing comment\n")
    s = PatchSeries.load(d)
    assert [p.name for p in s] == ["0001-a.patch", "0002-b.patch"]
    assert s.digest() != PatchSeries(d, s.patches[:1]).digest()


@pytest.mark.parametrize(
    ("series", "needle"),
    [
        ("0001-a.patch\n0001-a.patch\n", "listed twice"),
        ("0003-missing.patch\n", "does not exist"),
        ("../0001-a.patch\n", "not `NNNN-slug.patch`"),
        ("0001-a.patch -p2\n", "unsupported option"),
    ],
)
def test_bad_series_lines(tmp_path: Path, series: str, needle: str) -> None:
    d = write_series(tmp_path / "p", {"0001-a.patch": GOOD})
    (d / "series").write_text(series)
    with pytest.raises(PatchError, match=needle) as err:
        PatchSeries.load(d)
    assert f"{d / 'series'}:" in str(err.value)


def test_missing_series_file(tmp_path: Path) -> None:
    with pytest.raises(PatchError, match="no series file"):
        PatchSeries.load(tmp_path)


def test_slugify() -> None:
    assert slugify("minimax_m3: split KV cache for fused_qknorm_idxrqknorm") == (
        "minimax-m3-split-kv-cache-for-fused-qknorm"
    )
    assert slugify("!!!") == "patch"


def test_the_shipped_series_parses() -> None:
    root = Path(__file__).resolve().parents[2]
    s = PatchSeries.load(root / "patches" / "atom")
    [p] = s.patches
    assert p.name.startswith("0001-") and p.version >= 1
    assert str(p.atom_range) == "d72060af8ef8..03a3538243e8"
    assert [str(r) for r in p.aiter_requires] == ["fused_qknorm_idxrqknorm has kv_cache_v"]
    assert p.paths == ("atom/models/minimax_m3.py",)
    added = [ln for f in p.files for h in f.hunks for ln in h.lines if ln.startswith("+")]
    assert any("self.kv_cache.unbind(1)" in ln for ln in added)
    assert any("kv_cache_v" in ln for ln in added)
