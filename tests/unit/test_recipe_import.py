"""The upstream-markdown recipe parser, on fixture markdown shaped like ATOM's recipes/*.md."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipeline.recipes.drift import _diff
from pipeline.recipes.recipe import parse_recipe
from pipeline.recipes.upstream import RecipeParseError, parse_markdown, render_yaml, source_of

SHA = "0123456789abcdef0123456789abcdef01234567"

# Two MI355 variants in one file, shared accuracy/benchmark sections whose captions name the
# variant, `${x:-default}` and `${TP}` variables, `2>&1 | tee`, a background `&`, `±` tables,
# and a non-MI355 section that must be skipped (written for these tests, shaped like ATOM's).
TWO_VARIANTS = (Path(__file__).parent.parent / "fixtures" / "recipes" / "Foo.md").read_text()


def variants(text: str = TWO_VARIANTS):  # type: ignore[no-untyped-def]
    got, notes, errors = parse_markdown(text, "recipes/Foo.md")
    assert errors == []
    return {v.name: v for v in got}, notes


def test_each_mi355_variant_with_its_variables_environment_and_tee_removed() -> None:
    got, notes = variants()
    assert sorted(got) == ["Foo-M1-FP4", "Foo-M1-FP8"]
    fp4 = got["Foo-M1-FP4"]
    assert fp4.model_id == "acme/Foo-M1-FP4" and fp4.gpus == 4 and fp4.port == 8000
    assert fp4.environment == {"AITER_QUICK_REDUCE_QUANTIZATION": "INT4", "ATOM_FLAG": "1"}
    assert fp4.server == [
        "python", "-m", "atom.entrypoints.openai_server", "--model", "${model}",
        "--tensor-parallel-size", "4", "--server-port", "${port}", "--kv_cache_dtype", "fp8",
        "--online_quant_config", '{"global_quant_config": "ptpc_fp8", "exclude_layer": ["lm_head"]}',
    ]  # fmt: skip
    assert "model.id" in fp4.inferred  # from ${model_path:-...}
    # the MI300X section is skipped, with a note naming its line
    assert any("names no MI355" in n for n in notes)


def test_env_prefix_tp_flag_and_a_missing_port_are_inferred() -> None:
    fp8 = variants()[0]["Foo-M1-FP8"]
    assert fp8.environment == {"HSA_NO_SCRATCH_RECLAIM": "1"}
    assert fp8.gpus == 8  # from the heading
    assert fp8.server[-2:] == ["--server-port", "${port}"]
    assert "server.port" in fp8.inferred


def test_validated_tables_with_plus_minus_and_reference_rows_attach_by_caption() -> None:
    got = variants()[0]
    fp4, fp8 = got["Foo-M1-FP4"], got["Foo-M1-FP8"]
    assert fp4.gsm8k_ref is not None and (fp4.gsm8k_ref.value, fp4.gsm8k_ref.stderr) == (0.9, 0.008)
    assert fp4.gsm8k_ref.samples_inferred is False  # "limit: None" is in the caption
    assert fp8.gsm8k_ref is not None and fp8.gsm8k_ref.value == 0.91 and fp8.gsm8k_ref.samples_inferred
    assert fp4.gsm8k is not None
    assert (
        "model=${model},base_url=http://127.0.0.1:${port}/v1/chat/completions,num_concurrent=32" in fp4.gsm8k
    )
    assert fp4.gsm8k[-1] == "65"  # "${BS}"
    assert fp4.bench_ref is not None and fp4.bench_per_conc == 4
    assert fp4.bench_ref.rows[0] == {
        "isl": 1024, "osl": 256, "concurrency": 8, "requests": 32, "duration_s": 10.0,
        "mean_ttft_ms": 100.5, "p99_ttft_ms": 200.0, "mean_tpot_ms": 5.25, "p99_tpot_ms": 6.0,
        "output_throughput": 1000.5, "total_token_throughput": 5000.0,
    }  # fmt: skip
    assert fp4.bench is not None and "--num-prompts=${num_prompts}" in fp4.bench
    assert "--random-input-len=${isl}" in fp4.bench and "--max-concurrency=${concurrency}" in fp4.bench
    assert fp8.bench_ref is None and "checks.serving-benchmark" in fp8.inferred


def test_rendered_yaml_is_a_valid_recipe_with_source_and_inferred_comments() -> None:
    got = variants()[0]
    for v in got.values():
        text = render_yaml(v, "recipes/Foo.md", SHA)
        r = parse_recipe(text, v.name)
        assert r.source == f"ROCm/ATOM recipes/Foo.md @ {SHA}"
        assert source_of(r.source) == ("recipes/Foo.md", SHA)
        assert "# inferred:" in text
    fp4 = parse_recipe(render_yaml(got["Foo-M1-FP4"], "recipes/Foo.md", SHA))
    assert [c.kind for c in fp4.checks] == ["chat", "gsm8k", "serving-benchmark"]
    bench = fp4.checks[2]
    assert bench.kind == "serving-benchmark" and bench.concurrencies == (16,)


@pytest.mark.parametrize(
    ("block", "expect"),
    [
        ("python -m atom.entrypoints.openai_server --model acme/X -tp <4-or-8>", r"Foo.md:6: .*placeholder"),
        ("python -m atom.entrypoints.openai_server --model $MODEL -tp 4", r"Foo.md:6: \$MODEL is not set"),
        ("python -m atom.entrypoints.openai_server --model 'acme/X -tp 4", r"Foo.md:6: cannot split"),
        ("python -m atom.entrypoints.openai_server --model acme/X | grep ready", r"Foo.md:6: a pipe into"),
    ],
)
def test_what_it_cannot_read_is_an_error_naming_the_line(block: str, expect: str) -> None:
    text = f"# X\n\n## On 4xMI355\n\n```bash\n{block}\n```\n"
    got, _, errors = parse_markdown(text, "recipes/Foo.md")
    assert got == []
    assert len(errors) == 1
    with pytest.raises(RecipeParseError, match=expect):
        raise errors[0]


def test_drift_diff_names_added_and_removed_flags_and_changed_numbers() -> None:
    old = {"server": ["--a", "1", "--b"], "environment": {"X": "1"}, "gsm8k reference": [0.9, 0.01]}
    new = {
        "server": ["--a", "1", "--c"],
        "environment": {"X": "2", "Y": "3"},
        "gsm8k reference": [0.91, 0.01],
    }
    assert _diff(old, new) == [
        ("server", ["--b"], ["--c"]),
        ("environment", {"X": "1", "Y": None}, {"X": "2", "Y": "3"}),
        ("gsm8k reference", [0.9, 0.01], [0.91, 0.01]),
    ]
    assert _diff(old, old) == []
