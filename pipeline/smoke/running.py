"""The host side of the running GSM8K score (see `pipeline.smoke.gsm8k_watch`, the in-container proxy).

`watch_config` decides from the recipe's lm_eval command whether the proxy can sit between
lm_eval and the server (its ``base_url`` must name the server's port, so the runner can point it
at the proxy instead) and what it must load: the gate's task, ``--include_path``,
``think_end_token``. `RunningScore` reads the proxy's JSON lines as they stream in and says
where the score stands, for the progress line and for the verdict.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from pipeline.smoke.gsm8k_watch import STOP_PATH

__all__ = ["STOP_PATH", "RunningScore", "watch_config", "watch_source"]

_BASE_URL = re.compile(r"(?:^|,)base_url=https?://(?:127\.0\.0\.1|localhost):\$\{port\}(?:/|,|$)")


def watch_source() -> str:
    return resources.files("pipeline.smoke").joinpath("gsm8k_watch.py").read_text(encoding="utf-8")


def _option(argv: Sequence[str], name: str) -> str | None:
    for i, a in enumerate(argv):
        if a == name and i + 1 < len(argv):
            return argv[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


def watch_config(command: Sequence[str], *, task: str, port: int) -> dict[str, Any] | None:
    """What the proxy needs, or None when the command's base_url does not go through `${port}`."""
    model_args = _option(command, "--model_args") or ""
    if not _BASE_URL.search(model_args):
        return None
    think = next(
        (kv.split("=", 1)[1] for kv in model_args.split(",") if kv.startswith("think_end_token=")), None
    )
    return {
        "upstream": f"http://127.0.0.1:{port}",
        "task": task,
        "include_path": _option(command, "--include_path"),
        "think_end_token": think,
    }


@dataclass
class RunningScore:
    """The proxy's state as last reported; fed from the exec's output thread, read by the runner."""

    metric: str  # the gate's metric, e.g. "exact_match,flexible-extract"
    port: int | None = None
    docs: int | None = None
    scored: int = 0
    unmatched: int = 0
    correct: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # why there is no running score
    stopped: bool = False
    _buffer: str = ""

    def feed(self, text: str) -> None:
        self._buffer += text
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            if line.startswith('{"event"'):
                try:
                    self._event(json.loads(line))
                except (ValueError, TypeError, AttributeError):
                    continue

    def _event(self, data: dict[str, Any]) -> None:
        event = data.get("event")
        if event == "listening":
            self.port = int(data["port"])
        elif event == "scorer":
            self.docs = data.get("docs")
            self.error = data.get("error") or self.error
        elif event in ("score", "stopped"):
            self.scored = int(data.get("scored", 0))
            self.unmatched = int(data.get("unmatched", 0))
            self.correct = {str(k): float(v) for k, v in (data.get("correct") or {}).items()}
            self.stopped = self.stopped or event == "stopped"

    def value(self, metric: str | None = None) -> float | None:
        key = metric or self.metric
        if not self.scored or key not in self.correct:
            return None
        return self.correct[key] / self.scored

    def status(self) -> str:
        """`flexible-extract 0.750 · strict-match 0.500 (40 scored)` for the progress line."""
        if self.error:
            return f"running score unavailable: {self.error}"
        if not self.scored:
            return "running score: loading lm_eval's task" if self.docs is None else ""
        keys = [self.metric, *sorted(k for k in self.correct if k != self.metric)]
        parts = [
            f"{k.split(',', 1)[-1]} {self.correct[k] / self.scored:.3f}" for k in keys if k in self.correct
        ]
        unmatched = f", {self.unmatched} unmatched" if self.unmatched else ""
        return " · ".join(parts) + f" ({self.scored} scored{unmatched})"

    def figures(self) -> dict[str, Any]:
        return {
            "running_value": None if self.value() is None else round(self.value() or 0.0, 4),
            "running_scored": self.scored,
            "running_unmatched": self.unmatched,
            "running_correct": dict(self.correct),  # per metric and filter, of running_scored
            **({"running_error": self.error} if self.error else {}),
        }
