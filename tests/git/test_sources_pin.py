"""`pin`: the Lock built from fixture upstreams, with aiter's submodule."""

from __future__ import annotations

import io
import subprocess
from pathlib import Path
from typing import Any

import pytest

from pipeline.config import Settings, load_settings
from pipeline.errors import SourceError, UsageError
from pipeline.gitw import CommitInfo, GitRepo
from pipeline.lock import Lock, PatchPin
from pipeline.log import Logger
from pipeline.sources import mirrors_for_lock, pin, submodule_mirror
from tests.fixtures.upstream_repos import CK_PATH, Upstreams, free_port, git_daemon, make_upstreams

DIGEST = "sha256:" + "e" * 64


pytestmark = pytest.mark.usefixtures("fast_backoff")  # (tests/git/conftest.py)


def make_settings(tmp_path: Path, atom: str, aiter: str, **overrides: object) -> Settings:
    return load_settings(
        env={},
        cwd=tmp_path,
        overrides={
            "cache_dir": str(tmp_path / "cache"),
            "locks_dir": str(tmp_path / "locks"),
            "atom_repo": atom,
            "aiter_repo": aiter,
            **overrides,
        },
    )


def make_log() -> tuple[Logger, io.StringIO]:
    buf = io.StringIO()
    return Logger(verbosity=1, stream=buf), buf


def no_registry(ref: str) -> str | None:
    return None


def pin_unresolved(
    s: Settings, log: Logger, *, atom_ref: str = "main", base_image: str = "b", **kw: Any
) -> Lock:
    """The lock `pin` makes for model M at aiter main, with no registry to give the base image a digest."""
    return pin(
        s,
        model="M",
        atom_ref=atom_ref,
        aiter_ref="main",
        base_image=base_image,
        log=log,
        digest_resolver=no_registry,
        **kw,
    ).lock


def test_pin_builds_the_lock_with_submodules(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    lock = pin(
        s,
        model="MiniMax-M3-MXFP4",
        atom_ref="v1.0",
        aiter_ref="main",
        base_image="registry.invalid/base:1",
        log=log,
        digest_resolver=lambda ref: DIGEST if ref == "registry.invalid/base:1" else None,
    ).lock
    assert lock.model == "MiniMax-M3-MXFP4"
    assert lock.atom.url == str(ups.atom.path) and lock.atom.ref == "v1.0"
    assert lock.atom.sha == ups.shas["atom_1"]
    assert lock.atom.subject == "ATOM: MiniMax-M3 model"
    assert lock.atom.date == "2026-06-09T10:14:20Z"  # fixture clock: epoch + 1 minute
    assert lock.aiter.sha == ups.shas["aiter_split"]
    (sub,) = lock.aiter.submodules
    assert sub.path == CK_PATH
    assert sub.sha == ups.shas["ck_2"]
    assert sub.url == str(ups.ck.path)  # "../ck" resolved against aiter's path
    assert lock.base_image.ref == "registry.invalid/base:1" and lock.base_image.digest == DIGEST
    ck = submodule_mirror(s, sub.url)
    assert ck is not None and ck.rev_parse(sub.sha) == sub.sha
    # the lock round-trips through TOML
    assert Lock.parse(lock.to_toml()) == lock
    # pinned commits are protected in the mirrors
    atom, aiter = mirrors_for_lock(s, lock)
    assert atom.rev_parse(f"refs/pins/{lock.atom.sha}") == lock.atom.sha
    assert aiter.rev_parse(f"refs/pins/{lock.aiter.sha}") == lock.aiter.sha


def test_submodule_at_an_older_aiter_commit(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    lock = pin(s, model="M", atom_ref="main", aiter_ref="v0.1", base_image="b@" + DIGEST, log=log).lock
    assert lock.aiter.sha == ups.shas["aiter_old"]
    assert lock.aiter.submodules[0].sha == ups.shas["ck_1"]
    assert lock.base_image.digest == DIGEST  # taken from the reference itself


def test_everything_over_git_daemon_with_relative_submodule_url(tmp_path: Path, ups: Upstreams) -> None:
    with git_daemon(ups.root) as d:
        s = make_settings(tmp_path, d.url("ATOM"), d.url("aiter"))
        log, _ = make_log()
        lock = pin_unresolved(s, log, atom_ref="HEAD")
        (sub,) = lock.aiter.submodules
        assert sub.url == d.url("ck")
        ck = submodule_mirror(s, sub.url)
        assert ck is not None and ck.rev_parse(sub.sha) == ups.shas["ck_2"]
    assert lock.atom.url == d.url("ATOM")


def test_unreachable_submodule_is_recorded_with_a_warning(tmp_path: Path) -> None:
    dead = f"git://127.0.0.1:{free_port()}/ck"
    ups = make_upstreams(tmp_path, submodule_url=dead)
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, buf = make_log()
    lock = pin_unresolved(s, log)
    (sub,) = lock.aiter.submodules
    assert sub.url == dead and sub.sha == ups.shas["ck_2"]
    assert "could not be mirrored" in buf.getvalue()
    assert submodule_mirror(s, dead) is None


def test_mirror_submodules_off(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url, mirror_submodules=False)
    log, _ = make_log()
    lock = pin_unresolved(s, log)
    assert lock.aiter.submodules[0].sha == ups.shas["ck_2"]
    assert submodule_mirror(s, lock.aiter.submodules[0].url) is None


def test_base_image_kept_as_given_when_no_registry_answers(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, buf = make_log()
    lock = pin_unresolved(s, log, base_image="base:1")
    assert lock.base_image.digest == "" and lock.base_image.pinned == "base:1"
    assert "kept as given" in buf.getvalue()
    # an earlier digest for the same reference is kept when the registry is down
    prev = lock.model_copy(update={"base_image": lock.base_image.model_copy(update={"digest": DIGEST})})
    log2, buf2 = make_log()
    again = pin_unresolved(s, log2, base_image="base:1", previous=prev)
    assert again.base_image.digest == DIGEST
    assert "existing lock" in buf2.getvalue()


def test_patches_kept_only_when_both_shas_are_unchanged(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    kw = dict(model="M", base_image="b@" + DIGEST, log=log)
    first = pin(s, atom_ref="main", aiter_ref="main", **kw).lock  # type: ignore[arg-type]
    patched = first.with_patches((PatchPin(name="0001-x.patch", sha256="a" * 64, status="applied"),))
    same = pin(s, atom_ref="main", aiter_ref="main", previous=patched, **kw).lock  # type: ignore[arg-type]
    assert same == patched
    moved = pin(s, atom_ref="main", aiter_ref="v0.1", previous=patched, **kw).lock  # type: ignore[arg-type]
    assert moved.patches == ()


def test_full_sha_on_no_fetched_branch_is_fetched_by_sha(tmp_path: Path, ups: Upstreams) -> None:
    # like a GitHub pull-request commit: reachable upstream only from refs/pull/*
    ups.atom.git("checkout", "-q", "-b", "pr")
    pr = ups.atom.commit({"pr.py": "1\n"}, "PR work")
    ups.atom.git("update-ref", "refs/pull/1/head", pr)
    ups.atom.git("checkout", "-q", "main")
    ups.atom.delete_branch("pr")
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    lock = pin(s, model="M", atom_ref=pr, aiter_ref="main", base_image="b@" + DIGEST, log=log).lock
    assert lock.atom.sha == pr and lock.atom.subject == "PR work"
    # a short SHA of such a commit is not guessed
    with pytest.raises(SourceError, match="looks like a commit SHA"):
        pin(s, model="M", atom_ref=ups.aiter.head()[:10], aiter_ref="main", base_image="b", log=log)


def test_offline_pin_reads_urls_from_existing_mirrors_only(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.file_url, ups.aiter.file_url)  # URLs, not paths
    log, _ = make_log()
    kw = dict(model="M", base_image="b@" + DIGEST, log=log)
    first = pin(s, atom_ref="main", aiter_ref="main", **kw).lock  # type: ignore[arg-type]
    ups.atom.commit({"later": "1"}, "not fetched")
    offline = pin(s, atom_ref="main", aiter_ref="main", offline=True, **kw).lock  # type: ignore[arg-type]
    assert offline == first
    fresh = make_settings(tmp_path / "other", ups.atom.file_url, ups.aiter.file_url)
    with pytest.raises(SourceError, match="no mirror"):
        pin(fresh, atom_ref="main", aiter_ref="main", offline=True, **kw)  # type: ignore[arg-type]
    as_config = make_settings(tmp_path, ups.atom.file_url, ups.aiter.file_url, offline=True)
    assert pin(as_config, atom_ref="main", aiter_ref="main", **kw).lock == first  # type: ignore[arg-type]


def test_offline_pin_mirrors_local_paths_and_asks_no_registry(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url, offline=True)  # local paths: no network
    log, buf = make_log()
    asked: list[str] = []
    lock = pin(
        s,
        model="M",
        atom_ref="main",
        aiter_ref="main",
        base_image="rocm/pytorch:1",
        log=log,
        digest_resolver=lambda ref: asked.append(ref) or DIGEST,
    ).lock
    assert lock.atom.sha == ups.shas["atom_2"] and asked == []  # mirrored from the path; no registry
    assert lock.base_image.digest == "" and "--base-image rocm/pytorch:1@sha256:DIGEST" in buf.getvalue()


def test_mirrors_for_lock_reads_locked_commits_without_network(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    lock = pin(s, model="M", atom_ref="main", aiter_ref="main", base_image="b@" + DIGEST, log=log).lock
    for p in (ups.atom.path, ups.aiter.path):
        p.rename(p.with_name(p.name + "-gone"))
    atom, aiter = mirrors_for_lock(s, lock)
    assert atom.read_blob(lock.atom.sha, "atom/models/minimax_m3.py") is not None
    assert b"kv_cache_v" in (aiter.read_blob(lock.aiter.sha, "aiter/ops/fused_qknorm_idxrqknorm.py") or b"")
    bogus = lock.model_copy(
        update={
            "sources": lock.sources.model_copy(
                update={"atom": lock.atom.model_copy(update={"sha": "1" * 40})}
            )
        }
    )
    with pytest.raises(SourceError, match="not in the mirror"):
        mirrors_for_lock(s, bogus)


def test_choose_aiter_hook_pins_the_chosen_commit(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    seen: list[str] = []

    def choose(atom_repo: GitRepo, atom: CommitInfo, aiter_repo: GitRepo, head: CommitInfo) -> CommitInfo:
        seen.append(head.sha)
        return aiter_repo.commit_info(ups.shas["aiter_old"])

    res = pin(
        s,
        model="M",
        atom_ref="main",
        aiter_ref="main",
        base_image="b@" + DIGEST,
        log=log,
        choose_aiter=choose,
    )
    assert seen == [ups.shas["aiter_split"]]
    assert res.lock.aiter.sha == ups.shas["aiter_old"] and res.lock.aiter.ref == "auto:main"
    assert res.lock.aiter.submodules[0].sha == ups.shas["ck_1"]  # submodules follow the chosen commit
    assert res.aiter_requested.sha == ups.shas["aiter_split"]


def test_invalid_model_name(tmp_path: Path, ups: Upstreams) -> None:
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    for bad in ("../evil", "a b", "", "-x", "x/y"):
        with pytest.raises(UsageError, match="invalid model name"):
            pin(s, model=bad, atom_ref="main", aiter_ref="main", base_image="b", log=log)


# -- submodule URLs from upstream's .gitmodules (issue 26 §6) ------------------------------


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("{secret}", "a path on this host"),
        ("../../elsewhere/secret", "climbs out of"),  # aiter is upstream/aiter
        ("ext::sh -c touch% /tmp/pwned", "remote helper"),
        ("-uhelp", "command-line option"),
        ("ssh://-oProxyCommand=touch/x", "command-line option"),
    ],
)
def test_a_crafted_submodule_url_is_refused_at_pin(tmp_path: Path, url: str, problem: str) -> None:
    secret = tmp_path / "elsewhere" / "secret"  # a repository on this host, outside the upstreams
    secret.mkdir(parents=True)
    subprocess.run(["git", "init", "-q", str(secret)], check=True)
    ups = make_upstreams(tmp_path, submodule_url=url.format(secret=secret))
    s = make_settings(tmp_path, ups.atom.url, ups.aiter.url)
    log, _ = make_log()
    with pytest.raises(SourceError) as e:
        pin(
            s,
            model="M",
            atom_ref="main",
            aiter_ref="main",
            base_image="b",
            log=log,
            digest_resolver=no_registry,
        )
    assert problem in str(e.value) and "nothing was mirrored or pinned" in str(e.value)
    assert e.value.exit_code == 3
    mirrors = [p.name for p in s.mirrors_dir.iterdir() if not p.name.endswith(".lock")]
    assert sorted(m.rsplit("-", 1)[0].rsplit("upstream-", 1)[1] for m in mirrors) == ["ATOM", "aiter"], (
        mirrors
    )
    assert not (tmp_path / "locks").exists() or not any((tmp_path / "locks").iterdir())


def test_a_file_url_that_is_not_a_repository_is_a_source_error_not_unreachable(tmp_path: Path) -> None:
    from pipeline.sources import open_mirror

    s = make_settings(tmp_path, "file:///etc", "file:///etc")
    log, _ = make_log()
    with pytest.raises(SourceError) as e:
        open_mirror(s, "file:///etc", log=log, retries=0)
    assert e.value.exit_code == 3 and "cannot read the repository at file:///etc" in str(e.value)
    left = list(s.mirrors_dir.iterdir()) if s.mirrors_dir.exists() else []
    assert [p.name for p in left if not p.name.endswith(".lock")] == []
