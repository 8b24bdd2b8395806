"""aiter's first-parent log is kept as plain tuples; versions are made per file when asked (a
night reads the 600 KB log for which files a few commits changed, and a handful of files' versions)."""

from __future__ import annotations

import pickle

from pipeline.compat.cause import _parse_raw_log, _raw_log_commits

RAW = (
    "\x01c3\x00c2\x001767261600\x00Ann\x00third\n\n"
    ":100644 100644 b2 b3 M\taiter/ops/a.py\n"
    ":100644 000000 b9 0000000000000000000000000000000000000000 D\taiter/gone.py\n"
    "\x01c2\x00c1 m1\x001767175200\x00Bob\x00second\n\n"
    ":100644 100644 b1 b2 M\taiter/ops/a.py\n"
    ":100644 100644 r1 r2 M\tREADME.md\n"
    "\x01c1\x00\x001767088800\x00Ann\x00first\n\n"
    ":000000 100644 0000000000000000000000000000000000000000 b1 A\taiter/ops/a.py\n"
    ":000000 100644 0000000000000000000000000000000000000000 b9 A\taiter/gone.py\n"
)


def test_the_log_is_kept_without_a_version_object_and_reads_as_the_parsed_commits() -> None:
    logs, parents = _parse_raw_log(RAW)
    kept = pickle.dumps(logs, pickle.HIGHEST_PROTOCOL)
    assert b"FileVersion" not in kept and b"CommitInfo" not in kept and b"datetime" not in kept
    assert parents == {"c3": "c2", "c2": "c1", "c1": None}
    again = pickle.loads(kept)
    assert again == logs
    assert sorted(again.changes()) == [
        ("aiter/gone.py", "c1"), ("aiter/gone.py", "c3"),
        ("aiter/ops/a.py", "c1"), ("aiter/ops/a.py", "c2"), ("aiter/ops/a.py", "c3"),
    ]  # fmt: skip
    commits = {info.sha: info for info, _, _ in _raw_log_commits(RAW)}
    versions = again.get("aiter/ops/a.py")
    assert [(v.commit, v.blob) for v in versions] == [
        (commits["c3"], "b3"),
        (commits["c2"], "b2"),
        (commits["c1"], "b1"),
    ]
    assert [v.blob for v in again.get("aiter/gone.py")] == [None, "b9"]
    assert again.get("README.md") == [] and again.get("aiter/none.py") == []
    assert again.get("aiter/ops/a.py")[0].commit is again.get("aiter/gone.py")[0].commit  # (one per commit)


def test_a_nights_commits_go_on_top_of_the_older_log() -> None:
    logs, _ = _parse_raw_log(RAW)
    older = RAW.split("\x01c2")[0]  # (c3 alone: as if it were the night, the rest older)
    night, _ = _parse_raw_log(older)
    rest, _ = _parse_raw_log("\x01c2" + RAW.split("\x01c2")[1])
    assert night.over(rest) == logs
    assert [v.blob for v in night.over(rest).get("aiter/ops/a.py")] == ["b3", "b2", "b1"]


def test_the_changes_of_the_newest_commits_are_read_without_the_rest_of_each_file() -> None:
    logs, _ = _parse_raw_log(RAW)
    asked: list[str] = []

    def newer(sha: str) -> bool:
        asked.append(sha)
        return sha == "c3"

    assert sorted(logs.changes(newer)) == [("aiter/gone.py", "c3"), ("aiter/ops/a.py", "c3")]
    assert sorted(asked) == ["c1", "c2", "c3", "c3"]  # (each file read down to its first older change)
