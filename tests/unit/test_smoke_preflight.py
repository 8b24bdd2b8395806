from pathlib import Path

import pytest

from pipeline.errors import ConfigError, ExitCode
from pipeline.recipes.recipe import load_recipe
from pipeline.smoke.preflight import engine_is_local, no_hardware_error, resolve_hf_cache, run_preflight
from pipeline.smoke.probe import model_in_cache, read_nodes
from tests.fixtures.sysfs import make_sysfs, nodes_dir

REPO = Path(__file__).resolve().parents[2]
REAL = load_recipe(REPO / "recipes" / "MiniMax-M3-MXFP4.yaml")
TEST = load_recipe(REPO / "tests" / "servers" / "recipe-test.yaml")


def cache_with(root: Path, model: str, layout: str = "hub") -> Path:
    base = root / "hub" if layout == "hub" else root
    snap = base / ("models--" + model.replace("/", "--")) / "snapshots" / "abc"
    snap.mkdir(parents=True)
    (snap / "config.json").write_text("{}")
    return root


def preflight(
    tmp_path: Path,
    recipe=TEST,
    *,
    sysfs: Path | None = None,
    cache: str = "",  # type: ignore[no-untyped-def]
    env: dict[str, str] | None = None,
):
    sysfs = sysfs if sysfs is not None else make_sysfs(tmp_path / "sys")
    return run_preflight(
        None,
        image="img",
        recipe=recipe,
        nodes_dir=str(nodes_dir(sysfs)),
        hf_cache_raw=cache,
        env=env or {},
        docker_host=None,
    )


def test_read_nodes_tells_cpus_from_gpus(tmp_path: Path) -> None:
    nodes, err = read_nodes(str(nodes_dir(make_sysfs(tmp_path, gpus=2, cpu_nodes=2))))
    assert err is None
    assert [n["simd_count"] > 0 for n in nodes] == [False, False, True, True]
    assert {n["gfx_target_version"] for n in nodes if n["simd_count"]} == {90500}
    assert read_nodes(str(tmp_path / "nope"))[1] == f"no KFD topology at {tmp_path / 'nope'}"


def test_everything_present(tmp_path: Path) -> None:
    pf = preflight(tmp_path, cache=str(cache_with(tmp_path / "hf", "smoke-test/tiny-chat")))
    assert pf.missing == [] and len(pf.gpus) == 4 and pf.model_cached and pf.via == "local"
    assert [g["gfx"] for g in pf.gpus] == ["gfx950"] * 4


def test_token_instead_of_cache(tmp_path: Path) -> None:
    pf = preflight(tmp_path, env={"HF_TOKEN": "hf_x"})
    assert pf.missing == [] and pf.token_env == "HF_TOKEN" and not pf.model_cached


def test_hf_hub_cache_layout_counts(tmp_path: Path) -> None:
    assert model_in_cache(
        str(cache_with(tmp_path, "amd/MiniMax-M3-MXFP4", layout="flat")), "amd/MiniMax-M3-MXFP4"
    )
    assert not model_in_cache(str(tmp_path), "amd/Other")


@pytest.mark.parametrize(
    ("gpus", "version", "expect"),
    [
        (2, 90500, "4 gfx950 (MI355 (fake KFD topology)) GPU(s): found 2"),
        (8, 90402, "found 0 (and 8 GPU(s) of another architecture: gfx942)"),
        (0, 90500, "found 0 (the KFD topology at"),
    ],
)
def test_missing_gpus_are_named(tmp_path: Path, gpus: int, version: int, expect: str) -> None:
    pf = preflight(
        tmp_path,
        sysfs=make_sysfs(tmp_path / "s", gpus=gpus, gfx_target_version=version),
        env={"HF_TOKEN": "t"},
    )
    assert len(pf.missing) == 1 and expect in pf.missing[0], pf.missing


def test_no_topology_no_devices_no_model_all_named_in_one_paragraph(tmp_path: Path) -> None:
    pf = run_preflight(
        None,
        image="rocm/atom:x",
        recipe=REAL,
        nodes_dir=str(tmp_path / "none"),
        hf_cache_raw=str(tmp_path / "hf"),
        env={},
        docker_host=None,
    )
    err = no_hardware_error(pf, REAL, image="rocm/atom:x", engine_desc="the local Docker engine")
    msg = str(err)
    assert err.exit_code == ExitCode.NO_HARDWARE
    assert f"4 gfx950 (MI355) GPU(s): found 0 (no KFD topology at {tmp_path / 'none'})" in msg
    missing_devices = [d for d in ("/dev/kfd", "/dev/dri") if not Path(d).exists()]
    for dev in missing_devices:
        assert f"device {dev}" in msg
    assert f"the model amd/MiniMax-M3-MXFP4 in the Hugging Face cache {tmp_path / 'hf'}, or HF_TOKEN" in msg
    assert "pipeline smoke --image rocm/atom:x --model MiniMax-M3-MXFP4 --docker-host ssh://" in msg
    assert "\n" not in msg


def test_engine_locality_and_cache_path() -> None:
    assert engine_is_local(None) and engine_is_local("unix:///var/run/docker.sock")
    assert not engine_is_local("ssh://me@mi355") and not engine_is_local("tcp://10.0.0.1:2376")
    assert resolve_hf_cache("~/.cache/huggingface", local=True).endswith("/.cache/huggingface")
    with pytest.raises(ConfigError, match="absolute path on the GPU host"):
        resolve_hf_cache("~/.cache/huggingface", local=False)
