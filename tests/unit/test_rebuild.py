"""`pipeline rebuild`'s reporting: obsolete patches, exit code, the CI summary."""

from pipeline.errors import ExitCode
from pipeline.rebuild import ModelOutcome, overall_exit, summary_markdown


def test_exit_code_is_the_worst_but_no_gpus_only_when_nothing_else_failed() -> None:
    ok = ModelOutcome("A", "released", 0)
    no_gpu = ModelOutcome("B", "stopped", int(ExitCode.NO_HARDWARE))
    broken = ModelOutcome("C", "failed", int(ExitCode.INCOMPATIBLE))
    assert overall_exit([ok]) == 0
    assert overall_exit([ok, no_gpu]) == ExitCode.NO_HARDWARE
    assert overall_exit([ok, no_gpu, broken]) == ExitCode.INCOMPATIBLE


def test_summary_table_names_each_model_and_its_first_note_line() -> None:
    md = summary_markdown(
        [
            ModelOutcome("MiniMax-M3-MXFP4", "unchanged", 0, atom="a" * 40, aiter="b" * 40, tag="r:t"),
            ModelOutcome("MiniMax-M3-MXFP8", "failed", 4, notes=["ATOM x calls aiter y wrongly\ndetails"]),
        ]
    )
    assert "| MiniMax-M3-MXFP4 | ⏸ unchanged (exit 0) | aaaaaaaaa | bbbbbbbbbb | r:t |" in md
    assert "❌ failed (exit 4)" in md and "ATOM x calls aiter y wrongly" in md and "details" not in md
