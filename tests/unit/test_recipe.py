from pathlib import Path

import pytest

from pipeline.errors import ConfigError, ExitCode
from pipeline.recipes.recipe import (
    BenchmarkCheck,
    ChatCheck,
    Gsm8kCheck,
    expand,
    find_recipe,
    gfx_to_target_version,
    load_recipe,
    parse_recipe,
    target_version_to_gfx,
)

REPO = Path(__file__).resolve().parents[2]
MXFP4 = REPO / "recipes" / "MiniMax-M3-MXFP4.yaml"
MXFP8 = REPO / "recipes" / "MiniMax-M3-MXFP8.yaml"
TEST_RECIPE = REPO / "tests" / "servers" / "recipe-test.yaml"


def test_mxfp4_recipe_transcribes_atoms_recipe_and_the_bug_report() -> None:
    r = load_recipe(MXFP4)
    assert r.model.id == "amd/MiniMax-M3-MXFP4"
    assert (r.hardware.gpus, r.hardware.gfx, r.hardware.gfx_target_version) == (4, "gfx950", 90500)
    assert r.environment["AITER_QUICK_REDUCE_QUANTIZATION"] == "INT4"
    assert r.environment["ATOM_FORCE_ATTN_TRITON"] == "1"
    assert r.environment["TORCHDYNAMO_DISABLE"] == "1"
    c = r.container
    assert c.devices == ("/dev/kfd", "/dev/dri") and c.group_add == ("video",) and c.ipc_mode == "host"
    assert c.cap_add == ("SYS_PTRACE",) and c.security_opt == ("seccomp=unconfined",)
    assert c.hf_cache_mount == "/root/.cache/huggingface"
    assert r.secrets == ("HF_TOKEN",) and "HF_TOKEN" not in r.environment
    cmd = expand(r.server.command, {"model": r.model.id, "port": r.server.port})
    assert cmd[:5] == ["python", "-m", "atom.entrypoints.openai_server", "--model", "amd/MiniMax-M3-MXFP4"]
    for flag, value in (
        ("--tensor-parallel-size", "4"),
        ("--server-port", "8000"),
        ("--block-size", "128"),
        ("--max-model-len", "32768"),
        ("--gpu-memory-utilization", "0.8"),
    ):
        assert cmd[cmd.index(flag) + 1] == value
    assert "--no-enable_prefix_caching" in cmd and "--trust-remote-code" in cmd
    chat, gsm, bench = r.checks
    assert isinstance(chat, ChatCheck) and isinstance(gsm, Gsm8kCheck) and isinstance(bench, BenchmarkCheck)
    assert (gsm.reference.value, gsm.reference.stderr) == (0.9363, 0.0067)
    assert gsm.metric == "exact_match,flexible-extract" and gsm.limit is None
    assert "--num_fewshot" in gsm.command and gsm.command[gsm.command.index("--num_fewshot") + 1] == "5"
    assert (bench.isl, bench.osl, bench.concurrencies) == (8192, 1024, (16,))
    row = bench.row(16)
    assert row is not None
    assert (row.output_throughput, row.mean_ttft_ms, row.mean_tpot_ms) == (1280.47, 383.04, 11.73)
    assert [x.concurrency for x in bench.reference] == [4, 8, 16, 32, 64]
    assert "atom.benchmarks.benchmark_serving" in bench.command


def test_mxfp8_recipe_has_its_own_numbers_and_online_quant() -> None:
    r = load_recipe(MXFP8)
    assert r.model.id == "MiniMaxAI/MiniMax-M3-MXFP8"
    gsm = r.checks[1]
    assert isinstance(gsm, Gsm8kCheck) and (gsm.reference.value, gsm.reference.stderr) == (0.9484, 0.0061)
    i = r.server.command.index("--online_quant_config")
    assert '"global_quant_config": "ptpc_fp8"' in r.server.command[i + 1]
    bench = r.checks[2]
    assert isinstance(bench, BenchmarkCheck)
    row = bench.row(16)
    assert row is not None and row.output_throughput == 1022.17 and row.mean_tpot_ms == 14.80


def test_test_recipe_uses_the_same_schema() -> None:
    r = load_recipe(TEST_RECIPE)
    assert r.hardware.devices == () and r.container.devices == ()


def _broken(tmp_path: Path, old: str, new: str) -> Path:
    text = MXFP4.read_text()
    assert old in text
    path = tmp_path / "broken.yaml"
    path.write_text(text.replace(old, new, 1))
    return path


@pytest.mark.parametrize(
    ("given", "flag"),
    [
        (["-o", "/tmp/out"], "--output_path"),
        (["-o/tmp/out"], "--output_path"),
        (["--output_path=/tmp/out"], "--output_path"),
        (["--output", "/tmp/out"], "--output_path"),  # argparse takes an unambiguous abbreviation
        (["-L", "5"], "--limit"),
        (["-L5"], "--limit"),
        (["--lim", "5"], "--limit"),
    ],
)
def test_gsm8k_command_may_not_set_what_the_runner_sets_in_any_form(
    tmp_path: Path, given: list[str], flag: str
) -> None:
    extra = "".join(f"      - '{a}'\n" for a in given)
    path = _broken(tmp_path, "      - --fewshot_as_multiturn\n", "      - --fewshot_as_multiturn\n" + extra)
    with pytest.raises(ConfigError, match=f"must not contain {flag}"):
        load_recipe(path)


@pytest.mark.parametrize(
    ("old", "new", "expect"),
    [
        ("gpus: 4", "gpus: four", "hardware.gpus: Input should be a valid integer"),
        ("gpus: 4", "gpus: 0", "hardware.gpus: Input should be greater than or equal to 1"),
        ("gfx: gfx950", "gfx: mi355", "hardware.gfx: String should match pattern"),
        ('ATOM_FORCE_ATTN_TRITON: "1"', "ATOM_FORCE_ATTN_TRITON: 1", "environment.ATOM_FORCE_ATTN_TRITON"),
        ("value: 0.9363", "value: high", "checks[1].reference.value: Input should be a valid number"),
        ("port: 8000", "port: 8000\n  colour: blue", "server.colour: Extra inputs are not permitted"),
        ("  ready_timeout_s: 2700\n", "", "server.ready_timeout_s: Field required"),
        ("    - ${model}\n", "    - ${modle}\n", "unknown placeholder(s) ${modle}"),
        ("concurrencies: [16]", "concurrencies: [12]", "concurrency 12 (ISL 8192 / OSL 1024) has no row"),
        ("secrets: [HF_TOKEN]", "secrets: [HF_TOKEN, AITER_QUICK_REDUCE_QUANTIZATION]", "listed in both"),
        (
            "      - --fewshot_as_multiturn\n",
            "      - --fewshot_as_multiturn\n      - --limit\n      - '5'\n",
            "must not contain --limit",
        ),
        ("kind: chat", "kind: chitchat", "checks[0]: Input tag 'chitchat' found using 'kind' does not match"),
        ("schema: atom-image-pipeline/recipe/v1", "schema: v0", "schema: Input should be"),
    ],
)
def test_invalid_recipe_names_file_key_and_problem(tmp_path: Path, old: str, new: str, expect: str) -> None:
    path = _broken(tmp_path, old, new)
    with pytest.raises(ConfigError) as exc:
        load_recipe(path)
    msg = str(exc.value)
    assert str(path) in msg and expect in msg, msg
    assert exc.value.exit_code == ExitCode.USAGE


def test_duplicate_key_and_bad_yaml_are_errors(tmp_path: Path) -> None:
    dup = _broken(tmp_path, "  gpus: 4\n", "  gpus: 4\n  gpus: 8\n")
    with pytest.raises(ConfigError, match="duplicate key 'gpus'"):
        load_recipe(dup)
    with pytest.raises(ConfigError, match="not valid YAML"):
        parse_recipe("a: [1, 2\n", "x.yaml")
    with pytest.raises(ConfigError, match="expected a mapping"):
        parse_recipe("- 1\n", "x.yaml")
    with pytest.raises(ConfigError, match=r"recipe .*missing\.yaml does not exist"):
        load_recipe(tmp_path / "missing.yaml")


def test_find_recipe(tmp_path: Path) -> None:
    assert find_recipe("MiniMax-M3-MXFP4", REPO / "recipes") == MXFP4
    with pytest.raises(ConfigError) as exc:
        find_recipe("Llama-9", REPO / "recipes")
    assert "MiniMax-M3-MXFP4, MiniMax-M3-MXFP8" in str(exc.value)


@pytest.mark.parametrize(
    ("gfx", "version"), [("gfx950", 90500), ("gfx942", 90402), ("gfx90a", 90010), ("gfx1100", 110000)]
)
def test_gfx_target_version(gfx: str, version: int) -> None:
    assert gfx_to_target_version(gfx) == version
    assert target_version_to_gfx(version) == gfx


def test_a_recipe_setup_that_installs_lm_eval_installs_the_pinned_version() -> None:
    """The lm_eval a GPU host installs is the one the image bakes in and CI runs (toolpins)."""
    from pipeline.recipes.recipe import Gsm8kCheck
    from pipeline.toolpins import LM_EVAL_REQUIREMENT

    installing = 0
    for path in sorted((Path(__file__).resolve().parents[2] / "recipes").glob("*.yaml")):
        for check in load_recipe(path).checks:
            if isinstance(check, Gsm8kCheck) and "install" in " ".join(check.setup or ()):
                installing += 1
                assert f"'{LM_EVAL_REQUIREMENT}'" in " ".join(check.setup or ()), path.name
    assert installing >= 5


# -- secrets: an allow-list; the tool's own credentials never (issue 26 §3) ----------------


def _with_secrets(tmp_path: Path, names: str) -> tuple[Path, int]:
    path = _broken(tmp_path, "secrets: [HF_TOKEN]", f"secrets:\n  - HF_TOKEN\n  - {names}")
    line = path.read_text().splitlines().index(f"  - {names}") + 1
    return path, line


@pytest.mark.parametrize(
    "name", ["PIPELINE_REGISTRY_PASSWORD", "REGISTRY_PASSWORD", "COSIGN_PASSWORD", "DOCKER_AUTH_CONFIG"]
)
def test_a_recipe_asking_for_the_tools_own_credentials_is_refused_naming_the_line(
    tmp_path: Path, name: str
) -> None:
    path, line = _with_secrets(tmp_path, name)
    with pytest.raises(ConfigError) as exc:
        load_recipe(path)  # refused at any validation, allow-list or not
    assert exc.value.exit_code == ExitCode.USAGE
    msg = str(exc.value)
    assert f"{path}:{line}: secrets[1]: {name} is one of the pipeline's own credentials" in msg


def test_a_recipe_secret_must_be_on_the_allow_list(tmp_path: Path) -> None:
    from pipeline.config import load_settings

    path, line = _with_secrets(tmp_path, "OPENAI_API_KEY")
    default = load_settings(env={}, cwd=tmp_path)
    assert default.recipe_secrets == frozenset({"HF_TOKEN"})
    with pytest.raises(ConfigError) as exc:
        load_recipe(path, allowed_secrets=default.recipe_secrets)
    assert f"{path}:{line}: secret OPENAI_API_KEY is not one a recipe may pass" in str(exc.value)
    assert "[smoke] recipe_secrets" in str(exc.value)
    added = load_settings(env={"PIPELINE_RECIPE_SECRETS": "OPENAI_API_KEY"}, cwd=tmp_path)
    assert load_recipe(path, allowed_secrets=added.recipe_secrets).secrets == ("HF_TOKEN", "OPENAI_API_KEY")


def test_configuration_cannot_allow_the_tools_own_credentials(tmp_path: Path) -> None:
    from pipeline.config import load_settings

    with pytest.raises(ConfigError, match="recipe_secrets"):
        load_settings(env={"PIPELINE_RECIPE_SECRETS": "HF_TOKEN,PIPELINE_REGISTRY_PASSWORD"}, cwd=tmp_path)


def test_smoke_refuses_the_recipe_before_any_engine_is_asked(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    import pipeline.oci.engine
    from pipeline.cli import main

    monkeypatch.setattr(
        pipeline.oci.engine.Engine, "connect", classmethod(lambda *a, **k: pytest.fail("engine"))
    )
    path, line = _with_secrets(tmp_path, "PIPELINE_REGISTRY_PASSWORD")
    args = ["smoke", "--image", "x", "--recipe", str(path), "--run-dir", str(tmp_path / "run")]
    assert main(args) == ExitCode.USAGE
    assert f"{path}:{line}: secrets[1]: PIPELINE_REGISTRY_PASSWORD" in capsys.readouterr().err


# -- YAML aliases (issue 26 §5) ------------------------------------------------------------

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + k)}: &{chr(98 + k)} [*{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}, "
    f"*{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}, *{chr(97 + k)}]\n"
    for k in range(12)
)


def test_a_yaml_alias_bomb_is_refused_at_its_first_alias(tmp_path: Path) -> None:
    path = tmp_path / "bomb.yaml"
    path.write_text(BOMB)  # 9**13 strings once expanded
    with pytest.raises(ConfigError, match=r"bomb\.yaml:2: YAML alias \*a refused") as exc:
        load_recipe(path)
    assert exc.value.exit_code == ExitCode.USAGE
