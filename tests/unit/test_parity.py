"""The parity report against upstream's atom_image, on fixture Dockerfiles in upstream's shape."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.errors import RenderError
from pipeline.image.parity import Deliberate, compare, load_deliberate, target_steps
from tests.fixtures.build_repos import UPSTREAM_DOCKERFILE

ROOT = Path(__file__).resolve().parents[2]
SHA = "ab9eb78105ac2e34153874bc0064b75c96c21b7a"

# The shape of upstream's docker/Dockerfile: an OOT target first, then base -> builders -> atom_image.
UPSTREAM = """\
ARG BASE_IMAGE="rocm/pytorch:latest"
FROM ${OOT_BASE_IMAGE} AS atom_oot
RUN echo "vLLM build that atom_image does not need"

FROM ${BASE_IMAGE} AS base
ARG GPU_ARCH
ENV GPU_ARCH_LIST=$GPU_ARCH
RUN pip install --upgrade pip && \\
    apt-get update && \\
    # a comment inside the step
    apt-get install -y git cmake

FROM base AS build_rccl
RUN echo Building RCCL && git clone rccl

FROM base AS build_aiter
RUN pip install --upgrade setuptools_scm
RUN git clone $AITER_REPO /app/aiter-test && pip install -r requirements.txt && python3 setup.py develop

FROM base AS atom_image
RUN pip install lm-eval[api]
COPY --from=build_rccl /app/rccl/build/release/*.deb /tmp/rccl/
COPY --from=build_aiter /app/aiter-test /app/aiter-test
RUN git clone $ATOM_REPO /app/ATOM && ATOM_MESH_BUILD=1 python -m pip install -e .
CMD ["/bin/bash"]
"""


def deliberate() -> list[Deliberate]:
    return load_deliberate(ROOT / "dockerfiles" / "parity.toml")


def test_target_steps_follow_from_and_copy_from() -> None:
    steps = target_steps(UPSTREAM)
    stages = [s.stage for s in steps]
    assert "atom_oot" not in stages  # another target, not needed by atom_image
    assert stages[0] == "base" and "build_rccl" in stages and "build_aiter" in stages
    apt = next(s for s in steps if "apt-get install" in s.text)
    assert "comment" not in apt.text and "apt-get update && apt-get install -y git cmake" in apt.text
    assert [s.kind for s in steps if s.stage == "atom_image"] == ["RUN", "COPY", "COPY", "RUN"]


def test_every_step_covered_by_the_reviewed_list() -> None:
    report = compare(UPSTREAM, deliberate(), atom_commit=SHA)
    assert report.uncovered == []
    assert "upstream gained" not in report.summary
    assert report.summary.startswith("parity with upstream atom_image at ATOM ab9eb78105: 9 steps")
    md = report.markdown
    assert "| build_aiter | `RUN pip install --upgrade setuptools_scm` | same:" in md
    assert "lm-eval[api] at the version in pipeline/toolpins.py" in md
    assert "omitted" in md and "base image's RCCL" in md


def test_a_new_upstream_step_is_reported_plainly() -> None:
    lmcache = "RUN git clone https://github.com/LMCache/LMCache.git /opt/LMCache"
    grown = UPSTREAM.replace('CMD ["/bin/bash"]', f'{lmcache}\nCMD ["/bin/bash"]')
    report = compare(grown, deliberate(), atom_commit=SHA)
    assert report.uncovered == [f"[atom_image] {lmcache}"]
    assert report.summary.endswith("upstream gained 1 step(s) we do not cover")
    assert "## Upstream gained a step we do not cover" in report.markdown
    assert f"| atom_image | `{lmcache}` | **not covered** |" in report.markdown


def test_stale_entries_and_missing_dockerfile() -> None:
    extra = [*deliberate(), Deliberate("atom_image", "no-such-step", "omitted", "", "gone upstream")]
    assert [d.match for d in compare(UPSTREAM, extra, atom_commit=SHA).stale][-1] == "no-such-step"
    none = compare(None, deliberate(), atom_commit=SHA)
    assert none.rows == [] and "has no docker/Dockerfile" in none.summary
    other = compare("FROM x AS something_else\nRUN true\n", deliberate(), atom_commit=SHA)
    assert "has no target atom_image" in other.summary


def test_fixture_upstream_of_the_build_repos_is_covered() -> None:
    report = compare(UPSTREAM_DOCKERFILE, deliberate(), atom_commit=SHA)
    assert report.rows and report.uncovered == []


def test_malformed_list_is_a_render_error(tmp_path: Path) -> None:
    bad = tmp_path / "parity.toml"
    bad.write_text('[[step]]\nstage = "base"\nmatch = "x"\nstatus = "maybe"\nreason = "?"\n')
    with pytest.raises(RenderError, match="status 'maybe'"):
        load_deliberate(bad)
    bad.write_text('[[step]]\nstage = "base"\nmatch = "("\nstatus = "same"\nreason = "?"\n')
    with pytest.raises(RenderError, match="malformed"):
        load_deliberate(bad)
    with pytest.raises(RenderError, match="does not exist"):
        load_deliberate(tmp_path / "nope.toml")
