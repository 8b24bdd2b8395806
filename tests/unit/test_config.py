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


def test_project_file_is_found_upward_to_the_repository_root(tmp_path: Path) -> None:
    """Like pre-commit: from a subdirectory, the repository's pipeline.toml is read and its
    directory is the project's root for relative [paths] (the defaults' and the file's)."""
    (tmp_path / ".git").mkdir()
    write(tmp_path, '[paths]\nlocks_dir = "pins"\n[sources]\natom_ref = "from-root"\n')
    sub = tmp_path / "docs" / "deep"
    sub.mkdir(parents=True)
    s = load_settings(cwd=sub, env={"PIPELINE_PATCHES_DIR": "mine"})
    assert s.config_file == str(tmp_path / "pipeline.toml")
    assert s.sources.atom_ref == "from-root" and s.origins["atom_ref"] == str(tmp_path / "pipeline.toml")
    assert s.paths.locks_dir == str(tmp_path / "pins") and s.paths.recipes_dir == str(tmp_path / "recipes")
    assert s.paths.patches_dir == "mine"  # what the user typed here stays relative to here
    at_root = load_settings(cwd=tmp_path)
    assert at_root.paths.recipes_dir == "recipes" and at_root.config_file == str(tmp_path / "pipeline.toml")


def test_project_file_search_stops_at_the_repository_root(tmp_path: Path) -> None:
    write(tmp_path, '[sources]\natom_ref = "outside"\n')
    repo = tmp_path / "repo"
    (repo / ".git").mkdir(parents=True)
    (repo / "sub").mkdir()
    assert load_settings(cwd=repo / "sub").sources.atom_ref == "main"
    plain = tmp_path / "plain"  # outside any repository only the working directory counts
    plain.mkdir()
    assert load_settings(cwd=plain).config_file == ""


def test_unknown_pipeline_variables_are_named_with_the_nearest_setting() -> None:
    from pipeline.config import unknown_env

    warnings = unknown_env(
        {
            "PIPELINE_OFFLNE": "1",
            "PIPELINE_OFFLINE": "1",
            "PIPELINE_REPLAY": "0",
            "PIPELINE_ZZZ": "",
            "HOME": "/",
        }
    )
    assert len(warnings) == 2
    assert "PIPELINE_OFFLNE" in warnings[0] and "did you mean PIPELINE_OFFLINE?" in warnings[0]
    assert "PIPELINE_ZZZ" in warnings[1] and "pipeline config" in warnings[1]


def test_no_recipe_names_a_directory_that_exists_or_says_it_does_not(tmp_path: Path) -> None:
    from pipeline.recipes.recipe import find_recipe

    with pytest.raises(ConfigError, match="does not exist"):
        find_recipe("MiniMax-M3-MXFP4", tmp_path / "recipes")
    (tmp_path / "recipes").mkdir()
    with pytest.raises(ConfigError, match="has no recipes"):
        find_recipe("MiniMax-M3-MXFP4", tmp_path / "recipes")
    (tmp_path / "recipes" / "MiniMax-M3-MXFP4.yaml").write_text("x")
    with pytest.raises(ConfigError, match="Did you mean MiniMax-M3-MXFP4"):
        find_recipe("MiniMax-M3-MXFP", tmp_path / "recipes")
