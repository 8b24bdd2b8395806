import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.smoke.failfast import LogWatcher, TracebackDetector, exception_line, last_exception_in

SEED_LINE = (
    "RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip() Expected a value of type 'Optional[Tensor]' "
    "for argument 'index_cache' but instead found type 'int'."
)
SEED_LOG = f"""\
INFO 15:36:01 loading weights
INFO 15:36:40 warming up
Traceback (most recent call last):
  File "/app/ATOM/atom/model_engine/model_runner.py", line 1158, in warmup_model
    output = self.compiled_callable(*args, **kwargs)
  File "/app/ATOM/atom/models/minimax_m3.py", line 418, in forward
    aiter.fused_qknorm_idxrqknorm(
{SEED_LINE}
Cast error details: Unable to cast 0 to Tensor
"""


def test_seed_traceback_gives_the_exception_line_verbatim() -> None:
    det = TracebackDetector()
    fatal = [f for f in (det.feed(line) for line in SEED_LOG.splitlines()) if f]
    assert fatal == [SEED_LINE]
    assert det.traceback[0] == "Traceback (most recent call last):" and det.traceback[-1] == SEED_LINE


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        ("[rank0]: RuntimeError: boom", "RuntimeError: boom"),
        (
            "(EngineCore pid=12) torch.OutOfMemoryError: HIP out of memory.",
            "torch.OutOfMemoryError: HIP out of memory.",
        ),
        ("KeyboardInterrupt", "KeyboardInterrupt"),
        ("AssertionError", "AssertionError"),
        ("ValueError:", "ValueError:"),
        ("    raise RuntimeError('x')", None),
        ('  File "x.py", line 1, in <module>', None),
        ("INFO RuntimeError: mentioned in passing", None),
        ("Cast error details: Unable to cast 0 to Tensor", None),
    ],
)
def test_exception_line(line: str, expect: str | None) -> None:
    assert exception_line(line) == expect


def test_exception_lines_without_a_traceback_are_not_fatal() -> None:
    det = TracebackDetector()
    assert det.feed("ValueError: printed by a warning handler") is None
    assert det.fatal is None


def test_prefixed_multiprocess_traceback() -> None:
    log = (
        "[rank1]: Traceback (most recent call last):\n"
        '[rank1]:   File "m.py", line 3\n'
        "[rank1]: RuntimeError: x\n"
    )
    assert last_exception_in(log) == "RuntimeError: x"


def test_chained_traceback_stops_at_the_first_and_remembers_the_last() -> None:
    log = (
        "Traceback (most recent call last):\n  File \"a\"\nKeyError: 'k'\n\n"
        "During handling of the above exception, another exception occurred:\n\n"
        'Traceback (most recent call last):\n  File "b"\nRuntimeError: wrapped\n'
    )
    det = TracebackDetector()
    for line in log.splitlines():
        det.feed(line)
    assert det.fatal == "KeyError: 'k'" and det.last_exception == "RuntimeError: wrapped"


def test_log_watcher_streams_redacted_and_flags_the_crash(tmp_path: Path) -> None:
    secret = "hf_topsecret_123"

    def stream() -> Iterator[str]:
        yield f"env HF_TOKEN={secret}\nloading"  # chunks do not end at line ends
        yield " weights\n"
        time.sleep(0.05)
        yield SEED_LOG

    w = LogWatcher(stream, tmp_path / "server.log", redact=lambda s: s.replace(secret, "***")).start()
    assert w.changed.wait(5)
    w.join(5)
    assert w.fatal == SEED_LINE and w.fatal_at is not None and w.ended
    text = (tmp_path / "server.log").read_text()
    assert secret not in text and "env HF_TOKEN=***" in text and "loading weights\n" in text
    assert "Cast error details" in w.tail_text()


def test_log_watcher_reports_a_stream_error(tmp_path: Path) -> None:
    def stream() -> Iterator[str]:
        yield "partial line without newline"
        raise ConnectionError("engine went away")

    w = LogWatcher(stream, tmp_path / "s.log", redact=lambda s: s).start()
    w.join(5)
    assert w.ended and w.error == "ConnectionError: engine went away" and w.fatal is None
    assert (tmp_path / "s.log").read_text() == "partial line without newline\n"


@pytest.mark.parametrize(
    ("line", "expect"),
    [
        (
            "torch._dynamo.exc.Unsupported: call_function in skip_files",
            "torch._dynamo.exc.Unsupported: call_function in skip_files",
        ),
        (
            "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
            "torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised:",
        ),
        ("StopIteration", "StopIteration"),
        ("INFO:     Started server process [1]", None),
        ("WARNING: something", None),
    ],
)
def test_dynamo_and_other_exception_names(line: str, expect: str | None) -> None:
    assert exception_line(line) == expect


def test_interleaved_log_lines_do_not_end_a_traceback() -> None:
    log = (
        "Traceback (most recent call last):\n"
        "INFO:     Started server process [1]\n"
        '  File "a"\n'
        "RuntimeError: real\n"
    )
    assert last_exception_in(log) == "RuntimeError: real"


def test_ignored_exceptions_are_not_fatal() -> None:
    det = TracebackDetector(ignore=(re.compile(r"^ImportError: .*flash_attn"),))
    for line in ("Traceback (most recent call last):", "ImportError: no module flash_attn", "ready"):
        assert det.feed(line) is None
    assert det.fatal is None
    for line in ("Traceback (most recent call last):", "RuntimeError: boom"):
        det.feed(line)
    assert det.fatal == "RuntimeError: boom"
