"""The runner's control flow against a fake engine (no docker in the unit tier).

The fake container replays a server log and answers the in-container probes the way the
real server and tools would; the docker tier runs the same paths for real.
"""

from __future__ import annotations

import io
import json
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from pipeline import labels
from pipeline.cli import main
from pipeline.config import load_settings
from pipeline.errors import ConfigError, ExitCode, InfraError, LockInconsistent
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.oci.engine import ContainerInfo
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke import SmokeOptions, Verdict, load_verdict, run_smoke
from tests.fixtures.sysfs import make_sysfs, nodes_dir
from tests.fixtures.tag_world import make_lock
from tests.unit.test_smoke_checks import bench_result, chat_body, lm_eval_results

REPO = Path(__file__).resolve().parents[2]
RECIPE_PATH = REPO / "tests" / "servers" / "recipe-test.yaml"
LOCK = make_lock()  # the lock the fake image was built from (its pair label)
SEED = "RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip() Expected a value of type 'Optional[Tensor]'"


@dataclass
class FakeContainer:
    log: list[str]
    exit_code_after_log: int | None = None  # exits once the log is replayed
    ready_after: float = 0.0
    accuracy: float = 1.0
    crash_in: str = ""  # tool argv[0] during which the server crashes
    interrupt_in: str = ""
    engine_dies_in: str = ""
    name: str = "atom-smoke-fake"
    removed: bool = False
    execs: list[list[str]] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    _exited: int | None = None
    _extra: list[str] = field(default_factory=list)
    _more: threading.Event = field(default_factory=threading.Event)
    proxy_correct: float | None = None  # the GSM8K proxy's running correct count; None: it fails
    _proxy_stop: threading.Event = field(default_factory=threading.Event)

    def logs(self, *, stream: bool = False, follow: bool = False) -> Iterator[str]:
        for line in self.log:
            yield line + "\n"
        if self.exit_code_after_log is not None:
            self._exited = self.exit_code_after_log
            return
        while not self.removed:
            if self._more.wait(0.02):
                self._more.clear()
                while self._extra:
                    yield self._extra.pop(0) + "\n"

    def exit_code(self) -> int | None:
        return self._exited

    def info(self) -> ContainerInfo:
        return ContainerInfo(
            id="c" * 64,
            name=self.name,
            image_id=FakeImage().id,
            status="running",
            labels={},
            network_mode="bridge",
            pid=1,
        )

    def remove(self) -> None:
        self.removed = True

    def exec(self, argv: Sequence[str], *, on_output: Callable[[str], None] | None = None) -> tuple[int, str]:
        argv = list(argv)
        self.execs.append(argv)
        if on_output is not None:  # the GSM8K recording proxy, watched live
            if self.proxy_correct is None:
                return 1, "ModuleNotFoundError: No module named 'lm_eval'"
            on_output('{"event": "listening", "port": 39999}\n{"event": "scorer", "docs": 1319}\n')
            self._proxy_stop.wait(10)
            lm = next(a for a in reversed(self.execs) if a[0] == "lm_eval")
            n = int(lm[lm.index("--limit") + 1])
            correct = {"exact_match,flexible-extract": self.proxy_correct, "exact_match,strict-match": 0}
            on_output(
                json.dumps({"event": "stopped", "scored": n, "unmatched": 0, "correct": correct}) + "\n"
            )
            return 0, ""
        if len(argv) > 5 and argv[3] == "http" and argv[5].endswith("/__atom-smoke/stop"):
            self._proxy_stop.set()
            return 0, json.dumps({"status": 200, "body": "{}"})
        if argv[0] == self.interrupt_in:
            raise KeyboardInterrupt
        if argv[0] == self.engine_dies_in:
            raise InfraError("The Docker engine did not answer while trying to run a command: gone")
        if argv[0] == self.crash_in:
            self._extra += ["Traceback (most recent call last):", '  File "x.py", line 1', SEED]
            self._more.set()
            time.sleep(5)  # the tool hangs on the dead server; the runner must not wait for it
            return 1, "connection refused"
        if len(argv) > 3 and argv[1] == "-c":  # the probe
            cmd = argv[3]
            if cmd == "listeners":  # the server's own listening socket
                return 0, json.dumps(
                    {
                        "port": int(argv[4]),
                        "listeners": [{"inode": "4242", "address": f"0.0.0.0:{argv[4]}"}],
                        "holders": [{"pid": 7, "inode": "4242", "cmdline": "python3 server", "cgroup": ""}],
                        "unreadable": 0,
                    }
                )
            if cmd == "http" and argv[4] == "GET":
                ok = time.monotonic() - self.started >= self.ready_after
                return 0, json.dumps(
                    {"status": 200 if ok else 0, "body": "", "error": None if ok else "refused"}
                )
            if cmd == "http":
                return 0, json.dumps({"status": 200, "body": chat_body("Paris."), "seconds": 0.1})
            if cmd == "newest":  # the file lm_eval wrote, with the --limit it was given
                ran = next(a for a in reversed(self.execs) if a[0] == "lm_eval")
                n = int(ran[ran.index("--limit") + 1]) if "--limit" in ran else 1319
                text = lm_eval_results(self.accuracy, n=n, limit=float(n) if "--limit" in ran else None)
                return 0, json.dumps({"path": argv[4] + "/m/results_x.json", "text": text})
            if cmd == "read":
                return 0, json.dumps(
                    {"path": argv[4], "text": bench_result(thr=500, ttft=20, tpot=5, completed=20)}
                )
        return 0, "tool output\n"


@dataclass
class FakeImage:
    id: str = "sha256:" + "1" * 64
    digests: list[str] = field(default_factory=lambda: ["reg/atom@sha256:" + "2" * 64])
    labels: dict[str, str] = field(default_factory=lambda: {labels.PAIR_DIGEST: LOCK.pair_digest()})


class FakeEngine:
    docker_host = None

    def __init__(self, container: FakeContainer) -> None:
        self.container = container
        self.run_kwargs: dict[str, Any] = {}

    def image(self, ref: str) -> FakeImage | None:
        return FakeImage() if ref in ("atom:test", FakeImage.id) else None

    def run(self, image: str, command: Sequence[str], **kwargs: Any) -> FakeContainer:
        self.run_kwargs = {"command": list(command), **kwargs}
        return self.container

    def containers(self, key: str, value: str | None = None) -> list[ContainerInfo]:
        return []  # no leftovers on this engine

    def close(self) -> None:
        pass


def smoke(
    tmp_path: Path,
    container: FakeContainer,
    *,
    out: io.StringIO | None = None,
    lock: Lock | None = None,
    **opts: Any,
) -> tuple[Verdict, FakeEngine]:
    engine = FakeEngine(container)
    log = Logger(stream=out or io.StringIO())
    verdict = run_smoke(
        engine,
        image="atom:test",
        recipe=load_recipe(RECIPE_PATH),
        recipe_path=RECIPE_PATH,
        settings=load_settings(env={}, cwd=tmp_path),
        env={"HF_TOKEN": "hf_unit_secret"},
        run_dir=tmp_path / "run",
        log=log,
        sysfs_root=make_sysfs(tmp_path / "sys"),
        options=SmokeOptions(**opts),
        lock=lock,
    )
    return verdict, engine


def test_healthy_run_binds_the_verdict_and_passes_options(tmp_path: Path) -> None:
    c = FakeContainer(["starting"])
    verdict, engine = smoke(tmp_path, c, quick=True, lock=LOCK)
    assert verdict.passed, verdict.reason
    assert verdict.image.digest == "sha256:" + "2" * 64
    # model -> lock -> image: the model's lock (its digest names the model) and the image's pair
    assert verdict.lock_sha256 == LOCK.digest() and verdict.pair_digest == LOCK.pair_digest()
    lm_eval = next(a for a in c.execs if a[0] == "lm_eval")
    assert lm_eval[-2:] == ["--limit", "40"]  # --quick: the recipe's quick_limit
    assert lm_eval[lm_eval.index("--output_path") + 1].startswith("/tmp/atom-smoke/")
    bench = next(a for a in c.execs if "standin_benchmark_serving.py" in " ".join(a))
    assert "--num-prompts=20" in bench and "--max-concurrency=4" in bench
    assert engine.run_kwargs["environment"]["HF_TOKEN"] == "hf_unit_secret"  # container env only
    assert c.removed
    cmd_file = (tmp_path / "run" / "server-command.txt").read_text()
    assert "--env HF_TOKEN " in cmd_file and "hf_unit_secret" not in cmd_file


def test_a_lock_of_another_pair_starts_nothing(tmp_path: Path) -> None:
    c = FakeContainer(["starting"])
    other = make_lock(patches=False)  # another series: another image
    with pytest.raises(LockInconsistent) as e:
        smoke(tmp_path, c, lock=other)
    assert "is not the lock the image" in str(e.value) and other.pair_digest()[:12] in str(e.value)
    assert e.value.exit_code == ExitCode.LOCK_INCONSISTENT and c.execs == []


def test_without_a_lock_the_verdict_binds_none_and_says_so(tmp_path: Path) -> None:
    out = io.StringIO()
    verdict, _ = smoke(tmp_path, FakeContainer(["starting"]), out=out, quick=True)
    assert verdict.passed and verdict.lock_sha256 == "" and verdict.pair_digest == LOCK.pair_digest()
    assert "the verdict binds no lock" in out.getvalue()


def test_exit_without_traceback_names_the_exit_code_and_last_line(tmp_path: Path) -> None:
    c = FakeContainer(["loading", "Killed"], exit_code_after_log=137, ready_after=999)
    verdict, _ = smoke(tmp_path, c)
    assert verdict.reason == "server container exited with code 137; last log line: Killed"
    assert verdict.checks[0].figures["detected_by"] == "exit 137" and c.removed


def test_exit_after_a_traceback_reports_the_last_exception_line(tmp_path: Path) -> None:
    log = ["Traceback (most recent call last):", '  File "w.py", line 2', SEED, "Cast error details: x"]
    c = FakeContainer(log, exit_code_after_log=1, ready_after=999)
    verdict, _ = smoke(tmp_path, c)
    assert verdict.reason == SEED


def test_crash_during_a_check_stops_at_once(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], crash_in="lm_eval")
    start = time.monotonic()
    verdict, _ = smoke(tmp_path, c, run_all=True)
    assert time.monotonic() - start < 4  # did not wait for the hung tool (it sleeps 5 s)
    by_name = {x.name: x for x in verdict.checks}
    assert by_name["gsm8k"].message == SEED and by_name["gsm8k"].figures["detected_by"] == "traceback"
    assert by_name["serving-benchmark[c4]"].status == "skipped"  # even with run_all: the server is gone
    assert "crashed" in by_name["serving-benchmark[c4]"].message
    assert verdict.reason == SEED and c.removed


def test_accuracy_failure_stops_unless_run_all(tmp_path: Path) -> None:
    verdict, _ = smoke(tmp_path / "a", FakeContainer(["ready"], accuracy=0.5))
    assert [x.status for x in verdict.checks] == ["passed", "passed", "failed", "skipped"]
    verdict, _ = smoke(tmp_path / "b", FakeContainer(["ready"], accuracy=0.5), run_all=True)
    assert [x.status for x in verdict.checks] == ["passed", "passed", "failed", "passed"]


def test_interrupt_removes_the_container_and_records_an_error(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], interrupt_in="lm_eval")
    with pytest.raises(KeyboardInterrupt):
        smoke(tmp_path, c)
    assert c.removed
    v = load_verdict(tmp_path / "run")
    assert v.status == "error" and not v.passed and "interrupted" in v.reason


def _cli_engine(monkeypatch: pytest.MonkeyPatch, container: Callable[[], FakeContainer]) -> None:
    """The CLI's engine: each Engine.connect gives a FakeEngine running a `container()`."""
    import pipeline.oci.engine

    monkeypatch.setattr(
        pipeline.oci.engine.Engine, "connect", classmethod(lambda cls, *a, **k: FakeEngine(container()))
    )


def _smoke_argv(run_dir: Path, *extra: str, image: str = "atom:test") -> list[str]:
    """`pipeline smoke` of `image` with the test recipe, its run in `run_dir`."""
    return ["smoke", "--image", image, "--recipe", str(RECIPE_PATH), "--run-dir", str(run_dir), *extra]


def test_cli_without_hardware_exits_9_and_says_what_is_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli_engine(monkeypatch, lambda: FakeContainer([]))
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    sysfs = make_sysfs(tmp_path / "sys", gpus=2)
    code = main(
        _smoke_argv(
            tmp_path / "r", "--kfd-topology", str(nodes_dir(sysfs)), "--hf-cache", str(tmp_path / "hf")
        )
    )
    err = capsys.readouterr().err
    assert code == ExitCode.NO_HARDWARE, err
    assert "4 gfx950" in err and "found 2" in err and "HF_TOKEN" in err and "--docker-host ssh://" in err
    assert load_verdict(tmp_path / "r").status == "no-hardware"


def test_cli_failed_gate_exits_8_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    log = ["Traceback (most recent call last):", SEED]
    _cli_engine(monkeypatch, lambda: FakeContainer(log, exit_code_after_log=1, ready_after=99))
    monkeypatch.setenv("HF_TOKEN", "hf_cli_secret")
    sysfs = make_sysfs(tmp_path / "sys")
    code = main(_smoke_argv(tmp_path / "r", "--kfd-topology", str(nodes_dir(sysfs)), "--json"))
    out, err = capsys.readouterr()
    assert code == ExitCode.SMOKE_FAILED
    assert SEED in err and json.loads(out)["reason"] == SEED
    assert "hf_cli_secret" not in out + err


def test_cli_unknown_image_and_usage_errors(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli_engine(monkeypatch, lambda: FakeContainer([]))
    assert main(_smoke_argv(tmp_path, image="nope:1")) == 2
    assert "The local Docker engine has no image 'nope:1'" in capsys.readouterr().err
    assert main(["smoke", "--image", "x"]) == ExitCode.USAGE
    assert "exactly one of --model NAME or --recipe FILE" in capsys.readouterr().err
    assert main(["smoke", "--image", "x", "--recipe", str(RECIPE_PATH), "--bench-concurrency", "a"]) == 2


def test_engine_failure_mid_run_is_an_error_verdict_not_a_gate(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], engine_dies_in="lm_eval")
    with pytest.raises(InfraError):
        smoke(tmp_path, c)
    assert c.removed
    v = load_verdict(tmp_path / "run")
    assert v.status == "error" and "InfraError: The Docker engine did not answer" in v.reason
    assert [x.name for x in v.checks] == ["server-ready", "chat"]  # what ran before, kept as evidence


def test_the_running_gsm8k_score_comes_from_the_proxy_lm_eval_talks_through(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], accuracy=0.95, proxy_correct=38)
    verdict, _ = smoke(tmp_path, c, quick=True)
    lm_eval = next(a for a in c.execs if a[0] == "lm_eval")
    assert "base_url=http://127.0.0.1:39999/v1/chat/completions" in lm_eval[lm_eval.index("--model_args") + 1]
    gsm = next(x for x in verdict.checks if x.name == "gsm8k")
    assert gsm.figures["running_value"] == 0.95 == gsm.figures["value"]  # 38 of 40
    assert gsm.figures["running_scored"] == 40 and verdict.passed


def test_a_running_score_that_disagrees_with_lm_eval_is_a_warning_not_the_verdict(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], accuracy=0.95, proxy_correct=20)
    out = io.StringIO()
    verdict, _ = smoke(tmp_path, c, out=out, quick=True)
    gsm = next(x for x in verdict.checks if x.name == "gsm8k")
    assert gsm.figures["running_value"] == 0.5 and gsm.figures["value"] == 0.95 and gsm.passed
    assert "running GSM8K score (flexible-extract 0.500" in out.getvalue()
    assert "disagrees with lm_eval's 0.95" in out.getvalue()


def test_without_the_proxy_lm_eval_talks_to_the_server_directly(tmp_path: Path) -> None:
    c = FakeContainer(["ready"], accuracy=0.95)  # the proxy cannot import lm_eval and exits
    verdict, _ = smoke(tmp_path, c, quick=True)
    lm_eval = next(a for a in c.execs if a[0] == "lm_eval")
    assert "base_url=http://127.0.0.1:8000/v1/chat/completions" in lm_eval[lm_eval.index("--model_args") + 1]
    gsm = next(x for x in verdict.checks if x.name == "gsm8k")
    assert "running_value" not in gsm.figures and gsm.passed and verdict.passed


def test_the_server_gets_no_secret_the_configuration_does_not_allow(tmp_path: Path) -> None:
    """The last gate before the container: a recipe read without the allow-list (a library caller)."""
    text = RECIPE_PATH.read_text().replace("secrets: [HF_TOKEN]", "secrets: [HF_TOKEN, OTHER_TOKEN]")
    assert "OTHER_TOKEN" in text
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    c = FakeContainer(["starting"])
    engine = FakeEngine(c)
    with pytest.raises(ConfigError, match="OTHER_TOKEN, which a recipe may not pass"):
        run_smoke(
            engine,
            image="atom:test",
            recipe=load_recipe(path),
            recipe_path=path,
            settings=load_settings(env={}, cwd=tmp_path),
            env={"HF_TOKEN": "hf_unit_secret", "OTHER_TOKEN": "other_secret"},
            run_dir=tmp_path / "run",
            log=Logger(stream=io.StringIO()),
            sysfs_root=make_sysfs(tmp_path / "sys"),
        )
    assert engine.run_kwargs == {}  # no container was started


def test_json_answers_on_stdout_when_smoke_stops_before_a_verdict(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _cli_engine(monkeypatch, lambda: FakeContainer([]))
    argv = _smoke_argv(tmp_path, "--json", image="nope:1")
    assert main(argv) == ExitCode.USAGE
    data = json.loads(capsys.readouterr().out)
    assert data["status"] == "error" and data["exit_code"] == 2 and "no image 'nope:1'" in data["error"]
    assert data["image"] == {"ref": "nope:1"} and data["run_dir"] == str(tmp_path)


def test_cli_binds_the_given_lock_and_refuses_one_of_another_pair(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    container = FakeContainer([])
    _cli_engine(monkeypatch, lambda: container)
    other = tmp_path / "other.toml"
    make_lock(patches=False).save(other)
    argv = _smoke_argv(tmp_path / "r")
    assert main([*argv, "--lock", str(other)]) == ExitCode.LOCK_INCONSISTENT
    err = capsys.readouterr().err
    assert "is not the lock the image" in err and "the lock of another pair" in err
    assert "nothing was started" in err and container.execs == []
    assert main([*argv, "--lock", str(tmp_path / "absent.toml")]) == ExitCode.USAGE
    assert "absent.toml does not exist" in capsys.readouterr().err
