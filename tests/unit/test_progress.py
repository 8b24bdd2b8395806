"""Live progress: plain lines off a terminal and on CI, a live display on a terminal."""

from __future__ import annotations

import io

import pytest

from pipeline.progress import Progress, is_live


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_off_a_terminal_say_what_is_counted_and_the_status() -> None:
    out = io.StringIO()
    progress = Progress.for_stream(out, {}, interval_s=0, redact=lambda s: s.replace("hf_secret", "***"))
    assert not progress.live
    with progress.task("server start", total=2700, unit="s") as t:
        t.update(120, status="INFO loading weights  shard 3/8 (token hf_secret)")
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  … server start: 120 s / 2700 s (4%)")
    assert lines[0].endswith("INFO loading weights shard 3/8 (token ***)")
    assert "(done)" in lines[-1]


def test_counted_tasks_show_a_rate_and_plain_lines_are_rate_limited() -> None:
    out = io.StringIO()
    progress = Progress(out, live=False, interval_s=3600)
    with progress.task("gsm8k", total=1319, unit="requests") as t:
        for _ in range(50):
            t.update(advance=1)
        t.started -= 10  # ten seconds in: a rate to show
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first update and the end, not 50 lines
    assert "50 requests / 1319 requests (4%)" in lines[-1] and "requests/s" in lines[-1]


@pytest.mark.parametrize(
    ("env", "live"),
    [({}, True), ({"CI": "true"}, False), ({"GITHUB_ACTIONS": "true"}, False), ({"TERM": "dumb"}, False)],
)
def test_live_only_on_a_terminal_outside_ci(env: dict[str, str], live: bool) -> None:
    assert is_live(Tty(), env) is live
    assert is_live(io.StringIO(), {}) is False


def test_the_live_display_runs_on_a_terminal_and_clears_itself() -> None:
    out = Tty()
    progress = Progress.for_stream(out, {})
    assert progress.live
    with progress.task("serving-benchmark[c16]", total=160, unit="requests") as t:
        t.update(40, status="POST /v1/completions")
    assert progress._rich is None  # stopped once its last task ended


def test_git_progress_lines_become_objects_of_a_total_with_gits_rate() -> None:
    from pipeline.log import Logger
    from pipeline.sources.mirrors import FetchProgress

    out = io.StringIO()
    log = Logger(stream=io.StringIO())
    shown = FetchProgress(
        log, "github.com/ROCm/aiter", after=0, progress=Progress(out, live=False, interval_s=0)
    )
    shown("remote: Enumerating objects: 5, done.")  # no count of a total: not a progress figure
    shown("Receiving objects:  45% (4500/10000), 12.34 MiB | 5.00 MiB/s")
    shown("Resolving deltas:  10% (30/300)")
    shown.close()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("  … fetch github.com/ROCm/aiter: 4500 objects / 10000 objects (45%)")
    assert lines[0].endswith("Receiving objects, 12.34 MiB, 5.00 MiB/s")
    assert "30 objects / 300 objects (10%)" in lines[1] and lines[1].endswith("Resolving deltas")
    assert "(done)" in lines[2] and len(lines) == 3


def test_a_quick_fetch_prints_no_progress() -> None:
    from pipeline.log import Logger
    from pipeline.sources.mirrors import FetchProgress

    out = io.StringIO()
    shown = FetchProgress(Logger(stream=io.StringIO()), "u", after=60, progress=Progress(out, live=False))
    shown("Receiving objects:  45% (4500/10000), 12.34 MiB | 5.00 MiB/s")
    shown.close()
    assert out.getvalue() == ""
