"""What a cause says is the same in every process (a set's iteration order follows the hash seed)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
from pipeline.compat.aiterapi import Param, Signature
from pipeline.compat.cause import describe_changes
def sig(names):
    return Signature("f", "aiter/x.py", 1, tuple(Param(n, "pos", False, None) for n in names))
rest = [f"p{i}" for i in range(16)]  # aiter 9fd9eed519's fused_qk_norm_rope_cache_quant_shuffle
print(describe_changes(sig(["qkv", *rest, "q", "k", "v"]), sig(["q", "k", "v", *rest])))
"""


def test_moves_are_listed_in_parameter_order_whatever_the_hash_seed() -> None:
    outs = set()
    for seed in ("1", "2", "3", "4", "5", "6"):
        env = dict(os.environ, PYTHONHASHSEED=seed, PYTHONPATH=str(ROOT))
        outs.add(
            subprocess.run(
                [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, check=True
            ).stdout
        )
    assert len(outs) == 1
    (out,) = outs
    assert out.index("`q` moved") < out.index("`k` moved") < out.index("`v` moved")
