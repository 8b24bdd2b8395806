"""The host side of the running GSM8K score: which commands can go through the proxy, its lines."""

from __future__ import annotations

import json

from pipeline.smoke.running import RunningScore, watch_config

CMD = [
    "lm_eval",
    "--model",
    "local-chat-completions",
    "--model_args",
    "model=${model},base_url=http://127.0.0.1:${port}/v1/chat/completions,think_end_token=</think>",
    "--tasks",
    "gsm8k",
    "--include_path=/opt/tasks",
]


def test_the_proxy_goes_where_base_url_names_the_servers_port() -> None:
    cfg = watch_config(CMD, task="gsm8k", port=8000)
    assert cfg == {
        "upstream": "http://127.0.0.1:8000",
        "task": "gsm8k",
        "include_path": "/opt/tasks",
        "think_end_token": "</think>",
    }
    fixed = [a.replace("${port}", "8000") for a in CMD]  # a hard-coded port: the proxy cannot sit there
    assert watch_config(fixed, task="gsm8k", port=8000) is None
    remote = [a.replace("127.0.0.1", "gpu-box") for a in CMD]
    assert watch_config(remote, task="gsm8k", port=8000) is None


def test_lines_split_across_chunks_are_read_once_whole() -> None:
    s = RunningScore("exact_match,flexible-extract")
    score = {"event": "score", "scored": 4, "unmatched": 1, "correct": {"exact_match,flexible-extract": 3}}
    text = '{"event": "listening", "port": 41234}\nlm_eval warning\n' + json.dumps(score) + "\n"
    for i in range(0, len(text), 7):
        s.feed(text[i : i + 7])
    assert s.port == 41234 and s.scored == 4 and s.value() == 0.75
    assert s.status() == "flexible-extract 0.750 (4 scored, 1 unmatched)"
    s.feed('{"event": "scorer", "error": "ModuleNotFoundError: lm_eval"}\n')
    assert s.status() == "running score unavailable: ModuleNotFoundError: lm_eval"


def test_nothing_scored_yet_is_no_figure() -> None:
    s = RunningScore("exact_match,flexible-extract")
    assert s.value() is None and s.status() == "running score: loading lm_eval's task"
    s.feed('{"event": "scorer", "docs": 1319}\n')
    assert s.status() == "" and s.figures()["running_value"] is None
