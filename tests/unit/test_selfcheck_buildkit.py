"""The self-check's rules (pure) and the BuildKit front end's progress reading, without an engine."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import pytest

from pipeline.image.build import stage_cached
from pipeline.image.selfcheck import judge
from pipeline.oci.buildkit import _error, _Progress, mirror_context
from pipeline.oci.engine import BuiltImage

EXPECTED: dict[str, Any] = {
    "aiter_dir": "/app/aiter-test",
    "atom_dir": "/app/ATOM",
    "aiter_version": "0.1.16+86.g08f04b889a",
    "atom_version": "0.1.5+12.gab9eb78105.p1234abcd",
    "patched_files": {"atom/models/minimax_m3.py": "a" * 64},
    "tools": ["lm_eval"],
    "modules": ["atom.benchmarks.benchmark_serving"],
    "lm_eval_version": "0.4.13",
}
GOOD: dict[str, Any] = {
    "aiter_origin": "/app/aiter-test/aiter/__init__.py",
    "atom_origin": "/app/ATOM/atom/__init__.py",
    "dists": {
        "amd-aiter": [{"version": "0.1.16+86.g08f04b889a", "where": "/opt/venv/lib/site-packages"}],
        "atom": [{"version": "0.1.5+12.gab9eb78105.p1234abcd", "where": "/opt/venv"}],
        "lm-eval": [{"version": "0.4.13", "where": "/opt/venv"}],
    },
    "aiter_copies": ["/app/aiter-test/aiter/__init__.py"],
    "patched_files": {"atom/models/minimax_m3.py": "a" * 64},
    "tools": {"lm_eval": "/opt/venv/bin/lm_eval"},
    "modules": {"atom.benchmarks.benchmark_serving": "/app/ATOM/atom/benchmarks/benchmark_serving.py"},
    "pip_check": {"code": 0, "output": "No broken requirements found."},
}


def test_the_checked_image_passes() -> None:
    assert judge(EXPECTED, GOOD) == []


def _broken(**change: Any) -> dict[str, Any]:
    facts = copy.deepcopy(GOOD)
    facts.update(change)
    return facts


@pytest.mark.parametrize(
    ("facts", "needle"),
    [
        (_broken(aiter_origin="/usr/lib/python3/site-packages/aiter/__init__.py"), "`aiter` resolves to"),
        (_broken(atom_origin=None), "`atom` resolves to None"),
        (
            _broken(
                dists={
                    **GOOD["dists"],
                    "amd-aiter": [*GOOD["dists"]["amd-aiter"], {"version": "0.1.5", "where": "/usr"}],
                }
            ),
            "2 aiter distributions are installed",
        ),
        (
            _broken(aiter_copies=[*GOOD["aiter_copies"], "/usr/local/lib/dist-packages/aiter/__init__.py"]),
            "another aiter package is importable",
        ),
        (_broken(patched_files={"atom/models/minimax_m3.py": "b" * 64}), "patched file /app/ATOM/atom/"),
        (_broken(patched_files={}), "none (missing)"),
        (_broken(tools={"lm_eval": None}), "tool `lm_eval` is not in the image"),
        (_broken(modules={"atom.benchmarks.benchmark_serving": None}), "module `atom.benchmarks.bench"),
        (_broken(dists={**GOOD["dists"], "lm-eval": [{"version": "0.4.9", "where": "x"}]}), "lm-eval 0.4.13"),
        (_broken(pip_check={"code": 1, "output": "datasets 5.2.0 has requirement pandas<3"}), "pandas<3"),
        (
            _broken(dists={**GOOD["dists"], "amd-aiter": [{"version": "0.1.17", "where": "x"}]}),
            "amd-aiter is version 0.1.17",
        ),
    ],
)
def test_each_rule_fails_with_its_evidence(facts: dict[str, Any], needle: str) -> None:
    failures = judge(EXPECTED, facts)
    assert len(failures) == 1 and needle in failures[0], failures


PLAIN = """\
#1 [internal] load build definition from Dockerfile
#1 sha256:0d1
#1 transferring dockerfile: 5.93kB done
#1 DONE 0.0s
#5 [internal] load build context
#5 transferring context: 1.20MB 0.3s
#5 transferring context: 2.51MB 0.5s done
#5 DONE 0.6s
#6 [aiter 2/5] RUN --mount=type=cache,target=/root/.cache/pip,id=pip python3 -m pip install -r /tmp/r.txt
#6 CACHED
#7 [aiter 5/5] RUN --mount=type=secret,id=TOKEN,required=true python3 build_aiter.py
#7 CACHED
#8 [atom 3/4] RUN python3 install_atom.py
#8 sha256:77e
#8 0.512 atom installed from /app/ATOM
#8 0.601 Traceback: boom
#8 ERROR: executor failed running [/bin/sh -c python3 install_atom.py]: exit code: 1
"""


def test_progress_reads_steps_cache_hits_context_and_the_failing_step() -> None:
    seen: list[str] = []
    p = _Progress(seen.append)
    for line in PLAIN.splitlines():
        p.feed(line)
    assert seen == PLAIN.splitlines()
    assert p.steps == [
        "[aiter 2/5] RUN python3 -m pip install -r /tmp/r.txt",
        "[aiter 5/5] RUN python3 build_aiter.py",
        "[atom 3/4] RUN python3 install_atom.py",
    ]
    assert p.cached == p.steps[:2]
    assert sum(p.transfer.values()) == 2_510_000  # the context, not the Dockerfile
    err = _error(p, "x:1", 1)
    assert "failed at [atom 3/4] RUN python3 install_atom.py: executor failed" in err.message
    assert err.evidence is not None
    assert err.evidence.endswith("atom installed from /app/ATOM\nTraceback: boom")
    built = BuiltImage(id="sha256:1", log=p.text, steps=p.steps, cached=p.cached)
    assert stage_cached(built, "aiter") is True and stage_cached(built, "atom") is False
    assert stage_cached(built, "base") is None


def test_mirror_context_links_changes_and_drops_what_is_gone(tmp_path: Path) -> None:
    src, dest = tmp_path / "ctx", tmp_path / "build"
    (src / "atom").mkdir(parents=True)
    (src / "atom" / "a.py").write_text("a")
    (src / "atom" / "b.py").write_text("b")
    os.symlink("a.py", src / "atom" / "link.py")
    mirror_context(src, dest)
    assert os.path.samefile(src / "atom" / "a.py", dest / "atom" / "a.py")
    assert os.readlink(dest / "atom" / "link.py") == "a.py"
    mtime = (dest / "atom" / "a.py").stat().st_mtime_ns
    (src / "atom" / "b.py").unlink()
    (src / "atom" / "c.py").write_text("c")
    mirror_context(src, dest)
    assert sorted(p.name for p in (dest / "atom").iterdir()) == ["a.py", "c.py", "link.py"]
    assert (dest / "atom" / "a.py").stat().st_mtime_ns == mtime  # unchanged files keep their metadata


# What BuildKit (20.10 CLI, plain progress) printed here when the base image's registry was not reachable.
UNREACHABLE_BASE = """\
#3 [internal] load metadata for docker.io/rocm/pytorch:rocm7.2.4
#3 sha256:cc40addf84c888ee9e312bbaec132db8bc974547d9fb3e6d7f1e0d88f6abcf0d
#3 ERROR: failed to do request: Head "https://registry-1.docker.io/v2/rocm/pytorch/manifests/rocm7.2.4": \
dial tcp: lookup registry-1.docker.io on 10.255.255.53:53: no such host
------
 > [internal] load metadata for docker.io/rocm/pytorch:rocm7.2.4:
------
failed to solve with frontend dockerfile.v0: failed to create LLB definition: failed to do request"""


def test_a_base_image_whose_registry_cannot_be_reached_is_infra_not_a_build_failure() -> None:
    p = _Progress(lambda _line: None)
    for line in UNREACHABLE_BASE.splitlines():
        p.feed(line)
    err = _error(p, "atom:candidate-1", 1)
    assert err.exit_code == 11
    assert "could not pull its base image: docker.io/rocm/pytorch:rocm7.2.4" in err.message
    assert err.hint is not None and "[image] base_image" in err.hint
    # a step that fails for its own reasons stays a build error
    p = _Progress(lambda _line: None)
    for line in (
        UNREACHABLE_BASE.replace("no such host", "manifest unknown").replace("dial tcp: ", "").splitlines()
    ):
        p.feed(line)
    assert _error(p, "atom:candidate-1", 1).exit_code == 7
