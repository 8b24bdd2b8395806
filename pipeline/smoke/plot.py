"""`benchmark.svg`: the serving benchmark against the recipe, as release engineers compare it.

Three panels against concurrency: output throughput, TTFT and TPOT (our mean and p99, the
recipe's reference mean and the tolerance band the gate applied). Each of our rows is marked
passed or failed as the gate decided, and the SVG carries that decision as element ids
(``row-c16-failed``) so it can be checked without looking at pixels. matplotlib is the optional
extra ``plot``: without it the smoke stage writes no picture and says so once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipeline.recipes.recipe import BenchmarkCheck, Recipe
from pipeline.smoke.verdict import CheckStatus, Verdict

PLOT_FILE = "benchmark.svg"


@dataclass(frozen=True)
class Row:
    concurrency: int
    status: CheckStatus  # the gate's
    output_throughput: float | None
    mean_ttft_ms: float | None
    p99_ttft_ms: float | None
    mean_tpot_ms: float | None
    p99_tpot_ms: float | None


@dataclass(frozen=True)
class PlotData:
    """What the picture shows: our rows (with the gate's status) and the recipe's reference rows."""

    title: str
    tolerance: float
    rows: tuple[Row, ...]
    reference: tuple[dict[str, float | None], ...]  # concurrency, output_throughput, mean/p99 TTFT, TPOT
    failed: tuple[int, ...] = field(default=())


def plot_data(verdict: Verdict, recipe: Recipe) -> PlotData | None:
    """The benchmark rows of `verdict` beside `recipe`'s reference; None when no row ran."""
    bench = next((c for c in recipe.checks if isinstance(c, BenchmarkCheck)), None)
    if bench is None:
        return None
    rows: list[Row] = []
    tolerance = bench.tolerance
    for c in verdict.checks:
        if not c.name.startswith(f"{bench.name}[c") or c.status == "skipped":
            continue
        f = c.figures
        conc = f.get("concurrency") or int(c.name.rsplit("[c", 1)[1].rstrip("]"))
        tolerance = float(c.limits.get("tolerance", tolerance))

        def num(key: str, f: dict[str, Any] = f) -> float | None:
            v = f.get(key)
            return float(v) if isinstance(v, int | float) and not isinstance(v, bool) else None

        rows.append(
            Row(
                int(conc),
                c.status,
                num("output_throughput"),
                num("mean_ttft_ms"),
                num("p99_ttft_ms"),
                num("mean_tpot_ms"),
                num("p99_tpot_ms"),
            )
        )
    if not rows:
        return None
    ref = tuple(
        {
            "concurrency": r.concurrency,
            "output_throughput": r.output_throughput,
            "mean_ttft_ms": r.mean_ttft_ms,
            "mean_tpot_ms": r.mean_tpot_ms,
            "p99_ttft_ms": r.p99_ttft_ms,
            "p99_tpot_ms": r.p99_tpot_ms,
        }
        for r in sorted(bench.reference, key=lambda r: r.concurrency)
        if r.isl == bench.isl and r.osl == bench.osl
    )
    return PlotData(
        title=f"{recipe.name}: ISL {bench.isl} / OSL {bench.osl}, tolerance {tolerance:.0%}",
        tolerance=tolerance,
        rows=tuple(sorted(rows, key=lambda r: r.concurrency)),
        reference=ref,
        failed=tuple(r.concurrency for r in rows if r.status != "passed"),
    )


def write_plot(data: PlotData, path: Path) -> Path:
    """Render `data` as SVG at `path` (written atomically). Needs the `plot` extra (matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")  # no display; before pyplot is imported
    import matplotlib.pyplot as plt

    panels = (
        ("output_throughput", None, "output throughput (tok/s)", -1),
        ("mean_ttft_ms", "p99_ttft_ms", "TTFT (ms)", 1),
        ("mean_tpot_ms", "p99_tpot_ms", "TPOT (ms)", 1),
    )
    fig, axes = plt.subplots(1, 3, figsize=(15, 4.5))
    fig.suptitle(data.title)
    ref_x = [r["concurrency"] for r in data.reference]
    for ax, (mean_key, p99_key, label, sign) in zip(axes, panels, strict=True):
        ref_y = [float(r[mean_key] or 0.0) for r in data.reference]  # means are required in a recipe
        if ref_x:
            bound = [y * (1 + sign * data.tolerance) for y in ref_y]
            ax.plot(ref_x, ref_y, "s--", color="grey", label="recipe reference (mean)")
            ax.fill_between(ref_x, ref_y, bound, color="grey", alpha=0.2, label="tolerance band")
            ref_p99 = [(r["concurrency"], r[p99_key]) for r in data.reference if p99_key and r[p99_key]]
            if ref_p99:
                ax.plot(*zip(*ref_p99, strict=True), "v:", color="grey", label="recipe reference (p99)")
        xs = [r.concurrency for r in data.rows]
        ys = [getattr(r, mean_key) for r in data.rows]
        ax.plot(xs, ys, "-", color="tab:blue", label="ours (mean)" if p99_key else "ours")
        if p99_key:
            p99 = [(r.concurrency, getattr(r, p99_key)) for r in data.rows if getattr(r, p99_key) is not None]
            if p99:
                ax.plot(*zip(*p99, strict=True), "^:", color="tab:purple", label="ours (p99)")
        for r in data.rows:
            y = getattr(r, mean_key)
            if y is None:
                continue
            ok = r.status == "passed"
            (mark,) = ax.plot(
                [r.concurrency], [y], "o" if ok else "X", color="tab:green" if ok else "tab:red", markersize=9
            )
            mark.set_gid(f"row-c{r.concurrency}-{'passed' if ok else 'failed'}-{mean_key}")
        ax.set_xlabel("concurrency")
        ax.set_ylabel(label)
        ax.set_xscale("log", base=2)
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8)
    if data.failed:
        failed = "failed rows: " + ", ".join(f"c{c}" for c in data.failed)
        fig.text(0.5, 0.01, failed, ha="center", color="red")
    fig.tight_layout(rect=(0, 0.04, 1, 0.95))
    tmp = path.with_name(f".{path.name}.tmp")
    fig.savefig(tmp, format="svg", metadata={"Date": None})  # no date: the same data, the same file
    plt.close(fig)
    tmp.replace(path)
    return path


def write_for(verdict: Verdict, recipe: Recipe, run_dir: Path, log: Any) -> Path | None:
    """Write `run_dir`/benchmark.svg when benchmark rows ran; never fails the smoke stage."""
    data = plot_data(verdict, recipe)
    if data is None:
        return None
    if not available():
        log.info(f"no {PLOT_FILE}: install the `plot` extra (pip install 'atom-image-pipeline[plot]')")
        return None
    try:
        return write_plot(data, run_dir / PLOT_FILE)
    except Exception as e:  # a picture is a report, not a gate: the verdict stands without it
        log.warn(f"could not draw {PLOT_FILE}: {type(e).__name__}: {e}")
        return None


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True
