"""Run a recipe's smoke test against an image on a Docker engine.

    run directory ready -> leftovers swept -> preflight -> port free (host networking)
    -> start server container -> stream its log -> wait for /health -> prove the listener is
    ours -> chat -> gsm8k (lm_eval) -> serving benchmark -> prove it again -> verdict

The server container runs exactly the recipe's command, environment and
options. The checks run *inside* it (``docker exec``), as the recipe runs them,
and reach the server at 127.0.0.1, so a remote engine needs no open ports. The
runner stops at the first failing gate (unless `run_all`), fails fast on a
server crash with the exception line as the reason, and always removes the
container, also on Ctrl-C/SIGTERM (which the CLI turns into KeyboardInterrupt), before it
writes anything: a full disk cannot keep a server running. See `pipeline.smoke.identity` for
how a run knows that the server answering is the one it started.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import json
import re
import secrets as _secrets
import shlex
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline import __version__, labels
from pipeline.config import Settings
from pipeline.errors import (
    ConfigError,
    DiskError,
    InfraError,
    NoHardware,
    PipelineError,
    UsageError,
)
from pipeline.fsutil import atomic_write_text, sha256_file
from pipeline.lock import Lock
from pipeline.log import Logger
from pipeline.oci.engine import ContainerAPI, EngineAPI, ImageInfo
from pipeline.progress import Progress, Task
from pipeline.recipes.recipe import Recipe, expand
from pipeline.smoke import plot
from pipeline.smoke.checks import SmokeCheck, plan
from pipeline.smoke.failfast import LogWatcher, last_exception_in
from pipeline.smoke.identity import (
    HostProbe,
    Owner,
    check_port_free,
    name_foreign_holders,
    prove_identity,
    sweep_leftovers,
)
from pipeline.smoke.preflight import (
    Preflight,
    PreflightVia,
    engine_is_local,
    no_hardware_error,
    probe_source,
    run_preflight,
)
from pipeline.smoke.reports import write_reports
from pipeline.smoke.rundir import prepare_run_dir
from pipeline.smoke.running import STOP_PATH, RunningScore, watch_source
from pipeline.smoke.verdict import (
    READY_CHECK,
    CheckResult,
    RecipeRef,
    ServerEvidence,
    Status,
    TestedImage,
    Verdict,
)

SMOKE_LABEL = "org.atom-image-pipeline.smoke.run"
STREAM_END_GRACE_S = 5.0  # a stopped container's exit status shows well within this


@dataclass(frozen=True)
class SmokeOptions:
    """Per-run choices on top of the recipe (CLI flags)."""

    run_all: bool = False
    quick: bool = False
    gsm8k_limit: int | None = None  # overrides the recipe's limit / quick_limit
    bench_concurrencies: tuple[int, ...] | None = None
    bench_tolerance: float | None = None
    ready_timeout_s: float | None = None
    preflight_via: PreflightVia = "auto"
    labels: Mapping[str, str] = field(default_factory=dict)  # extra container labels (CI bookkeeping)


class _ServerGone(Exception):
    """The server crashed (fatal traceback or exit) while we were waiting on it."""

    def __init__(self, line: str, how: str) -> None:
        super().__init__(line)
        self.line = line
        self.how = how


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _digest(info: ImageInfo, image: str = "") -> str:
    """The digest the smoke test ran: the one `image` names (`REPO@sha256:…`), else the first."""
    named = image.split("@", 1)[1] if "@sha256:" in image else ""
    found = [str(d.split("@", 1)[1]) for d in info.digests or [] if "@" in d]
    if named:
        return named if named in found else ""
    return found[0] if found else ""


class _Run:
    def __init__(
        self,
        engine: EngineAPI,
        *,
        image: str,
        recipe: Recipe,
        settings: Settings,
        env: Mapping[str, str],
        run_dir: Path,
        log: Logger,
        opts: SmokeOptions,
    ) -> None:
        self.engine = engine
        self.image = image
        self.recipe = recipe
        self.settings = settings
        self.env = env
        self.run_dir = run_dir
        self.log = log
        self.opts = opts
        self.run_id = _secrets.token_hex(4)
        self.owner = Owner.current()
        # on every container this run starts: found again by a later run if we are killed
        self.labels = {
            SMOKE_LABEL: self.run_id,
            **self.owner.labels(self.run_id),
            labels.SERVER_PORT: str(recipe.server.port),
            **dict(opts.labels),
        }
        self.container: ContainerAPI | None = None
        self.image_id = ""
        self.server: ServerEvidence | None = None
        self.watcher: LogWatcher | None = None
        self.ready = False
        self.timings: dict[str, float] = {}
        self.port = recipe.server.port
        self.probe = probe_source()
        # live progress: the task on screen, the server's last log line, its requests by path
        self.progress = Progress.for_stream(log.stream, env, redact=log.redact)
        self.task: Task | None = None
        self.counting: tuple[str, int] | None = None  # (request path, count when the check began)
        self._stream_quiet_since: float | None = None
        self.last_line = ""
        self.last_line_at = 0.0
        self.requests: dict[str, int] = {}
        self.running: RunningScore | None = None  # the GSM8K score while lm_eval runs

    # -- container plumbing ------------------------------------------------------------

    def host_probe(self) -> HostProbe:
        """The listener probe on the engine's host, as this run's containers are labelled."""
        python = self.recipe.server.python
        return HostProbe(self.engine, self.image, python, self.probe, self.labels, self.owner)

    def _exec(self, argv: Sequence[str]) -> tuple[int, str]:
        assert self.container is not None
        code, out = self.container.exec(list(argv))
        return int(code), out

    def _probe(self, *args: str, supervised: float | None = None) -> dict[str, Any]:
        """Run the in-container probe; with `supervised` (a timeout), wake up at once on a crash."""
        argv = [self.recipe.server.python, "-c", self.probe, *args]
        if supervised is None:
            code, out = self._exec(argv)
        else:
            ran = self._supervised(argv, supervised, "probe")
            if isinstance(ran, str):
                return {"status": 0, "body": "", "error": ran}
            code, out = ran
        lines = out.strip().splitlines()
        try:
            data = json.loads(lines[-1]) if lines else None
        except ValueError:
            data = None
        if not isinstance(data, dict):
            raise InfraError(
                f"the in-container probe ({self.recipe.server.python}) exited {code} without a result",
                hint="The image needs a Python 3 interpreter at server.python.",
                evidence=self.log.redact(out[-3000:]),
            )
        return data

    def _server_gone(self) -> _ServerGone | None:
        """A crash the runner must act on now, or None."""
        w = self.watcher
        if w is None:
            return None
        if w.write_error is not None:
            raise w.write_error  # no evidence can be kept: stop now (the container is removed)
        if w.fatal and (not self.ready or self.recipe.server.fatal_traceback == "always"):
            return _ServerGone(w.fatal, "traceback")
        if w.ended:
            code = self._exit_code()
            if code is None and w.error is None:
                # The stream ends when the container stops; one that ended while the container
                # still runs for seconds after lost its connection (an ssh session dropped).
                if self._stream_quiet_since is None:
                    self._stream_quiet_since = time.monotonic()
                if time.monotonic() - self._stream_quiet_since < STREAM_END_GRACE_S:
                    return None
                raise InfraError(
                    "the log stream of the running server container ended: the connection to the "
                    "Docker engine dropped; the smoke test cannot watch the server any more.",
                    hint="Check the connection to the engine (ssh, network) and run the smoke test again.",
                )
            if code is None:  # the stream broke while the server still runs: not a crash of it
                raise InfraError(
                    f"lost the log stream of the running server container ({w.error}); "
                    "the smoke test cannot watch the server any more.",
                    hint="Check the Docker engine's health and run the smoke test again.",
                )
            full = self._server_log_text()
            line = last_exception_in(full, self.recipe.server.ignore_exceptions)
            if line is None:
                last = next((ln for ln in reversed(full.splitlines()) if ln.strip()), "")
                line = f"server container exited with code {code}" + (
                    f"; last log line: {last}" if last else ""
                )
            return _ServerGone(line, f"exit {code}")
        return None

    def _exit_code(self) -> int | None:
        try:
            return self.container.exit_code() if self.container is not None else None
        except PipelineError:
            return None

    def _server_log_text(self) -> str:
        try:
            return (self.run_dir / "server.log").read_text(encoding="utf-8")
        except OSError:
            return ""

    def _wait(self, seconds: float) -> None:
        assert self.watcher is not None
        # something changed: let the caller look; avoid a busy loop once the log ended
        if self.watcher.wait(seconds) and self.watcher.ended and self._exit_code() is None:
            time.sleep(min(seconds, 0.2))

    def _supervised(self, argv: Sequence[str], timeout: float, what: str) -> tuple[int, str] | str:
        """Run `argv` in the server container, watching the server; (code, output) or a timeout text.

        Raises _ServerGone as soon as the server crashes.
        """
        box: dict[str, Any] = {}

        def target() -> None:
            try:
                box["result"] = self._exec(argv)
            except BaseException as e:  # reported in the main thread
                box["error"] = e

        t = threading.Thread(target=target, name=f"smoke-exec-{what}", daemon=True)
        t.start()
        deadline = time.monotonic() + timeout
        while t.is_alive():
            gone = self._server_gone()
            if gone is not None:
                raise gone
            left = deadline - time.monotonic()
            if left <= 0:
                return f"{what} did not finish within {timeout:.0f} s"
            t.join(min(0.05, left))  # look at the server's state 20 times a second
            self._tick()
        if "error" in box:
            gone = self._server_gone()
            if gone is not None:
                raise gone
            raise box["error"]
        result: tuple[int, str] = box["result"]
        if result[0] != 0 and self.watcher is not None:
            # A tool that failed may have failed because the server just died (its container's
            # exit kills the exec'd process too): give the log a moment to say so.
            self.watcher.wait(2.0)
            gone = self._server_gone()
            if gone is None and self.watcher.ended:
                time.sleep(0.3)  # exit status not yet visible
                gone = self._server_gone()
            if gone is not None:
                raise gone
        return result

    def _save(self, name: str, text: str) -> Path:
        path = self.run_dir / name
        atomic_write_text(path, self.log.redact(text))
        return path

    # -- phases --------------------------------------------------------------------------

    def start_server(self, env: Mapping[str, str], volumes: Mapping[str, Mapping[str, str]]) -> None:
        r = self.recipe
        command = expand(r.server.command, {"model": r.model.id, "port": self.port})
        c = r.container
        run_labels = {labels.MODEL: r.name, labels.RECIPE: f"{r.name}.yaml", **self.labels}
        name = f"atom-smoke-{re.sub(r'[^a-z0-9.-]', '-', r.name.lower())}-{self.run_id}"
        # Echo the equivalent docker run line with variable *names* only.
        shown = ["docker", "run", "--name", name]
        for d in c.devices:
            shown += ["--device", d]
        for g in c.group_add:
            shown += ["--group-add", g]
        if c.ipc_mode:
            shown += ["--ipc", c.ipc_mode]
        for cap in c.cap_add:
            shown += ["--cap-add", cap]
        for so in c.security_opt:
            shown += ["--security-opt", so]
        if c.network_mode:
            shown += ["--network", c.network_mode]
        for src, spec in volumes.items():
            shown += ["-v", f"{src}:{spec['bind']}:{spec.get('mode', 'rw')}"]
        for key in env:
            shown += ["--env", key]  # values never shown
        self.log.detail("server: " + shlex.join([*shown, self.image, *command]))
        self._save("server-command.txt", shlex.join([*shown, self.image, *command]) + "\n")
        self.container = self.engine.run(
            self.image,
            command,
            name=name,
            environment=dict(env),
            devices=list(c.devices) or None,
            group_add=list(c.group_add) or None,
            ipc_mode=c.ipc_mode,
            cap_add=list(c.cap_add) or None,
            security_opt=list(c.security_opt) or None,
            network_mode=c.network_mode,
            volumes={k: dict(v) for k, v in volumes.items()} or None,
            shm_size=c.shm_size,
            labels=run_labels,
        )
        container = self.container
        self.watcher = LogWatcher(
            lambda: container.logs(stream=True, follow=True),
            self.run_dir / "server.log",
            redact=self.log.redact,
            on_line=self._on_server_line,
            ignore=self.recipe.server.ignore_exceptions,
        ).start()

    def wait_ready(self) -> CheckResult:
        r = self.recipe.server
        limit = self.opts.ready_timeout_s or r.ready_timeout_s
        url = f"http://127.0.0.1:{self.port}{r.health_path}"
        start = time.monotonic()
        limits = {"ready_timeout_s": limit, "health": r.health_path}
        last = ""
        while True:
            gone = self._server_gone()
            if gone is not None:
                return self._crash_result(READY_CHECK, gone, start, limits, phase="startup")
            try:
                res = self._probe("http", "GET", url, "5", supervised=30)
            except _ServerGone as crashed:
                return self._crash_result(READY_CHECK, crashed, start, limits, phase="startup")
            except InfraError:
                after = self._server_gone()
                if after is None:
                    time.sleep(0.2)  # the exec raced the exit: look again
                    after = self._server_gone()
                if after is not None:
                    return self._crash_result(READY_CHECK, after, start, limits, phase="startup")
                raise
            elapsed = time.monotonic() - start
            self._tick(elapsed)
            if res.get("status") == 200:
                self.ready = True
                self.timings["ready_s"] = round(elapsed, 3)
                return CheckResult.ok(
                    READY_CHECK,
                    f"{r.health_path} answered 200 after {elapsed:.1f} s",
                    figures={"ready_s": round(elapsed, 3)},
                    limits=limits,
                    seconds=elapsed,
                )
            last = f"HTTP {res['status']}" if res.get("status") else str(res.get("error") or "")
            if elapsed >= limit:
                assert self.watcher is not None
                return CheckResult.fail(
                    READY_CHECK,
                    f"server not ready within {limit:.0f} s ({r.health_path}: {last or 'no answer'})",
                    figures={"ready_s": None, "waited_s": round(elapsed, 3)},
                    limits=limits,
                    seconds=elapsed,
                    evidence=self.watcher.tail_text(),
                )
            self._wait(min(r.poll_interval_s, max(limit - elapsed, 0.05)))

    def prove(self, when: str) -> ServerEvidence:
        """The listener on the port is this container's (else NotOurServer, naming the holder)."""
        assert self.container is not None
        r = self.recipe
        try:
            self.server = prove_identity(
                self.container,
                port=self.port,
                python=r.server.python,
                probe=self.probe,
                image_id=self.image_id,
                network_mode=r.container.network_mode or "",
                when=when,
                earlier=self.server,
            )
        except InfraError as err:
            if r.container.network_mode == "host":
                named = name_foreign_holders(self.host_probe(), self.port)
                if named:
                    err.message += f" Holding port {self.port} on the engine's host: {named}."
            raise
        self.log.detail(
            f"the server answering on port {self.port} is container {self.server.container_name} "
            f"(pids {', '.join(map(str, self.server.pids))}), image {self.server.image_id[:19]} ({when})"
        )
        return self.server

    def _crash_result(
        self, name: str, gone: _ServerGone, start: float, limits: dict[str, Any], *, phase: str
    ) -> CheckResult:
        assert self.watcher is not None
        w = self.watcher
        seen_at = w.fatal_at if gone.how == "traceback" and w.fatal_at else (w.ended_at or time.monotonic())
        self.timings["crash_detected_s"] = round(seen_at - start, 3)
        self._crash_seen_at = seen_at
        evidence = "\n".join(w.detector.traceback) if w.detector.traceback else w.tail_text()
        return CheckResult.fail(
            name,
            gone.line,
            figures={
                "phase": phase,
                "detected_by": gone.how,
                "exit_code": self._exit_code(),
                "after_s": round(seen_at - start, 3),
            },
            limits=limits,
            seconds=time.monotonic() - start,
            evidence=evidence,
        )

    def _tool(self, name: str, argv: Sequence[str], timeout: float) -> tuple[int, str] | CheckResult:
        """Run a check's tool; its output is saved as `<name>.log`."""
        self.log.detail(f"{name}: {shlex.join(argv)}")
        start = time.monotonic()
        out = self._supervised(argv, timeout, name)
        if isinstance(out, str):
            return CheckResult.fail(
                name, out, seconds=time.monotonic() - start, limits={"timeout_s": timeout}
            )
        code, text = out
        self._save(f"{name}.log", f"$ {shlex.join(argv)}\n{text}")
        return code, text

    @contextlib.contextmanager
    def accuracy_proxy(self, config: Mapping[str, Any], metric: str) -> Iterator[RunningScore | None]:
        """The recording proxy (`pipeline.smoke.gsm8k_watch`) in the server container, for the block.

        Yields its state (its `port` is where lm_eval must send its requests), or None when it did
        not start: lm_eval then talks to the server directly and there is no running score.
        """
        assert self.container is not None
        container, score = self.container, RunningScore(metric)
        listening = threading.Event()
        argv = [self.recipe.server.python, "-c", watch_source(), json.dumps(dict(config))]

        def on_output(text: str) -> None:
            score.feed(text)
            if score.port is not None:
                listening.set()

        def target() -> None:
            try:
                code, out = container.exec(argv, on_output=on_output)
                if score.port is None:
                    score.error = f"the proxy exited {code}: {out.strip()[-200:]}"
            except BaseException as e:  # reported through `score.error`; the gate does not depend on it
                score.error = score.error or f"{type(e).__name__}: {e}"[:200]
            finally:
                listening.set()

        thread = threading.Thread(target=target, name="smoke-gsm8k-proxy", daemon=True)
        thread.start()
        listening.wait(30)
        if score.port is None:
            self.log.detail(f"no running GSM8K score: {score.error or 'the proxy did not start in 30 s'}")
            yield None
            return
        self.running = score
        finished = False
        try:
            yield score
            finished = True
        finally:
            if finished:  # let it score what is queued and report its last figure
                stop = f"http://127.0.0.1:{score.port}{STOP_PATH}"
                with contextlib.suppress(PipelineError):
                    self._probe("http", "POST", stop, "10", "{}")
                thread.join(75)  # the proxy waits at most 60 s for the task to load
            self.running = None
            self.log.detail(f"running GSM8K score at the end: {score.status() or 'nothing scored'}")

    # What the checks' plug-ins use (pipeline.smoke.checks.CheckContext).
    probe_json = _probe
    supervised = _supervised
    exec = _exec
    save = _save
    tool = _tool

    def _on_server_line(self, line: str) -> None:
        self.log.debug(f"server| {line}")
        if line.strip():
            self.last_line, self.last_line_at = line, time.monotonic()
        for path in ("/v1/chat/completions", "/v1/completions"):  # the access log counts requests
            if f"POST {path} " in line:
                self.requests[path] = self.requests.get(path, 0) + 1

    @contextlib.contextmanager
    def _progress_for(self, item: SmokeCheck) -> Iterator[None]:
        counts = item.counts
        total, unit = (counts[1], "requests") if counts else (None, "s")
        with self.progress.task(item.name, total=total, unit=unit) as task:
            self.task = task
            self.counting = (counts[0], self.requests.get(counts[0], 0)) if counts else None
            try:
                yield
            finally:
                self.task, self.counting = None, None

    def _tick(self, elapsed: float | None = None) -> None:
        """Show where the current task is: requests served, or seconds, and the server's last line."""
        t = self.task
        if t is None:
            return
        # the age of the server's last line tells a hung server (silent) from a slow one
        age = time.monotonic() - self.last_line_at
        status = f"server {age:.0f} s ago: {self.last_line}" if self.last_line else ""
        if self.running is not None and self.running.status():
            status = f"{self.running.status()} · {status}" if status else self.running.status()
        if self.counting is not None:
            path, base = self.counting
            t.update(self.requests.get(path, 0) - base, status=status)
        else:
            t.update(time.monotonic() - t.started if elapsed is None else elapsed, status=status)

    def planned(self) -> list[SmokeCheck]:
        return plan(self.recipe, self.opts)

    def run_checks(self, results: list[CheckResult]) -> None:
        """Run the planned checks, appending to `results` (kept as evidence if the engine fails)."""
        stop_reason = ""
        for item in self.planned():
            name = item.name
            if stop_reason:
                results.append(CheckResult.skipped(name, stop_reason))
                continue
            t0 = time.monotonic()
            with self.log.stage(name) as rec, self._progress_for(item):
                try:
                    res = item.run(self)
                except _ServerGone as gone:
                    res = self._crash_result(name, gone, t0, {}, phase=name)
                rec.figure = res.message[:120]
                if not res.passed:
                    rec.status = "failed"
            results.append(res)
            if not res.passed:  # the stage line shows 120 characters; the reason in full
                self.log.info(f"  ✕ {name}: {res.message}")
            crashed = res.figures.get("detected_by") is not None
            if not res.passed and (crashed or not self.opts.run_all):
                stop_reason = (
                    "not run: the server crashed"
                    if crashed
                    else f"not run: gate {name} failed (use --run-all to run every check)"
                )


@contextlib.contextmanager
def _interrupts_deferred() -> Iterator[None]:
    """Cleanup that a second Ctrl-C/SIGTERM must not cut short: such signals wait until it is done.

    A signal that arrived meanwhile is raised (as KeyboardInterrupt) when the block ends. Outside
    the main thread signal handlers cannot be changed, and the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    got: list[int] = []

    def remember(signum: int, frame: object) -> None:
        got.append(signum)

    old = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    for sig in old:
        signal.signal(sig, remember)
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
    if got:
        raise KeyboardInterrupt


def _remove(container: ContainerAPI) -> bool:
    """Remove the container; further Ctrl-C/SIGTERMs during removal do not leave it behind.

    Returns whether it is gone; an interrupt that arrived meanwhile is raised afterwards.
    """
    interrupted = False
    gone = False
    for _ in range(5):
        try:
            container.remove()
            gone = True
            break
        except KeyboardInterrupt:
            interrupted = True
        except PipelineError:
            if interrupted:
                continue
            raise
    if interrupted:
        raise KeyboardInterrupt
    return gone


def _container_env(
    recipe: Recipe, env: Mapping[str, str], log: Logger, allowed: frozenset[str]
) -> dict[str, str]:
    refused = sorted(set(recipe.secrets) - allowed)
    if refused:  # the server runs upstream code: it gets only the secrets configuration allows
        raise ConfigError(
            f"recipe {recipe.name} asks for secret(s) {', '.join(refused)}, which a recipe may not pass "
            f"to the model server (allowed: {', '.join(sorted(allowed))}); nothing was started.",
            hint="Remove them from the recipe's `secrets:`, or add them to [smoke] recipe_secrets.",
        )
    out = dict(recipe.environment)
    for key in recipe.secrets:
        value = env.get(key)
        if value:
            log.mask(value)
            out[key] = value
    return out


def bind_lock(lock: Lock | None, image_labels: Mapping[str, str], image: str, log: Logger) -> None:
    """The model's lock must pin the image's pair (its label), or nothing starts."""
    pair = image_labels.get(labels.PAIR_DIGEST, "")
    if lock is None:
        if pair:
            log.warn(
                f"no lock given for this smoke test of {image}: the verdict binds no lock, and "
                "`pipeline tag` refuses it (pass --lock, or keep locks/<model>.toml)"
            )
        return
    lock.require_pair(image_labels, image, name=f"the lock of {lock.model}", done="nothing was started")


def run_smoke(
    engine: EngineAPI,
    *,
    image: str,
    recipe: Recipe,
    recipe_path: Path,
    settings: Settings,
    env: Mapping[str, str],
    run_dir: Path,
    log: Logger,
    run_all: bool = False,
    sysfs_root: Path | None = None,
    options: SmokeOptions | None = None,
    lock: Lock | None = None,
) -> Verdict:
    """Smoke-test `image` with `recipe`; writes and returns the verdict.

    Gate failures are in the verdict (never raised). Raises `NoHardware` when the
    engine lacks the GPUs/devices/model (a verdict with status "no-hardware" is
    written first), `InfraError` when the engine fails or another server holds or
    answers on the port (verdict "error"), `DiskError` when the run directory has
    no room or is read-only, and lets KeyboardInterrupt through after removing the
    container (verdict "error").

    `lock`: the model's lock; the verdict binds it (its digest) to the image, whose pair label its
    pair digest must be (the image is model-free: one image serves every model of its pair).
    """
    opts = options or SmokeOptions()
    if run_all and not opts.run_all:
        opts = dataclasses.replace(opts, run_all=True)
    started = _now()
    moved_aside = prepare_run_dir(run_dir)
    if moved_aside is not None:
        log.warn(f"{run_dir} held an earlier smoke run; moved it aside to {moved_aside}")
    docker_host = engine.docker_host or settings.smoke.docker_host or None
    engine_desc = f"the Docker engine at {docker_host}" if docker_host else "the local Docker engine"

    info = engine.image(image)
    if info is None:
        raise UsageError(
            f"{engine_desc[0].upper()}{engine_desc[1:]} has no image {image!r}.",
            hint="Build it (`pipeline build`) or pull it on that engine first, or give it by digest "
            "(`--image REPO@sha256:…`, pulled when absent); a tag is never pulled.",
        )
    image_labels = dict(info.labels or {})
    bind_lock(lock, image_labels, image, log)
    container_env = _container_env(
        recipe, env, log, settings.recipe_secrets
    )  # masks secrets before anything is logged
    run = _Run(
        engine, image=image, recipe=recipe, settings=settings, env=env, run_dir=run_dir, log=log, opts=opts
    )
    run.image_id = str(info.id)
    leftovers = sweep_leftovers(engine, run.owner, log)  # before anything of ours runs
    base: dict[str, Any] = {
        "image": TestedImage(ref=image, id=str(info.id), digest=_digest(info, image)),
        "recipe": RecipeRef(name=recipe.name, path=str(recipe_path), sha256=sha256_file(recipe_path)),
        "lock_sha256": lock.digest() if lock is not None else "",
        "pair_digest": image_labels.get(labels.PAIR_DIGEST, ""),
        "inputs_digest": image_labels.get(labels.INPUTS_DIGEST, ""),
        "model": recipe.model.id,
        "tool_version": __version__,
        "engine": docker_host or "local",
        "started": started,
        "leftovers": [x.as_json() for x in leftovers],
    }
    options_rec = {
        "run_all": opts.run_all,
        "quick": opts.quick,
        "gsm8k_limit": opts.gsm8k_limit,
        "bench_concurrencies": list(opts.bench_concurrencies or ()),
        "bench_tolerance": opts.bench_tolerance,
        "ready_timeout_s": opts.ready_timeout_s or recipe.server.ready_timeout_s,
    }

    def verdict_of(status: Status, reason: str, checks: list[CheckResult], hw: dict[str, Any]) -> Verdict:
        return Verdict(
            status=status,
            passed=status == "passed",
            reason=log.redact(reason),
            checks=checks,
            finished=_now(),
            options=options_rec,
            timings=run.timings,
            hardware=hw,
            server=run.server,
            **base,
        )

    def finish(status: Status, reason: str, checks: list[CheckResult], hw: dict[str, Any]) -> Verdict:
        v = verdict_of(status, reason, checks, hw)
        plot.write_for(v, recipe, run_dir, log)  # benchmark.svg, before summary.md links it
        write_reports(v, run_dir, log.redact)
        return v

    nodes_dir = (
        str(sysfs_root / "class/kfd/kfd/topology/nodes")
        if sysfs_root is not None
        else settings.smoke.kfd_topology
    )
    pf: Preflight
    with log.stage("preflight", f"{recipe.hardware.gpus}x {recipe.hardware.gfx}, {recipe.model.id}") as rec:
        try:
            pf = run_preflight(
                engine,
                image=image,
                recipe=recipe,
                nodes_dir=nodes_dir,
                hf_cache_raw=settings.smoke.hf_cache,
                env=env,
                docker_host=docker_host,
                via=opts.preflight_via,
                labels=run.labels,
            )
        except NoHardware as e:
            finish("no-hardware", e.message, [], {"kfd_topology": nodes_dir})
            raise
        if pf.missing:
            err = no_hardware_error(pf, recipe, image=image, engine_desc=engine_desc)
            finish("no-hardware", err.message, [], pf.summary())
            rec.status = "failed"
            raise err
        how = "cached" if pf.model_cached else "via token"
        rec.figure = f"{len(pf.gpus)} {recipe.hardware.gfx} GPU(s), model {how}"

    if recipe.container.network_mode == "host":
        with log.stage("port", f"{run.port} on the engine's host") as rec:
            try:
                check_port_free(run.host_probe(), run.port)
            except PipelineError as e:
                rec.status = "failed"
                finish("error", f"{type(e).__name__}: {e.message}", [], pf.summary())
                raise
            rec.figure = "free"

    volumes: dict[str, dict[str, str]] = {}
    if pf.hf_cache and (pf.hf_cache_exists or not engine_is_local(docker_host)):
        volumes[pf.hf_cache] = {"bind": recipe.container.hf_cache_mount, "mode": "rw"}

    checks: list[CheckResult] = []
    removed = False
    try:
        try:
            with log.stage("server", " ".join(recipe.server.command[:3])) as rec:
                run.start_server(container_env, volumes)
                limit = opts.ready_timeout_s or recipe.server.ready_timeout_s
                with run.progress.task("server start", total=limit, unit="s") as run.task:
                    ready = run.wait_ready()
                run.task = None
                checks.append(ready)
                rec.figure = ready.message[:120]
                if not ready.passed:
                    rec.status = "failed"
                    log.info(f"  ✕ {READY_CHECK}: {ready.message}")
            if ready.passed:
                run.prove("after readiness, before any gate")
                run.run_checks(checks)
                if not any(c.figures.get("detected_by") for c in checks):
                    run.prove("after the last gate")
            else:
                never = "not run: the server never became ready"
                checks += [CheckResult.skipped(c.name, never) for c in run.planned()]
        finally:
            # 1. the container goes first: nothing below (a full disk, a second signal) may keep it
            with _interrupts_deferred():
                if run.container is not None:
                    log.detail(f"removing server container {run.container.name}")
                    removed = _remove(run.container)
                # also one an interrupt left half-started (created, never handed back to us)
                for c in engine.containers(SMOKE_LABEL, run.run_id):
                    engine.remove_container(c.id, name=c.name)
                if run.watcher is not None:
                    run.watcher.join(5)
        # 2. the verdict, then (in write_reports) the summaries made from it
        crash_seen = getattr(run, "_crash_seen_at", None)
        failed = next((c for c in checks if c.status in ("failed", "error")), None)
        if crash_seen is not None:
            run.timings["detect_to_verdict_s"] = round(time.monotonic() - crash_seen, 3)
        if len(checks) != 1 + len(run.planned()):  # pragma: no cover - every path above fills the checks
            raise InfraError("internal: the smoke run ended without a result for every check")
        if run.watcher is not None and run.watcher.write_error:
            raise run.watcher.write_error
        status: Status = "failed" if failed else "passed"
        reason = failed.message if failed else f"all {len(checks)} checks passed"
        return finish(status, reason, checks, pf.summary())
    except KeyboardInterrupt:
        gone = "the server container was removed" if removed else "no server container was left running"
        with _interrupts_deferred(), contextlib.suppress(PipelineError, OSError, KeyboardInterrupt):
            finish(
                "error",
                f"interrupted (Ctrl-C or SIGTERM) before the smoke test finished; {gone}",
                checks,
                pf.summary(),
            )
        raise
    except DiskError:
        raise  # nothing more can be written; earlier results were moved aside at the start
    except PipelineError as e:
        with contextlib.suppress(PipelineError, OSError):
            finish("error", f"{type(e).__name__}: {e.message}", checks, pf.summary())
        raise
