"""params.yaml: one-line errors, profiles, sections."""

import jax
import pytest
import yaml

from repro import config
from repro.config import ConfigError


def test_malformed_yaml_is_one_line(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("profile: smoke\ngemm:\n  smoke: {repeats: 3\n  full: [1, 2\n")
    with pytest.raises(ConfigError) as e:
        config.load_params(p)
    msg = str(e.value)
    assert "\n" not in msg and "malformed YAML" in msg and "line" in msg and str(p) in msg


def test_missing_and_non_mapping(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        config.load_params(tmp_path / "nope.yaml")
    p = tmp_path / "params.yaml"
    p.write_text("- just\n- a list\n")
    with pytest.raises(ConfigError, match="mapping"):
        config.load_params(p)


def test_unknown_profile(tmp_path):
    with pytest.raises(ConfigError, match="valid profiles: smoke, full, auto"):
        config.resolve_profile("fast")
    p = tmp_path / "params.yaml"
    p.write_text("profile: fast\n")
    with pytest.raises(ConfigError, match="unknown profile 'fast'"):
        config.load_params(p)


def test_auto_profile():
    expected = "full" if jax.default_backend() == "gpu" else "smoke"
    assert config.resolve_profile("auto") == expected
    assert config.resolve_profile("full") == "full"


def test_stage_params_merges_common():
    params = {"profile": "smoke",
              "gemm": {"common": {"dtypes": ["bf16"], "repeats": 30}, "smoke": {"repeats": 3},
                       "full": {}}}
    smoke = config.stage_params("gemm", params=params)
    assert smoke == {"dtypes": ["bf16"], "repeats": 3, "profile": "smoke"}
    assert config.stage_params("gemm", "full", params=params)["repeats"] == 30
    with pytest.raises(ConfigError, match="no section 'lm'; sections: gemm"):
        config.stage_params("lm", params=params)
    with pytest.raises(ConfigError, match="no 'full' profile"):
        config.stage_params("gemm", "full", params={"gemm": {"smoke": {}}})


def test_repository_params_load_for_every_profile():
    params = config.load_params()
    sections = [k for k, v in params.items() if isinstance(v, dict)]
    assert {"formats", "gemm"} <= set(sections)
    for section in sections:
        for profile in ("smoke", "full"):
            assert config.stage_params(section, profile, params=params)["profile"] == profile
    yaml.safe_dump(params)  # plain data
