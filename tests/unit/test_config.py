from pathlib import Path

import pytest

from pipeline.config import load_settings
from pipeline.errors import ConfigError, ExitCode


def write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "pipeline.toml"
    p.write_text(text)
    return p


def test_defaults_then_file_then_env_then_flags(tmp_path: Path) -> None:
    write(tmp_path, '[sources]\natom_ref = "from-file"\naiter_ref = "from-file"\n[tag]\npush_latest = true\n')
    env = {"PIPELINE_AITER_REF": "from-env", "PIPELINE_MOVING_TAGS": "a, b", "PIPELINE_RUN_ID": "ignored"}
    s = load_settings(cwd=tmp_path, env=env, overrides={"atom_ref": None, "atom_repo": "/flag/atom"})
    assert s.sources.atom_ref == "from-file"
    assert s.sources.aiter_ref == "from-env"
    assert s.sources.atom_repo == "/flag/atom"
    assert s.sources.aiter_repo == "https://github.com/ROCm/aiter.git"
    assert s.tag.moving_tags == ["a", "b"]
    assert s.tag.push_latest is True
    assert s.origins["atom_repo"] == "flag"
    assert s.origins["aiter_ref"] == "env PIPELINE_AITER_REF"
    assert s.origins["atom_ref"].endswith("pipeline.toml")


def test_settings_are_frozen(tmp_path: Path) -> None:
    s = load_settings(cwd=tmp_path, env={})
    with pytest.raises(Exception, match="frozen"):
        s.sources.atom_ref = "x"  # type: ignore[misc]


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    p = write(tmp_path, '[sources]\natom_reff = "x"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(cwd=tmp_path, env={})
    assert str(p) in str(e.value) and "atom_reff" in str(e.value)
    assert e.value.exit_code == ExitCode.USAGE


def test_key_in_wrong_section_is_unknown(tmp_path: Path) -> None:
    write(tmp_path, '[image]\natom_ref = "x"\n')
    with pytest.raises(ConfigError, match="unknown key 'atom_ref' in \\[image\\]"):
        load_settings(cwd=tmp_path, env={})


def test_wrong_type_names_key_and_expected_type(tmp_path: Path) -> None:
    write(tmp_path, '[sources]\nfetch_retries = "three"\n')
    with pytest.raises(ConfigError) as e:
        load_settings(cwd=tmp_path, env={})
    msg = str(e.value)
    assert "[sources] fetch_retries" in msg and "integer" in msg and "pipeline.toml" in msg


def test_bad_env_value(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="PIPELINE_PUSH_LATEST"):
        load_settings(cwd=tmp_path, env={"PIPELINE_PUSH_LATEST": "maybe"})


def test_invalid_toml_and_missing_explicit_file(tmp_path: Path) -> None:
    write(tmp_path, "[sources\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_settings(cwd=tmp_path, env={})
    with pytest.raises(ConfigError, match="does not exist"):
        load_settings(config_file=tmp_path / "nope.toml", env={})


def test_literal_choice(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="'mirror' or 'in-build'"):
        load_settings(cwd=tmp_path, env={"PIPELINE_SUBMODULES": "git"})


def test_negative_fetch_retries_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(cwd=tmp_path, env={"PIPELINE_FETCH_RETRIES": "-5"})
    msg = str(e.value)
    assert "[sources] fetch_retries" in msg and "greater than or equal to 0" in msg and "-5" in msg


def test_a_long_bad_value_is_cut_in_the_message(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as e:
        load_settings(cwd=tmp_path, env={"PIPELINE_FETCH_RETRIES": "9" * 120_000 + "x"})
    assert "(120001 characters)" in str(e.value) and len(str(e.value)) < 500


@pytest.mark.parametrize("archs", ["gfx950", "gfx942;gfx950", "gfx90a:xnack+", "gfx1100"])
def test_gpu_archs_takes_architecture_lists(tmp_path: Path, archs: str) -> None:
    assert load_settings(env={"PIPELINE_GPU_ARCHS": archs}, cwd=tmp_path).image.gpu_archs == archs


@pytest.mark.parametrize("archs", ["gfx950;$(touch /tmp/x)", "gfx950 gfx942", "", "native;", "gfx95"])
def test_gpu_archs_refuses_anything_but_the_grammar(tmp_path: Path, archs: str) -> None:
    with pytest.raises(ConfigError, match=r"\[image\] gpu_archs .*gfx names separated by ';'") as e:
        load_settings(env={"PIPELINE_GPU_ARCHS": archs}, cwd=tmp_path)
    assert e.value.exit_code == 2
