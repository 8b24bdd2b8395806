"""A small OpenAI-compatible test server (stdlib only) standing in for ATOM's openai_server.

Modes (environment ``SMOKE_TEST_MODE``):
  healthy      loads for SMOKE_TEST_WARMUP_S seconds, then serves /health, /v1/models,
               /v1/chat/completions and /v1/completions (streaming too); answers arithmetic right
  crash        prints ATOM's warm-up traceback from the bug report and exits 1 after the warm-up
  never-ready  keeps "loading" forever: never listens
  wrong        serves, but every arithmetic answer is off by one (an accuracy regression)
  mixed        serves GSM8K-format answers right and wrong in a known proportion, by the first
               operand a of "What is a + b?": a % 4 == 0 wrong, == 1 right without the "#### N"
               line (only lm_eval's flexible-extract filter matches), else right (see
               tests/servers/gsm8k_local.py, which generates such documents)
  die-mid-gsm8k serves, but dies with a traceback on the SMOKE_TEST_DIE_AFTER-th (default 10)
               GSM8K question: lm_eval loses its server mid-run
  slow         serves, but slowly: 300 ms to the first token, 50 ms per token after it
  crash-mid-run serves chat, but the first /v1/completions request (the benchmark) kills it
               with a HIP out-of-memory traceback

Like ATOM, it only starts listening once warm-up is done. With SMOKE_TEST_ECHO_ENV=1 it
prints its environment at start-up (as some launchers do), secrets included, to prove the
pipeline redacts them from everything it writes.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

MODE = os.environ.get("SMOKE_TEST_MODE", "healthy")
WARMUP_S = float(os.environ.get("SMOKE_TEST_WARMUP_S", "1"))
FIRST_TOKEN_S = 0.3 if MODE == "slow" else 0.004
TOKEN_S = 0.05 if MODE == "slow" else 0.002

SEED_TRACEBACK = """\
Traceback (most recent call last):
  File "/app/ATOM/atom/model_engine/model_runner.py", line 1158, in warmup_model
    output = self.compiled_callable(*args, **kwargs)
             ^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^^
  File "/app/ATOM/atom/models/minimax_m3.py", line 418, in forward
    aiter.fused_qknorm_idxrqknorm(
RuntimeError: aiter::_fused_qknorm_idxrqknorm_hip() Expected a value of type 'Optional[Tensor]' \
for argument 'index_cache' but instead found type 'int'.
Cast error details: Unable to cast 0 to Tensor"""

MID_RUN_TRACEBACK = """\
Traceback (most recent call last):
  File "/app/ATOM/atom/model_engine/model_runner.py", line 1322, in forward
    logits = self.model(input_ids, positions)
torch.OutOfMemoryError: HIP out of memory. Tried to allocate 2.00 GiB. GPU 0 has 288.00 GiB"""

_ARITH = re.compile(r"What is (-?\d+) ([+\-*]) (-?\d+)\?")
DIE_AFTER = int(os.environ.get("SMOKE_TEST_DIE_AFTER", "10"))
_questions_seen = 0


def log(msg: str) -> None:
    sys.stderr.write(f"INFO {time.strftime('%H:%M:%S')} {msg}\n")
    sys.stderr.flush()


def answer_for(prompt: str) -> str:
    questions = _ARITH.findall(prompt)
    if questions:
        a, op, b = questions[-1]
        x, y = int(a), int(b)
        value = x + y if op == "+" else x - y if op == "-" else x * y
        if MODE == "wrong" or (MODE == "mixed" and x % 4 == 0):
            value += 1
        if MODE == "mixed" and x % 4 == 1:
            return f"{a} {op} {b} makes {value}."
        # GSM8K's answer format: lm_eval's strict-match filter reads the "#### N" line
        return f"{a} {op} {b} = {value}.\n#### {value}"
    if "capital of France" in prompt:
        return "Paris."
    return "Hello from the smoke-test server."


class Handler(BaseHTTPRequestHandler):
    server_version = "smoke-test-openai/1"
    model = "test-model"

    def log_message(self, format: str, *args: Any) -> None:
        log(f"{self.address_string()} {format % args}")

    def _json(self, status: int, data: Any) -> None:
        body = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path == "/health":
            self._json(200, {"status": "ok"})
        elif self.path == "/v1/models":
            self._json(200, {"object": "list", "data": [{"id": self.model, "object": "model"}]})
        else:
            self._json(404, {"error": f"no route {self.path}"})

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        try:
            req = json.loads(self.rfile.read(length) or b"{}")
        except ValueError:
            self._json(400, {"error": "body is not JSON"})
            return
        if self.path == "/v1/chat/completions":
            prompt = "\n".join(str(m.get("content", "")) for m in req.get("messages", []))
            last = str(req.get("messages", [{}])[-1].get("content", ""))
            if MODE == "die-mid-gsm8k" and last.startswith("Question:"):
                global _questions_seen
                _questions_seen += 1
                if _questions_seen >= DIE_AFTER:
                    sys.stderr.write(MID_RUN_TRACEBACK + "\n")
                    sys.stderr.flush()
                    os._exit(1)
            self._complete(req, answer_for(last if _ARITH.search(last) else prompt), chat=True)
        elif self.path == "/v1/completions":
            self._complete(req, answer_for(str(req.get("prompt", ""))), chat=False)
        else:
            self._json(404, {"error": f"no route {self.path}"})

    def _complete(self, req: dict[str, Any], text: str, *, chat: bool) -> None:
        if MODE == "crash-mid-run" and not chat:
            sys.stderr.write(MID_RUN_TRACEBACK + "\n")
            sys.stderr.flush()
            os._exit(1)
        max_tokens = int(req.get("max_tokens") or req.get("max_completion_tokens") or 64)
        words = text.split(" ")
        if req.get("ignore_eos"):
            words = (words * (max_tokens // max(len(words), 1) + 1))[:max_tokens]
        words = words[:max_tokens]
        # ATOM passes its scheduler's leave_reason through as finish_reason ("eos", "max_tokens")
        finish = "max_tokens" if req.get("ignore_eos") or len(text.split(" ")) > max_tokens else "eos"
        created = int(time.time())
        if not req.get("stream"):
            time.sleep(FIRST_TOKEN_S + TOKEN_S * max(len(words) - 1, 0))
            content = " ".join(words)
            usage = {"prompt_tokens": 8, "completion_tokens": len(words), "total_tokens": 8 + len(words)}
            if chat:
                choice = {
                    "index": 0,
                    "message": {"role": "assistant", "content": content},
                    "finish_reason": finish,
                }
                obj = "chat.completion"
            else:
                choice = {"index": 0, "text": content, "finish_reason": finish}
                obj = "text_completion"
            self._json(
                200,
                {
                    "id": "cmpl-smoke",
                    "object": obj,
                    "created": created,
                    "model": self.model,
                    "choices": [choice],
                    "usage": usage,
                },
            )
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.end_headers()
        time.sleep(FIRST_TOKEN_S)
        for i, word in enumerate(words):
            if i:
                time.sleep(TOKEN_S)
            piece = word if i == 0 else " " + word
            last = i == len(words) - 1
            if chat:
                choice: dict[str, Any] = {
                    "index": 0,
                    "delta": {"content": piece},
                    "finish_reason": finish if last else None,
                }
            else:
                choice = {"index": 0, "text": piece, "finish_reason": finish if last else None}
            chunk = {"id": "cmpl-smoke", "created": created, "model": self.model, "choices": [choice]}
            self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.flush()
        self.wfile.write(b"data: [DONE]\n\n")
        self.wfile.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--port", type=int, default=8000)
    args, _ = parser.parse_known_args()
    Handler.model = args.model
    log(f"smoke-test server mode={MODE} model={args.model} port={args.port}")
    if os.environ.get("SMOKE_TEST_ECHO_ENV") == "1":
        for key in sorted(os.environ):
            log(f"env {key}={os.environ[key]}")
    log("loading model weights ...")
    deadline = time.monotonic() + WARMUP_S
    while MODE == "never-ready" or time.monotonic() < deadline:
        time.sleep(min(0.5, max(deadline - time.monotonic(), 0.01)) if MODE != "never-ready" else 0.5)
    log("warming up the model ...")
    if MODE == "crash":
        log(f"crash at {time.time():.6f}")  # wall clock, read by bench/bench_smoke_crash.py
        sys.stderr.write(SEED_TRACEBACK + "\n")
        sys.stderr.flush()
        return 1
    server = ThreadingHTTPServer(("0.0.0.0", args.port), Handler)
    server.daemon_threads = True
    log(f"Starting server on 0.0.0.0:{args.port}...")
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
