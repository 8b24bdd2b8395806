"""Stand-in for `lm_eval` (lm-evaluation-harness) in the docker-tier tests.

The real tool cannot run here (no network for its GSM8K dataset, no pip). This one
takes the same command line the recipe gives lm_eval (`--model local-chat-completions
--model_args model=...,base_url=...,num_concurrent=N --tasks gsm8k --num_fewshot 5
--output_path DIR [--limit N] ...`), asks the server arithmetic questions shaped like
GSM8K's 5-shot multi-turn chat prompts, scores them as gsm8k's two filters do
(strict-match "The answer is N" / flexible-extract: the last number), and writes the
results file where and how lm_eval does: `<output_path>/<model with / -> __>/
results_<ISO time with : -> ->.json`, with `results.gsm8k["exact_match,flexible-extract"]`,
`"exact_match_stderr,flexible-extract"`, `n-samples`, `config.limit`, ...
The pipeline code that reads it is the code that reads the real file on MI355.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime

GSM8K_TEST_DOCS = 1319


def docs() -> list[tuple[str, int]]:
    rng = random.Random(1319)
    out = []
    for _ in range(GSM8K_TEST_DOCS):
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        op = rng.choice("+-*")
        value = a + b if op == "+" else a - b if op == "-" else a * b
        out.append((f"What is {a} {op} {b}?", value))
    return out


def parse_model_args(raw: str) -> dict[str, str]:
    out = {}
    for part in raw.split(","):
        key, _, value = part.partition("=")
        out[key.strip()] = value.strip()
    return out


def ask(base_url: str, model: str, question: str, shots: list[tuple[str, int]], max_toks: int) -> str:
    messages = []
    for q, v in shots:  # --fewshot_as_multiturn: each shot is a user/assistant turn
        messages.append({"role": "user", "content": f"Question: {q}\nAnswer:"})
        messages.append({"role": "assistant", "content": f"The answer is {v}."})
    messages.append({"role": "user", "content": f"Question: {question}\nAnswer:"})
    body = json.dumps(
        {"model": model, "messages": messages, "max_tokens": max_toks, "temperature": 0}
    ).encode()
    req = urllib.request.Request(base_url, data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=60) as resp:
        data = json.loads(resp.read())
    return str(data["choices"][0]["message"]["content"] or "")


def flexible(text: str) -> str | None:
    nums = re.findall(r"(-?[$0-9.,]{2,})|(-?[0-9]+)", text)
    if not nums:
        return None
    a, b = nums[-1]
    return (a or b).strip(".$,").replace(",", "")


def strict(text: str) -> str | None:
    m = re.search(r"The answer is (\-?[0-9\.\,]+)\.", text)
    return m.group(1).replace(",", "").rstrip(".") if m else None


def stderr(xs: list[int]) -> float:
    n = len(xs)
    if n < 2:
        return float("nan")
    mean = sum(xs) / n
    return math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1) / n)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="lm_eval")
    p.add_argument("--model", required=True)
    p.add_argument("--model_args", required=True)
    p.add_argument("--tasks", required=True)
    p.add_argument("--num_fewshot", type=int, default=0)
    p.add_argument("--batch_size", default="1")
    p.add_argument("--apply_chat_template", action="store_true")
    p.add_argument("--fewshot_as_multiturn", action="store_true")
    p.add_argument("--output_path")
    p.add_argument("--limit", type=float)
    p.add_argument("--include_path")  # the real lm_eval's local tasks (ignored here)
    args = p.parse_args(argv)
    if args.tasks != "gsm8k" or args.model != "local-chat-completions":
        print(
            f"stand-in lm_eval only knows --model local-chat-completions --tasks gsm8k, got {args.model} "
            f"{args.tasks}",
            file=sys.stderr,
        )
        return 2
    margs = parse_model_args(args.model_args)
    all_docs = docs()
    limit = (
        None
        if args.limit is None
        else int(args.limit)
        if args.limit >= 1
        else int(args.limit * len(all_docs))
    )
    if limit is not None:
        print(
            "WARNING: --limit SHOULD ONLY BE USED FOR TESTING. "
            "REAL METRICS SHOULD NOT BE COMPUTED USING LIMIT."
        )
    subset = all_docs[:limit] if limit is not None else all_docs
    shots = [(f"What is {i} + {i}?", 2 * i) for i in range(3, 3 + args.num_fewshot)]
    start = time.time()
    with ThreadPoolExecutor(max_workers=int(margs.get("num_concurrent", "1"))) as pool:
        answers = list(
            pool.map(
                lambda d: ask(
                    margs["base_url"], margs["model"], d[0], shots, int(margs.get("max_gen_toks", "256"))
                ),
                subset,
            )
        )
    flex = [int(flexible(a) == str(v)) for a, (_, v) in zip(answers, subset, strict=False)]
    strc = [int(strict(a) == str(v)) for a, (_, v) in zip(answers, subset, strict=False)]
    results = {
        "results": {
            "gsm8k": {
                "alias": "gsm8k",
                "exact_match,strict-match": sum(strc) / len(strc),
                "exact_match_stderr,strict-match": stderr(strc),
                "exact_match,flexible-extract": sum(flex) / len(flex),
                "exact_match_stderr,flexible-extract": stderr(flex),
            }
        },
        "group_subtasks": {"gsm8k": []},
        "configs": {"gsm8k": {"task": "gsm8k", "dataset_path": "gsm8k", "num_fewshot": args.num_fewshot}},
        "versions": {"gsm8k": 3.0},
        "n-shot": {"gsm8k": args.num_fewshot},
        "higher_is_better": {"gsm8k": {"exact_match": True}},
        "n-samples": {"gsm8k": {"original": len(all_docs), "effective": len(subset)}},
        "config": {
            "model": args.model,
            "model_args": args.model_args,
            "batch_size": args.batch_size,
            "limit": args.limit,
            "bootstrap_iters": 100000,
        },
        "git_hash": None,
        "date": start,
        "model_source": args.model,
        "model_name": margs["model"],
        "model_name_sanitized": re.sub(r"[\"<>:/|\\?*\[\]]+", "__", margs["model"]),
        "fewshot_as_multiturn": args.fewshot_as_multiturn,
        "start_time": start,
        "end_time": time.time(),
        "total_evaluation_time_seconds": str(time.time() - start),
    }
    print(
        f"{args.model} ({args.model_args}), gen_kwargs: ({{}}), limit: {args.limit}, "
        f"num_fewshot: {args.num_fewshot}, batch_size: {args.batch_size}"
    )
    print("|Tasks|Version|     Filter     |n-shot|  Metric   |   |Value |   |Stderr|")
    for filt in ("flexible-extract", "strict-match"):
        r = results["results"]["gsm8k"]
        print(
            f"|gsm8k|      3|{filt:<16}|{args.num_fewshot:>6}|exact_match|↑  |"
            f"{r['exact_match,' + filt]:.4f}|±  |{r['exact_match_stderr,' + filt]:.4f}|"
        )
    if args.output_path:
        path = args.output_path
        date_id = datetime.now().isoformat().replace(":", "-")
        if path.endswith(".json"):
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            out = f"{path[:-5]}_{date_id}.json"
        else:
            folder = os.path.join(path, results["model_name_sanitized"])
            os.makedirs(folder, exist_ok=True)
            out = os.path.join(folder, f"results_{date_id}.json")
        with open(out, "w", encoding="utf-8") as f:
            json.dump(results, f, indent=2, ensure_ascii=False)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
