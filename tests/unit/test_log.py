import io
from pathlib import Path

import pytest

from pipeline.errors import BuildError
from pipeline.log import Logger


def test_stage_marks_and_file_log(tmp_path: Path) -> None:
    out = io.StringIO()
    log = Logger(stream=out)
    log.attach(tmp_path)
    with log.stage("pin") as rec:
        rec.figure = "atom ab9eb781"
        log.detail("hidden at -v0")
    with pytest.raises(BuildError), log.stage("build"):
        raise BuildError("step 3 failed")
    log.close()
    text = out.getvalue()
    assert "✓ pin" in text and "atom ab9eb781" in text and "✕ build" in text
    assert "hidden at -v0" not in text
    full = (tmp_path / "pipeline.log").read_text()
    assert "hidden at -v0" in full and "step 3 failed" in full
    assert [r.status for r in log.stages] == ["ok", "failed"]


def test_github_actions_groups_annotations_summary(tmp_path: Path) -> None:
    out = io.StringIO()
    summary = tmp_path / "summary.md"
    log = Logger.from_env({"GITHUB_ACTIONS": "true", "GITHUB_STEP_SUMMARY": str(summary)}, stream=out)
    with log.stage("check"):
        log.error("broken call", file="atom/models/minimax_m3.py", line=418)
    log.publish_summary("MiniMax-M3-MXFP4")
    text = out.getvalue()
    assert "::group::check" in text and "::endgroup::" in text
    assert "::error file=atom/models/minimax_m3.py,line=418::broken call" in text
    assert "| check | ok |" in summary.read_text()


def test_secrets_are_masked_everywhere(tmp_path: Path) -> None:
    out = io.StringIO()
    log = Logger(stream=out, verbosity=2)
    log.attach(tmp_path)
    log.mask("hf_supersecrettoken")
    log.info("token is hf_supersecrettoken")
    log.debug("again hf_supersecrettoken")
    log.close()
    assert "hf_supersecrettoken" not in out.getvalue()
    assert "hf_supersecrettoken" not in (tmp_path / "pipeline.log").read_text()
    assert "***" in out.getvalue()
