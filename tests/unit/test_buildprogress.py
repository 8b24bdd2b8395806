"""The image build as progress: the current step against the last build's time for it."""

from __future__ import annotations

import io
import json
from pathlib import Path

from pipeline.image.buildprogress import BuildProgress, timings_path
from pipeline.log import Logger
from pipeline.progress import Progress

AITER = "[aiter 3/3] RUN python3 build_aiter.py"
BUILDKIT = [
    "#1 [internal] load build definition from Dockerfile",
    "#1 DONE 0.0s",
    "#5 [aiter 1/3] FROM docker.io/library/base@sha256:abc",
    "#5 DONE 0.1s",
    "#6 [aiter 2/3] COPY aiter /src/aiter",
    "#6 DONE 0.4s",
    "#7 [aiter 3/3] RUN --mount=type=cache,target=/root/.cache/pip python3 build_aiter.py",
    "#7 0.513 compiling kernels",
    "#7 DONE 1312.5s",
    "#8 [final 2/2] COPY atom /app/ATOM",
    "#8 CACHED",
]


def feed(path: Path, lines: list[str], *, ok: bool = True) -> list[str]:
    out = io.StringIO()
    shown = BuildProgress(
        Logger(stream=io.StringIO()), path, progress=Progress(out, live=False, interval_s=0)
    )
    for line in lines:
        shown(line)
    shown.close(succeeded=ok)
    return out.getvalue().splitlines()


def test_buildkit_steps_are_timed_and_the_next_build_is_measured_against_them(tmp_path: Path) -> None:
    path = timings_path(tmp_path, "MiniMax-M3-MXFP4")
    first = feed(path, BUILDKIT)
    assert any(AITER in ln and "(new step)" in ln for ln in first)  # nothing to compare with yet
    steps = json.loads(path.read_text())["steps"]
    assert steps[AITER] == 1312.5 and steps["[aiter 2/3] COPY aiter /src/aiter"] == 0.4
    assert steps["[final 2/2] COPY atom /app/ATOM"] == 0.0  # cached, never timed

    second = feed(path, [*BUILDKIT[:8], "#7 CACHED", *BUILDKIT[9:]])
    running = next(ln for ln in second if AITER in ln)
    assert "0 s (last build 1312 s)" in running
    assert "/ 4 steps" in running  # the last build's step count is the total
    assert json.loads(path.read_text())["steps"][AITER] == 1312.5  # a cache hit keeps the real time
    assert second[-1].startswith("  … build: 4 steps / 4 steps (100%)") and "(done)" in second[-1]


def test_a_failed_build_leaves_the_last_times_alone(tmp_path: Path) -> None:
    path = timings_path(tmp_path, "m")
    feed(path, BUILDKIT)
    feed(path, [*BUILDKIT[:6], "#7 [aiter 3/3] RUN python3 build_aiter.py", "#7 DONE 3.0s"], ok=False)
    assert json.loads(path.read_text())["steps"][AITER] == 1312.5


def test_classic_builder_steps_count_of_n_by_the_wall_clock(tmp_path: Path) -> None:
    lines = feed(
        timings_path(tmp_path, "m"),
        ["Step 1/3 : FROM base", " ---> 1234", "Step 2/3 : COPY a /a", "Step 3/3 : RUN make"],
    )
    assert lines[0].startswith("  … build: 0 steps / 3 steps (0%)") and "Step 1/3 : FROM base" in lines[0]
    steps = json.loads(timings_path(tmp_path, "m").read_text())["steps"]
    assert set(steps) == {"Step 1/3 : FROM base", "Step 2/3 : COPY a /a", "Step 3/3 : RUN make"}


def test_on_github_actions_a_terminal_still_gets_plain_lines_inside_the_stage_group(tmp_path: Path) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = Tty()
    log = Logger(stream=out, github=True)
    env = {"CI": "true", "GITHUB_ACTIONS": "true"}
    with log.stage("build"):
        shown = BuildProgress(log, timings_path(tmp_path, "m"), progress=Progress.for_stream(out, env))
        for line in BUILDKIT:
            shown(line)
        shown.close(succeeded=True)
    text = out.getvalue()
    assert "\x1b[" not in text  # no escape codes in a CI log
    lines = text.splitlines()
    assert lines[0] == "::group::build" and lines[-2] == "::endgroup::"
    assert lines[1].startswith("  … build: ") and "[aiter 1/3] FROM" in lines[1]  # the first step at once
    assert "(done)" in lines[-3] and len(lines) == 5  # and the end: one line per 30 s at most
