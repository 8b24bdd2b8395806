"""A check with the previous night's cache says exactly what a cold check says (issue 28 §7).

Night after night, ATOM and aiter each move on (aiter's default branch with them, as a
scheduled rebuild sees it), and each night's check runs on the cache the last one left.
What the cache carries over (aiter's first parents and `git log --raw`, ATOM's file-added
times, summaries kept pickled until read) must give the report a check with an empty
cache gives, change by change: a caller file, an aiter callee's signature in a
star-imported module, a moved-back tip, a merge in ATOM, and a model's reach path.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from pipeline.compat import CheckReport, carry, incremental, run_check
from pipeline.compat.cause import stored_log
from pipeline.compat.pysource import SummaryCache
from pipeline.compat.reach import ModelFacts, Reach, compute_reach
from pipeline.gitw import GitRepo
from tests.fixtures.compat_repos import CompatRepos, build_compat_repos
from tests.fixtures.gitfixture import commit_all, git, init_repo, write_files
from tests.fixtures.reach_repos import build_reach_repos


def _said(r: CheckReport) -> dict[str, Any]:
    out = r.to_json()
    out.pop("seconds", None)
    return out


@pytest.fixture(scope="module")
def fx(tmp_path_factory: pytest.TempPathFactory) -> tuple[CompatRepos, Path]:
    root = tmp_path_factory.mktemp("nightly")
    repos = build_compat_repos(root / "fx")
    # A bare copy whose default branch is moved to each night's aiter (the tip histories read from).
    bare = root / "aiter.git"
    git(root, "clone", "-q", "--bare", str(repos.aiter), str(bare))
    # T4: a file added overnight, written (authored) before aiter's last change.
    write_files(
        repos.atom,
        {"atom/late.py": "import aiter\n\n\ndef f(a, b, c, d):\n    return aiter.reduce_v1(a, b, c, d)\n"},
    )
    git(repos.atom, "add", "-A")
    git(repos.atom, "commit", "-q", "-m", "T4: a late file", date="2026-05-03T10:00:00+00:00",
        env={"GIT_AUTHOR_DATE": "2026-03-15T10:00:00+00:00"})  # fmt: skip
    repos.t["T4"] = git(repos.atom, "rev-parse", "HEAD")
    return repos, bare


class Extensions:
    """How often each whole-history fact was extended from the last run's, not read whole."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.first_parents = 0
        self.linear = 0
        fp, lin = incremental.first_parents_since, incremental.linear_since

        def first_parents(*a: Any) -> Any:
            got = fp(*a)
            self.first_parents += got is not None
            return got

        def linear(*a: Any) -> Any:
            got = lin(*a)
            self.linear += got is not None
            return got

        monkeypatch.setattr(incremental, "first_parents_since", first_parents)
        monkeypatch.setattr(incremental, "linear_since", linear)


def _fact(cache: Path, kind: str, key: str) -> Any:
    store = SummaryCache.open(kind, cache)
    if key.startswith("all-logs:"):  # (a night keeps its commits over the last night's log)
        rev, _, prefix = key[len("all-logs:") :].partition(":")
        return stored_log(store, rev, prefix)
    return store.data.get(key)


def _night(fx: tuple[CompatRepos, Path], atom: str, aiter: str, cache: Path) -> CheckReport:
    repos, bare = fx
    git(bare, "update-ref", "refs/heads/main", aiter)
    return run_check(GitRepo(repos.atom), atom, GitRepo(bare), aiter, cache_dir=cache)


def test_each_night_with_the_last_nights_cache_reports_what_a_cold_check_reports(
    fx: tuple[CompatRepos, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repos, _ = fx
    t, a = repos.t, repos.a
    seen = Extensions(monkeypatch)
    nights = [
        (t["T1"], a["A1c"]),
        (t["T1b"], a["A2"]),  # ATOM: an unrelated change; aiter: fused_qk's signature (star-imported)
        (t["T2"], a["A3"]),  # the callers updated; gemm's `scale` removed, a module deleted
        (t["T3"], a["A4"]),  # a caller file changed again; three signatures changed
        (t["T4"], a["A4"]),  # a file added
        (t["T4"], a["A3"]),  # aiter's branch moved back: its histories are read whole again
    ]
    cache = tmp_path / "cache"
    for i, (atom_sha, aiter_sha) in enumerate(nights):
        got = _night(fx, atom_sha, aiter_sha, cache)
        cold = _night(fx, atom_sha, aiter_sha, tmp_path / f"cold{i}")
        assert _said(got) == _said(cold), f"night {i}: {atom_sha[:8]} x {aiter_sha[:8]}"
        # The facts carried over are the facts read whole: first parents, raw log, file-added times.
        for kind, key in (
            ("facts", f"first-parent:{aiter_sha}"),
            ("logs", f"all-logs:{aiter_sha}:aiter/"),
            ("facts", f"added:{atom_sha}"),
        ):
            kept = _fact(cache, kind, key)
            assert kept is not None and kept == _fact(tmp_path / f"cold{i}", kind, key), (i, key)
    assert any(f.severity == "error" for f in got.findings)  # (the nights compared real findings)
    # Nights 1-3 extended aiter's first parents (the first parents once, the raw log once, each
    # night) and ATOM's file-added times; night 4 could not (aiter moved back).
    assert seen.first_parents >= 3
    assert seen.linear >= 3


def test_a_merge_in_atom_reads_its_file_history_whole_and_reports_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    repos = build_compat_repos(tmp_path / "fx")
    t, a = repos.t, repos.a
    cache = tmp_path / "cache"
    run_check(GitRepo(repos.atom), t["T2"], GitRepo(repos.aiter), a["A4"], cache_dir=cache)
    # A side branch from T1 adds a caller; merged on top of T3.
    git(repos.atom, "checkout", "-q", "-b", "side", t["T1"])
    write_files(repos.atom, {"atom/side.py": "import aiter\n\n\ndef f(x):\n    return aiter.gemm(x)\n"})
    commit_all(repos.atom, "side: a caller", "2026-04-20T10:00:00+00:00")
    git(repos.atom, "checkout", "-q", "main")
    git(repos.atom, "reset", "-q", "--hard", t["T3"])
    git(repos.atom, "merge", "-q", "--no-ff", "-m", "merge side", "side", date="2026-05-03T10:00:00+00:00")
    merged = git(repos.atom, "rev-parse", "HEAD")
    seen = Extensions(monkeypatch)
    got = run_check(GitRepo(repos.atom), merged, GitRepo(repos.aiter), a["A4"], cache_dir=cache)
    cold = run_check(GitRepo(repos.atom), merged, GitRepo(repos.aiter), a["A4"], cache_dir=tmp_path / "c")
    assert _said(got) == _said(cold)
    assert any(f.path == "atom/side.py" for f in got.findings)
    assert seen.linear == 0  # a merge in between: not a plain chain


def _reach_said(r: Reach) -> dict[str, object]:
    return {
        "json": r.to_json(),
        "parents": r.parents,
        "excluded": r.excluded,
        "importers": r.importers,
        "summary": r.edges_summary(),
        "evidence": {p: r.evidence(p) for p in sorted(r.files)},
    }


def test_a_reach_path_changed_overnight_gives_the_cold_reach(tmp_path: Path) -> None:
    repos = build_reach_repos(tmp_path / "fx")
    atom = GitRepo(repos.atom)
    first = repos.atom_sha
    cache = tmp_path / "cache"
    facts = ModelFacts("GammaForCausalLM")
    compute_reach(atom, first, facts, cache_dir=cache)
    # Gamma's module now imports another file inside a function: a new edge on the model's path.
    write_files(
        repos.atom,
        {
            "atom/models/gamma.py": (
                "from atom.model_ops.attn import Backend\n\n\n"
                "class GammaForCausalLM:\n"
                "    backend = Backend\n\n"
                "    def run(self, x):\n"
                "        from atom.model_ops.broken import run\n\n"
                "        return run(x, x, x)\n"
            )
        },
    )
    second = commit_all(repos.atom, "Gamma calls broken.run", "2026-01-20T00:00:00+00:00")
    got = compute_reach(atom, second, facts, cache_dir=cache)
    cold_dir = tmp_path / "cold"
    cold = compute_reach(atom, second, facts, cache_dir=cold_dir)
    assert _reach_said(got) == _reach_said(cold)
    assert got.on_path("atom/model_ops/broken.py")
    shutil.rmtree(cold_dir)


class Nights:
    """Each night's check of ATOM's and aiter's heads on the last night's cache, beside a cold one."""

    def __init__(self, atom: Path, aiter: Path, tmp: Path) -> None:
        self.atom, self.aiter, self.tmp = GitRepo(atom), GitRepo(aiter), tmp

    def __call__(self, n: int, pin: str = "HEAD") -> CheckReport:
        """`pin`: aiter's pinned commit (its HEAD, aiter's tip, by default)."""
        got = run_check(self.atom, "HEAD", self.aiter, pin, cache_dir=self.tmp / "cache")
        cold = run_check(self.atom, "HEAD", self.aiter, pin, cache_dir=self.tmp / f"cold{n}")
        assert _said(got) == _said(cold), f"night {n}"
        return got


class Carrying:
    """Which calls each check carried from the last one (`pipeline.compat.carry`), by qualname."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls: list[str] = []
        original = carry.Carried.verdict

        def verdict(this: carry.Carried, call: Any) -> Any:
            got = original(this, call)
            if got is not None:
                self.calls.append(call.qualname)
            return got

        monkeypatch.setattr(carry.Carried, "verdict", verdict)

    def take(self) -> list[str]:
        out, self.calls = sorted(self.calls), []
        return out


def test_a_plain_verdict_is_carried_only_while_everything_it_read_holds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Night by night: a call moved by an edit above it keeps its verdict at its new line; a change
    to the callee's module, a star-imported module that starts to define the name, or a file
    touched in the callee's history makes the call bound again; a cold check agrees every night."""
    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    write_files(
        aiter,
        {
            "aiter/__init__.py": "from .ops import *\nfrom .extra import *\n",
            "aiter/ops.py": "def f(a, b):\n    pass\n\n\ndef g(x, *, flag=False):\n    pass\n",
            "aiter/extra.py": "def unrelated():\n    pass\n",
            "aiter/quant.py": "def h(t):\n    pass\n",
        },
    )
    commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    write_files(aiter, {"README": "aiter\n"})  # (after ATOM's commits: the ATOM-date screen is A0)
    commit_all(aiter, "A0b", "2026-01-03T00:00:00+00:00")
    caller = "import aiter\nfrom aiter.quant import h\n\n\ndef run(a, b, x, t):\n" \
        "    aiter.f(a, b)\n    aiter.g(x, flag=True)\n    h(t)\n    return aiter.unrelated()\n"  # fmt: skip
    write_files(atom, {"atom/__init__.py": "", "atom/m.py": caller})
    commit_all(atom, "T0", "2026-01-02T00:00:00+00:00")
    seen = Carrying(monkeypatch)
    night = Nights(atom, aiter, tmp_path)

    assert night(0).calls_checked == 4 and seen.take() == []
    # ATOM: three lines above the calls. Every verdict moves with its call.
    write_files(atom, {"atom/m.py": "# a\n# b\n# c\n" + caller})
    commit_all(atom, "T1", "2026-01-02T01:00:00+00:00")
    assert night(1).findings == [] and seen.take() == [
        "aiter.f",
        "aiter.g",
        "aiter.quant.h",
        "aiter.unrelated",
    ]
    # aiter: g loses `flag`; f's and g's module changed, h's did not.
    write_files(aiter, {"aiter/ops.py": "def f(a, b):\n    pass\n\n\ndef g(x):\n    pass\n"})
    commit_all(aiter, "A1: g without flag", "2026-01-04T00:00:00+00:00")
    got = night(2)
    assert [f.line for f in got.findings] == [10]  # `aiter.g(x, flag=True)`, bound again
    assert seen.take() == ["aiter.quant.h", "aiter.unrelated"]
    # aiter: a star-imported module starts to define `f` (it did not mention it: that fact broke).
    write_files(aiter, {"aiter/extra.py": "def unrelated():\n    pass\n\n\ndef f(a):\n    pass\n"})
    commit_all(aiter, "A2: extra.f", "2026-01-05T00:00:00+00:00")
    got = night(3)
    assert [f.line for f in got.findings if "aiter.f" in f.message] == [9]
    assert "aiter.f" not in seen.take()
    # aiter: h's file changes in a way that keeps h; its history moved on, so h is bound again.
    write_files(aiter, {"aiter/quant.py": "def h(t):\n    pass\n\n\ndef h2(t):\n    pass\n"})
    commit_all(aiter, "A3: quant.h2", "2026-01-06T00:00:00+00:00")
    night(4)
    assert "aiter.quant.h" not in seen.take()


def test_a_carried_op_call_is_bound_again_when_another_file_starts_to_name_the_op(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`torch.ops.aiter.<op>` is found through the aiter files that name the op, in path order: a
    file added before the registering one, registering the op with another signature, changes
    what the call binds to, though nothing the last resolution read changed."""
    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    register = 'def {f}({params}):\n    pass\n\n\ndirect_register_custom_op("norm_op", {f})\n'
    write_files(
        aiter,
        {
            "aiter/__init__.py": "",
            "aiter/ops/__init__.py": "",
            "aiter/ops/norm.py": register.format(f="norm_impl", params="x, eps"),
        },
    )
    commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    write_files(aiter, {"README": "aiter\n"})
    commit_all(aiter, "A0b", "2026-01-03T00:00:00+00:00")
    caller = "import torch\n\n\ndef run(x):\n    return torch.ops.aiter.norm_op(x, 1e-6)\n"
    write_files(atom, {"atom/__init__.py": "", "atom/m.py": caller})
    commit_all(atom, "T0", "2026-01-02T00:00:00+00:00")
    seen = Carrying(monkeypatch)
    night = Nights(atom, aiter, tmp_path)

    first = night(0)
    assert first.calls_checked == 1 and not first.findings and seen.take() == []
    write_files(aiter, {"README": "aiter, again\n"})
    commit_all(aiter, "A1", "2026-01-04T00:00:00+00:00")
    assert not night(1).findings and seen.take() == ["torch.ops.aiter.norm_op"]
    # A file before norm.py in path order now registers the op, taking one argument.
    write_files(aiter, {"aiter/ops/early.py": register.format(f="early_impl", params="x")})
    commit_all(aiter, "A2", "2026-01-05T00:00:00+00:00")
    assert [f.line for f in night(2).findings] == [5]
    assert seen.take() == []


# The carry's conditions on the callee's history and on the ATOM-date screen: each test builds a
# night whose cold check doubts a call last night's check found plain, though the pin's resolution
# of the callee is unchanged. `f(x, kv)` binds at `f(x, y=None)`, but was written for a layout
# with `kv` (its argument's name says so): where a screen sees that layout, the call is reported.
WITH_KV = "def f(x, kv=None, y=None):\n    pass\n"
WITHOUT_KV = "def f(x, y=None):\n    pass\n"
# Beside it, a call that reads nothing these nights change: it is carried every night.
ATOM_FILES = {
    "atom/__init__.py": "",
    "atom/m.py": "import aiter\n\n\ndef run(x, kv):\n    return aiter.f(x, kv)\n",
    "atom/other.py": "from aiter.quant import g\n\n\ndef run(x):\n    return g(x)\n",
}


def _aiter(f: str) -> dict[str, str | None]:
    return {
        "aiter/__init__.py": "from .ops import *\n",
        "aiter/ops.py": f,
        "aiter/quant.py": "def g(x):\n    pass\n",
    }


def test_a_carried_verdict_is_bound_again_when_the_callees_file_changed_and_changed_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Overnight aiter's branch gains two commits to the callee's file, one dated before the ATOM
    file was created: `kv` added, then taken out again. The pin's blob is last night's, but the
    callee's layout when the ATOM file was created is now the one with `kv`."""
    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    write_files(aiter, _aiter(WITHOUT_KV))
    commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    write_files(atom, ATOM_FILES)
    commit_all(atom, "T0", "2026-01-05T00:00:00+00:00")
    seen = Carrying(monkeypatch)
    night = Nights(atom, aiter, tmp_path)

    assert night(0).findings == [] and seen.take() == []
    # (older work, landed by a fast-forward: its commit date is before the ATOM file's creation)
    write_files(aiter, {"aiter/ops.py": WITH_KV})
    commit_all(aiter, "A1: f takes kv", "2026-01-03T00:00:00+00:00")
    write_files(aiter, {"aiter/ops.py": WITHOUT_KV})
    commit_all(aiter, "A2: f without kv again", "2026-01-07T00:00:00+00:00")
    # ATOM moves past A2: its date screen is the pin (only the file's history can doubt the call).
    write_files(atom, {"atom/__init__.py": "# T1\n"})
    commit_all(atom, "T1", "2026-01-08T00:00:00+00:00")
    got = night(1)
    assert [(f.line, f.kind) for f in got.findings] == [(5, "positional-shift")]
    assert seen.take() == ["aiter.quant.g"]


def test_a_carried_verdict_is_bound_again_when_its_atom_file_was_re_created_earlier(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The ATOM file is deleted and added again by a commit authored before `kv` was taken out (a
    cherry-pick of older work): the file is older than it was, and so is the layout it was
    created against. aiter did not move."""
    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    write_files(aiter, _aiter(WITH_KV))
    commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    write_files(aiter, {"aiter/ops.py": WITHOUT_KV})
    commit_all(aiter, "A1: f without kv", "2026-01-03T00:00:00+00:00")
    write_files(atom, ATOM_FILES)
    commit_all(atom, "T0", "2026-01-04T00:00:00+00:00")
    seen = Carrying(monkeypatch)
    night = Nights(atom, aiter, tmp_path)

    assert night(0).findings == [] and seen.take() == []
    write_files(atom, {"atom/m.py": None})
    commit_all(atom, "T1: m.py removed", "2026-01-05T00:00:00+00:00")
    write_files(atom, {"atom/m.py": ATOM_FILES["atom/m.py"]})
    git(atom, "add", "-A")
    git(atom, "commit", "-q", "-m", "T2: m.py again", date="2026-01-06T00:00:00+00:00",
        env={"GIT_AUTHOR_DATE": "2026-01-02T00:00:00+00:00"})  # fmt: skip
    got = night(1)
    assert [(f.line, f.kind) for f in got.findings] == [(5, "positional-shift")]
    assert seen.take() == ["aiter.quant.g"]


@pytest.mark.parametrize(
    ("written", "carried"),
    [
        # last night's date screen was the pin: no clean verdict read one, none is carried
        ("2026-01-02T00:00:00+00:00", []),
        # it was A1: `g`'s resolution there still holds at A2, `f`'s does not
        ("2026-01-04T00:00:00+00:00", ["aiter.quant.g"]),
    ],
)
def test_a_carried_verdict_is_bound_again_when_the_atom_date_screen_resolves_it_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str, carried: list[str]
) -> None:
    """The pin lags aiter's tip; ATOM's next commit is dated after aiter's tip added a module that
    defines `f` with `kv` and is star-imported after the pin's: the date screen resolves `f` there.
    The callee's file and the pin did not change."""
    atom, aiter = init_repo(tmp_path / "atom"), init_repo(tmp_path / "aiter")
    write_files(aiter, _aiter(WITHOUT_KV))
    pin = commit_all(aiter, "A0", "2026-01-01T00:00:00+00:00")
    write_files(aiter, {"README": "aiter\n"})
    commit_all(aiter, "A1", "2026-01-03T00:00:00+00:00")
    write_files(
        aiter, {"aiter/__init__.py": "from .ops import *\nfrom .fast import *\n", "aiter/fast.py": WITH_KV}
    )
    commit_all(aiter, "A2: a faster f, with kv", "2026-01-05T00:00:00+00:00")
    write_files(atom, ATOM_FILES)
    commit_all(atom, "T0", written)
    seen = Carrying(monkeypatch)
    night = Nights(atom, aiter, tmp_path)

    assert night(0, pin).findings == [] and seen.take() == []
    write_files(atom, {"atom/__init__.py": "# T1\n"})
    commit_all(atom, "T1", "2026-01-06T00:00:00+00:00")
    got = night(1, pin)
    assert [(f.line, f.kind) for f in got.findings] == [(5, "positional-shift")]
    assert seen.take() == carried


@pytest.mark.parametrize(
    ("chain", "kinds", "kept"),
    [
        (1, [2, 4, 2, 4], ("A3", "A4")),  # whole, A2's commits over A1, whole (chain full), A4's over A3
        (3, [2, 4, 4, 4], ("A1", "A2", "A3", "A4")),  # the newest two, and the entries they are over
    ],
)
def test_a_night_keeps_only_its_commits_of_aiters_log_over_the_last_nights_and_reads_it_whole(
    fx: tuple[CompatRepos, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    chain: int,
    kinds: list[int],
    kept: tuple[str, ...],
) -> None:
    """aiter's whole first-parent log (600 KB on the real mirror) is not written again each night:
    a night keeps its own commits over the last night's entry, up to `LOG_CHAIN_MAX` nights, then
    the whole log again; what a night reads back is what a cold check reads."""
    from pipeline.compat import cause

    monkeypatch.setattr(cause, "LOG_CHAIN_MAX", chain)
    repos, _ = fx
    t, a = repos.t, repos.a
    cache = tmp_path / "cache"
    got = []
    for i, aiter_sha in enumerate([a["A1"], a["A2"], a["A3"], a["A4"]]):
        _night(fx, t["T2"], aiter_sha, cache)
        _night(fx, t["T2"], aiter_sha, tmp_path / f"cold{i}")
        key = f"all-logs:{aiter_sha}:aiter/"
        got.append(len(_raw(cache, key)))
        assert _fact(cache, "logs", key) == _fact(tmp_path / f"cold{i}", "logs", key), i
    assert got == kinds  # 2: a whole log; 4: the commits since an older tip's
    left = [k for k in SummaryCache.open("logs", cache).data if k.startswith("all-logs:")]
    assert sorted(left) == sorted(f"all-logs:{a[x]}:aiter/" for x in kept)


def _raw(cache: Path, key: str) -> Any:
    return SummaryCache.open("logs", cache).data.get(key)
