"""A small local GSM8K-format data set and an lm_eval task that runs the real `gsm8k` task on it.

Nothing from the real GSM8K is shipped: the documents are generated arithmetic questions in
GSM8K's shape (``{"question": ..., "answer": "<reasoning>\\n#### <number>"}``). The task file
``include``s the installed lm_eval's own ``tasks/gsm8k/gsm8k.yaml`` and swaps only the data
source (``dataset_path: json`` with local ``data_files``), so lm_eval's real prompt building,
5-shot multi-turn chat, filters (``strict-match``, ``flexible-extract``), ``exact_match`` metric
and stderr all run. It keeps the task name ``gsm8k``: with ``--include_path`` it overrides the
hub-backed one, and the recipe's ``--tasks gsm8k`` and the gate's ``results.gsm8k`` stay as on
the GPU host.

The answer class of each test document is fixed by its first operand ``a`` (``a % 4``), which the
test server's ``mixed`` mode reads (tests/servers/openai_server.py):

    0  wrong (off by one)         neither filter matches the target
    1  right, without "#### N"    flexible-extract matches, strict-match does not
    2, 3  right, with "#### N"    both match

so over the first ``n`` documents the expected scores are known exactly (`expected_scores`).

    python3 gsm8k_local.py OUT_DIR [--test N] [--train N]    # writes OUT_DIR/{gsm8k.yaml,*.jsonl}
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

WRONG, FLEX_ONLY = 0, 1  # a % 4 classes (see the module docstring)


def test_docs(n: int) -> list[tuple[int, int]]:
    """(a, b) of the test split: document i has a % 4 == i % 4."""
    return [(4 * (i + 3) + i % 4, 7 + (i * 13) % 50) for i in range(n)]


def doc(a: int, b: int) -> dict[str, str]:
    return {"question": f"What is {a} + {b}?", "answer": f"{a} + {b} = {a + b}.\n#### {a + b}"}


def expected_scores(n: int, mode: str = "mixed") -> dict[str, tuple[float, float]]:
    """{filter: (exact_match, stderr)} lm_eval must report over the first `n` documents."""
    classes = [a % 4 for a, _ in test_docs(n)]
    if mode == "healthy":
        flex = strict = [1] * n
    elif mode == "wrong":
        flex = strict = [0] * n
    else:
        flex = [int(c != WRONG) for c in classes]
        strict = [int(c not in (WRONG, FLEX_ONLY)) for c in classes]

    def mean_stderr(xs: list[int]) -> tuple[float, float]:
        m = sum(xs) / len(xs)  # lm_eval's mean_stderr: sample standard deviation / sqrt(n)
        return m, math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))

    return {"flexible-extract": mean_stderr(flex), "strict-match": mean_stderr(strict)}


def installed_gsm8k_yaml() -> Path:
    import lm_eval  # the lm_eval this task runs under

    path = Path(lm_eval.__file__).parent / "tasks" / "gsm8k" / "gsm8k.yaml"
    if not path.is_file():
        raise SystemExit(f"lm_eval at {path.parents[2]} has no tasks/gsm8k/gsm8k.yaml")
    return path


def write_task(out: Path, *, n_test: int = 120, n_train: int = 8, include: Path | None = None) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    with (out / "test.jsonl").open("w", encoding="utf-8") as f:
        for a, b in test_docs(n_test):
            f.write(json.dumps(doc(a, b)) + "\n")
    with (out / "train.jsonl").open("w", encoding="utf-8") as f:
        for i in range(n_train):  # the few-shot examples: always right, in GSM8K's answer format
            f.write(json.dumps(doc(3 + i, 5 + 2 * i)) + "\n")
    task = out / "gsm8k.yaml"
    task.write_text(
        f"include: {include or installed_gsm8k_yaml()}\n"
        "task: gsm8k\n"
        "dataset_path: json\n"
        "dataset_name: null\n"
        "dataset_kwargs:\n"
        "  data_files:\n"
        f"    train: {out / 'train.jsonl'}\n"
        f"    test: {out / 'test.jsonl'}\n",
        encoding="utf-8",
    )
    # another task over the same documents: a results file for the wrong task must fail the gate
    (out / "arith.yaml").write_text(task.read_text().replace("task: gsm8k", "task: arith"), encoding="utf-8")
    return task


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="gsm8k_local")
    p.add_argument("out", type=Path)
    p.add_argument("--test", type=int, default=120)
    p.add_argument("--train", type=int, default=8)
    args = p.parse_args(argv)
    print(write_task(args.out.resolve(), n_test=args.test, n_train=args.train))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
