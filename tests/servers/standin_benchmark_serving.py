"""Stand-in for `python -m atom.benchmarks.benchmark_serving` in the docker-tier tests.

There is no GPU and no tokenizer here. This takes the recipe's command line (`--model=...
--backend=vllm --base-url=... --dataset-name=random --random-input-len=ISL
--random-output-len=OSL --num-prompts=N --max-concurrency=C --ignore-eos --save-result
--result-dir=DIR --result-filename=FILE ...`), streams N requests from /v1/completions at
concurrency C, measures TTFT/TPOT/ITL/E2EL as benchmark_serving does, and writes the JSON
that ATOM's benchmark_serving.py writes with --save-result (keys "duration", "completed",
"output_throughput", "mean_ttft_ms", "mean_tpot_ms", "p99_ttft_ms", ...), in the same code
shape as ATOM's script, so tests/git/test_benchfmt.py reads both the same way.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any


def one(base_url: str, model: str, isl: int, osl: int, ignore_eos: bool) -> dict[str, Any]:
    body = json.dumps(
        {
            "model": model,
            "prompt": "hi " * isl,
            "max_tokens": osl,
            "stream": True,
            "ignore_eos": ignore_eos,
            "temperature": 0,
        }
    ).encode()
    req = urllib.request.Request(
        f"{base_url}/v1/completions", data=body, headers={"Content-Type": "application/json"}
    )
    start = time.perf_counter()
    ttft = 0.0
    itl: list[float] = []
    last = start
    tokens = 0
    try:
        with urllib.request.urlopen(req, timeout=300) as resp:
            for raw in resp:
                line = raw.decode().strip()
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                now = time.perf_counter()
                if tokens == 0:
                    ttft = now - start
                else:
                    itl.append(now - last)
                last = now
                tokens += 1
    except Exception as e:
        return {"success": False, "error": f"{type(e).__name__}: {e}", "prompt_len": isl}
    latency = time.perf_counter() - start
    return {
        "success": tokens > 0,
        "ttft": ttft,
        "itl": itl,
        "latency": latency,
        "output_len": tokens,
        "prompt_len": isl,
        "error": "",
    }


def pct(xs: list[float], p: float) -> float:
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="benchmark_serving")
    p.add_argument("--model", required=True)
    p.add_argument("--backend", default="vllm")
    p.add_argument("--base-url", required=True)
    p.add_argument("--dataset-name", default="random")
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0)
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int)
    p.add_argument("--request-rate", default="inf")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--save-result", action="store_true")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl")
    p.add_argument("--metric-percentiles", default="99")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--result-dir")
    p.add_argument("--result-filename")
    args = p.parse_args(argv)
    conc = args.max_concurrency or args.num_prompts
    start = time.perf_counter()
    with ThreadPoolExecutor(max_workers=conc) as pool:
        outs = list(
            pool.map(
                lambda _: one(
                    args.base_url, args.model, args.random_input_len, args.random_output_len, args.ignore_eos
                ),
                range(args.num_prompts),
            )
        )
    duration = time.perf_counter() - start
    ok = [o for o in outs if o["success"]]
    ttfts = [o["ttft"] for o in ok]
    tpots = [(o["latency"] - o["ttft"]) / (o["output_len"] - 1) for o in ok if o["output_len"] > 1]
    itls = [x for o in ok for x in o["itl"]]
    e2els = [o["latency"] for o in ok]
    total_in = sum(o["prompt_len"] for o in ok)
    total_out = sum(o["output_len"] for o in ok)
    # From here on the shape of ATOM's benchmark_serving.py (at ab9eb781 and HEAD): the same
    # literal keys, the same per-metric helper and f-string keys, the same result_json and file
    # name, so pipeline/smoke/benchfmt.py reads this script as it reads ATOM's.
    result = {
        "duration": duration,
        "completed": len(ok),
        "total_input_tokens": total_in,
        "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration,
        "request_goodput:": None,
        "output_throughput": total_out / duration,
        "total_token_throughput": (total_in + total_out) / duration,
    }
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    print("{:<40} {:<10}".format("Successful requests:", len(ok)))
    print("{:<40} {:<10.2f}".format("Output token throughput (tok/s):", result["output_throughput"]))
    selected_percentile_metrics = args.percentile_metrics.split(",")
    selected_percentiles = [float(x) for x in args.metric_percentiles.split(",")]
    measured = {"ttft": ttfts, "tpot": tpots, "itl": itls, "e2el": e2els}

    def process_one_metric(metric_attribute_name: str, metric_name: str, metric_header: str) -> None:
        if metric_attribute_name not in selected_percentile_metrics:
            return
        ms = [x * 1000 for x in measured[metric_attribute_name]]
        print("{s:{c}^{n}}".format(s=metric_header, n=50, c="-"))
        result[f"mean_{metric_attribute_name}_ms"] = statistics.fmean(ms) if ms else 0.0
        result[f"median_{metric_attribute_name}_ms"] = statistics.median(ms) if ms else 0.0
        result[f"std_{metric_attribute_name}_ms"] = statistics.pstdev(ms) if ms else 0.0
        mean = result[f"mean_{metric_attribute_name}_ms"]
        print("{:<40} {:<10.2f}".format(f"Mean {metric_name} (ms):", mean))
        for p in selected_percentiles:
            p_word = str(int(p)) if int(p) == p else str(p)
            result[f"p{p_word}_{metric_attribute_name}_ms"] = pct(ms, p)

    process_one_metric("ttft", "TTFT", "Time to First Token")
    process_one_metric("tpot", "TPOT", "Time per Output Token (excl. 1st token)")
    process_one_metric("itl", "ITL", "Inter-token Latency")
    process_one_metric("e2el", "E2EL", "End-to-end Latency")
    if args.save_result:
        result_json: dict[str, Any] = {}
        current_dt = datetime.now().strftime("%Y%m%d-%H%M%S")
        result_json["date"] = current_dt
        result_json["backend"] = args.backend
        result_json["model_id"] = args.model
        result_json["tokenizer_id"] = args.model
        result_json["best_of"] = 1
        result_json["num_prompts"] = args.num_prompts
        result_json["request_rate"] = args.request_rate if args.request_rate != "inf" else "inf"
        result_json["burstiness"] = 1.0
        result_json["max_concurrency"] = args.max_concurrency
        result_json = {**result_json, **result}
        base_model_id = args.model.split("/")[-1]
        max_concurrency_str = (
            f"-concurrency{args.max_concurrency}" if args.max_concurrency is not None else ""
        )
        file_name = (
            f"{args.backend}-{args.request_rate}qps{max_concurrency_str}-{base_model_id}-{current_dt}.json"
        )
        if args.result_filename:
            file_name = args.result_filename
        if args.result_dir:
            file_name = os.path.join(args.result_dir, file_name)
        with open(file_name, "w", encoding="utf-8") as outfile:
            json.dump(result_json, outfile)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
