"""A running GSM8K score while lm_eval runs: a recording proxy *inside* the server container.

lm_eval scores only when every document is answered, hours into a full run. To show a running
figure the smoke stage runs this file (``python3 -c <this file> CONFIG_JSON`` via ``docker exec``)
next to lm_eval and points lm_eval's ``base_url`` at it. It forwards every request to the model
server unchanged and, for each answered completion, scores it exactly as lm_eval will: with
lm_eval's own task object (the task named by ``--tasks``, ``--include_path`` honoured), so the
same documents, the same answer parsing (`parse_generations`' post-processing), the same filter
ensembles (``strict-match``, ``flexible-extract``) and the same ``process_results`` metric.
Each completion is matched to its document by the prompt's last user turn (or the completion
prompt's tail), which is the document's ``doc_to_text``.

The forwarding part is standard library only and starts at once; lm_eval is imported in a
background thread (its task index takes seconds). If that fails, the proxy still forwards and
says why the running score is unavailable. It prints one JSON line per event on stdout:

    {"event": "listening", "port": P}
    {"event": "scorer", "docs": N}  |  {"event": "scorer", "error": "..."}
    {"event": "score", "scored": k, "unmatched": u, "correct": {"exact_match,strict-match": c, ...}}
    {"event": "stopped", ...the last score...}

``POST /__atom-smoke/stop`` ends it: queued completions are scored first (waiting for the task
to load, at most ``stop_wait_s``, 60 s by default), then the last score is printed.
"""

from __future__ import annotations

import http.client
import json
import queue
import sys
import threading
import time
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

STOP_PATH = "/__atom-smoke/stop"
SCORED_PATHS = ("/v1/chat/completions", "/v1/completions")
HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "te", "trailer", "upgrade", "proxy-connection"}

_print_lock = threading.Lock()


def emit(event: str, **fields: Any) -> None:
    with _print_lock:
        sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
        sys.stdout.flush()


def prompt_tail(request: dict[str, Any]) -> str:
    """What lm_eval put last in the request: the document's own text."""
    messages = request.get("messages")
    if isinstance(messages, list) and messages:
        last = messages[-1]
        content = last.get("content") if isinstance(last, dict) else None
        if isinstance(content, list):  # content parts
            content = "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
        return str(content or "")
    prompt = request.get("prompt")
    if isinstance(prompt, list):
        prompt = prompt[-1] if prompt else ""
    return str(prompt or "")


class Scorer:
    """lm_eval's task, its documents by prompt text, and the running sums."""

    def __init__(self, config: dict[str, Any]) -> None:
        self.config = config
        self.ready = threading.Event()
        self.error: str | None = None
        self.pending: queue.Queue[tuple[dict[str, Any], dict[str, Any]] | None] = queue.Queue()
        self.idle = threading.Condition()
        self.busy = 0
        self.by_text: dict[str, list[int]] = {}
        self.results: dict[int, dict[str, float]] = {}  # doc index -> {metric key: value}
        self.unmatched = 0

    # -- loading (background) -------------------------------------------------------------

    def load(self) -> None:
        try:
            from lm_eval.tasks import TaskManager

            manager = TaskManager(include_path=self.config.get("include_path") or None)
            name = self.config["task"]
            if hasattr(manager, "load"):  # lm_eval >= 0.4.10, what its evaluator calls
                task = manager.load([name])["tasks"].get(name)
            else:
                from lm_eval.tasks import get_task_dict

                task = get_task_dict([name], manager).get(name)
            if task is None:
                raise LookupError(f"lm_eval has no single task {name!r} (a group?)")
            self.task = task
            self.docs = list(task.eval_docs)
            for i, doc in enumerate(self.docs):
                self.by_text.setdefault(str(task.doc_to_text(doc)).strip(), []).append(i)
            self._parse = self._parser()
            emit("scorer", docs=len(self.docs))
        except BaseException as e:  # the proxy keeps forwarding; the runner shows why
            self.error = f"{type(e).__name__}: {e}"[:300]
            emit("scorer", error=self.error)
        finally:
            self.ready.set()

    def _parser(self) -> Any:
        """lm_eval's own reading of a response body into the text its filters get."""
        from lm_eval.models.api_models import LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER
        from lm_eval.models.utils import postprocess_generated_text

        think_end = self.config.get("think_end_token") or None

        def parse(path: str, body: dict[str, Any]) -> str:
            choice = body["choices"][0]
            if path == "/v1/chat/completions":
                content = choice["message"]["content"]
                if content is None:
                    return str(LMEVAL_MODEL_NONE_ANSWER_PLACEHOLDER)
                return str(postprocess_generated_text(content, stop=None, think_end_token=think_end))
            return str(choice["text"])

        return parse

    # -- scoring ----------------------------------------------------------------------------

    def doc_for(self, request: dict[str, Any]) -> int | None:
        tail = prompt_tail(request).strip()
        candidates = self.by_text.get(tail)
        if candidates is None:  # a completion prompt: the whole few-shot context, the document last
            candidates = next((ids for text, ids in self.by_text.items() if tail.endswith(text)), None)
        if not candidates:
            return None
        return next((i for i in candidates if i not in self.results), candidates[0])

    def score(self, path: str, request: dict[str, Any], body: dict[str, Any]) -> None:
        from lm_eval.api.instance import Instance

        i = self.doc_for(request)
        if i is None:
            self.unmatched += 1
            return
        doc = self.docs[i]
        text = self._parse(path, body)
        inst = Instance(request_type="generate_until", doc=doc, arguments=("", {}), idx=0)
        inst.resps = [text]
        got: dict[str, float] = {}
        for ensemble in self.task._filters:
            ensemble.apply([inst])
            for metric, value in self.task.process_results(doc, [inst.filtered_resps[ensemble.name]]).items():
                got[f"{metric},{ensemble.name}"] = float(value)
        self.results[i] = got

    def snapshot(self) -> dict[str, Any]:
        correct: dict[str, float] = {}
        for got in list(self.results.values()):
            for key, value in got.items():
                correct[key] = correct.get(key, 0.0) + value
        return {"scored": len(self.results), "unmatched": self.unmatched, "correct": correct}

    def work(self) -> None:
        self.ready.wait()
        while True:
            item = self.pending.get()
            if item is None:
                return
            if self.error is None:
                try:
                    path, request, body = item[0]["path"], item[0]["request"], item[1]
                    self.score(path, request, body)
                    emit("score", **self.snapshot())
                except Exception as e:  # one odd response must not stop the running score
                    self.unmatched += 1
                    emit("score", note=f"{type(e).__name__}: {e}"[:200], **self.snapshot())
            with self.idle:
                self.busy -= 1
                self.idle.notify_all()

    def submit(self, path: str, request: dict[str, Any], body: dict[str, Any]) -> None:
        with self.idle:
            self.busy += 1
        self.pending.put(({"path": path, "request": request}, body))

    def drain(self, wait_s: float) -> None:
        """Wait (at most `wait_s`) until every answer received is scored; none queued: no wait."""
        deadline = time.monotonic() + wait_s
        with self.idle:
            while self.busy and time.monotonic() < deadline:
                self.idle.wait(max(0.0, deadline - time.monotonic()))


def make_handler(upstream: urllib.parse.SplitResult, scorer: Scorer, stop: threading.Event) -> type:
    local = threading.local()

    def connection() -> http.client.HTTPConnection:
        conn = getattr(local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(
                upstream.hostname or "127.0.0.1", upstream.port or 80, timeout=7200
            )
            local.conn = conn
        return conn

    class Proxy(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as lm_eval's client expects

        def log_message(self, format: str, *args: Any) -> None:
            pass  # the server logs each request itself

        def _forward(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else b""
            if self.command == "POST" and self.path == STOP_PATH:
                self._reply(200, [("Content-Type", "application/json")], b"{}")
                stop.set()
                return
            headers = {k: v for k, v in self.headers.items() if k.lower() not in HOP_BY_HOP}
            for attempt in (1, 2):  # a pooled upstream connection the server closed: once more
                conn = connection()
                try:
                    conn.request(self.command, self.path, body=body or None, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                    break
                except (ConnectionError, http.client.HTTPException, OSError):
                    conn.close()
                    local.conn = None
                    if attempt == 2:
                        self._reply(502, [("Content-Type", "text/plain")], b"upstream server did not answer")
                        return
            out = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP | {"content-length"}]
            self._reply(resp.status, out, data)
            path = self.path.split("?", 1)[0]
            if self.command == "POST" and path in SCORED_PATHS and resp.status == 200:
                try:
                    request, answer = json.loads(body or b"{}"), json.loads(data)
                except ValueError:
                    return
                if isinstance(request, dict) and isinstance(answer, dict):
                    scorer.submit(path, request, answer)

        def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes) -> None:
            self.send_response(status)
            for k, v in headers:
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        do_GET = do_POST = do_PUT = do_DELETE = _forward

    return Proxy


def main(argv: list[str]) -> int:
    config = json.loads(argv[0])
    upstream = urllib.parse.urlsplit(config["upstream"])
    scorer = Scorer(config)
    stop = threading.Event()
    server = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(upstream, scorer, stop))
    server.daemon_threads = True
    threading.Thread(target=scorer.load, daemon=True).start()
    threading.Thread(target=scorer.work, daemon=True).start()
    threading.Thread(target=server.serve_forever, daemon=True).start()
    emit("listening", port=server.server_address[1])
    stop.wait()
    scorer.drain(float(config.get("stop_wait_s", 60)))
    emit("stopped", error=scorer.error, **scorer.snapshot())
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
