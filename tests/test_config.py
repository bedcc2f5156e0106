"""params.yaml: one-line errors, profiles, sections, typed and checked parameters."""

from dataclasses import dataclass

import jax
import pytest
import yaml

from repro import config, studies
from repro.config import ConfigError, Section, from_cli, positive, recipe_names


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


def test_every_study_section_is_typed_for_every_profile():
    raw = config.load_params()
    for name in studies.EXPERIMENTS:
        for profile in ("smoke", "full"):
            p = studies.params(name, profile, raw)
            if isinstance(p, dict):  # read as a mapping: its study checks it against a schema
                assert p["profile"] == profile
                bad = {**p, "repeatz": 3}
                with pytest.raises(ValueError, match="repeatz"):
                    studies.study(name).check(bad)
            else:
                assert isinstance(p, Section) and p.profile == profile
    gemm = studies.params("gemm", "smoke", raw)
    assert gemm.shapes == ((256, 256, 256), (1024, 128, 128)) and gemm.repeats == 3


@dataclass(frozen=True)
class Inner:
    size: str
    steps: int = positive(None)


@dataclass(frozen=True, kw_only=True)
class Toy(Section):
    shapes: tuple[tuple[int, int, int], ...] = positive()
    repeats: int = positive(3)
    lr: float = 0.1
    recipes: tuple[str, ...] = recipe_names(("bf16",))
    runs: tuple[Inner, ...] = ()
    batch: int | dict[str, int] = 1
    checkout: str | None = from_cli()


def toy(**smoke):
    return {"toy": {"common": {"shapes": [[1, 2, 3]]}, "smoke": smoke, "full": {}}}


def test_a_section_is_typed_with_common_under_the_profile():
    p = config.section("toy", Toy, "smoke", toy(repeats=5, lr=1, batch={"a": 2},
                                              runs=[{"size": "tiny"}]))
    assert p == Toy(profile="smoke", shapes=((1, 2, 3),), repeats=5, lr=1.0, batch={"a": 2},
                    runs=(Inner(size="tiny"),))
    assert isinstance(p.lr, float) and p.checkout is None
    assert config.section("toy", None, "full", toy()) == {"shapes": [[1, 2, 3]],
                                                          "profile": "full"}


@pytest.mark.parametrize("smoke,expected", [
    ({"repets": 3}, "params.yaml: toy.smoke.repets: unknown key (did you mean 'repeats'?); "
                    "valid keys: shapes, repeats, lr, recipes, runs, batch"),
    ({"checkout": "x"}, "toy.smoke.checkout: unknown key"),  # set by the command line only
    ({"repeats": "3"}, "params.yaml: toy.smoke.repeats: expected int, got '3'"),
    ({"repeats": True}, "toy.smoke.repeats: expected int, got True"),
    ({"repeats": 0}, "params.yaml: toy.smoke.repeats: must be > 0, got 0"),
    ({"shapes": [[1, 2]]}, "toy.smoke.shapes[0]: expected a list of 3, got [1, 2]"),
    ({"shapes": [[1, -2, 3]]}, "toy.smoke.shapes: must be > 0, got -2"),
    ({"recipes": ["bf16", "fp9"]}, "toy.smoke.recipes: unknown recipe 'fp9'"),
    ({"runs": [{"size": "tiny", "stepz": 2}]}, "toy.smoke.runs[0].stepz: unknown key (did you "
                                               "mean 'steps'?)"),
    ({"runs": [{"steps": 2}]}, "toy.smoke.runs[0]: missing key 'size'"),
    ({"batch": [1]}, "toy.smoke.batch: expected int or dict[str, int], got [1]"),
])
def test_bad_values_are_one_line_naming_file_and_key_path(smoke, expected):
    with pytest.raises(ConfigError) as e:
        config.section("toy", Toy, "smoke", toy(**smoke))
    assert expected in str(e.value) and "\n" not in str(e.value)


def test_unknown_sub_section_and_missing_key(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_text("profile: smoke\ngemm: {common: {}, smoke: {}, ful: {}}\n")
    with pytest.raises(ConfigError, match=r"params.yaml: gemm.ful: unknown key \(did you mean "
                                          r"'full'\?\); valid keys: common, smoke, full"):
        config.load_params(path)
    with pytest.raises(ConfigError, match="params.yaml: toy.smoke: missing key 'shapes'"):
        config.section("toy", Toy, "smoke", {"toy": {"smoke": {}, "full": {}}})


# ------------------------------------------------------- a params.yaml that cannot be read


@pytest.mark.parametrize("data, says", [
    (b"profile: smoke\ngemm:\n  smoke: {repeats: \xff}\n",
     "not UTF-8 text: byte 0xff at line 3, column 20"),
    (b"profile: smoke\n\x00\x01garbage\x02\n", "not YAML text: character '\\x00' at line 2, "
     "column 1 (special characters are not allowed)"),
    (bytes(range(256)) * 3, "not UTF-8 text: byte 0x80 at line 2, column 118"),
    (b"\xef\xbb\xbfprofile: smoke\n\x85\n", "not UTF-8 text: byte 0x85 at line 2, column 1"),
    (b"profile: smoke\ngemm:\n  smoke: {repeats: 3\n", "malformed YAML (line 4, column 1)"),
])
def test_an_unreadable_params_yaml_is_one_line_naming_it_and_the_position(tmp_path, data,
                                                                          says):
    p = tmp_path / "params.yaml"
    p.write_bytes(data)
    with pytest.raises(ConfigError) as e:
        config.load_params(p)
    assert str(e.value).startswith(f"{p}: {says}"), str(e.value)
    assert "\n" not in str(e.value)


def test_a_params_yaml_that_cannot_be_opened_is_named(tmp_path, monkeypatch):
    import builtins
    import errno

    p = tmp_path / "params.yaml"
    p.write_text("profile: smoke\n")
    real_open = builtins.open

    def denied(file, *a, **k):
        if str(file) == str(p):
            raise PermissionError(errno.EACCES, "Permission denied", str(p))
        return real_open(file, *a, **k)

    monkeypatch.setattr(builtins, "open", denied)
    monkeypatch.setattr(type(p), "read_bytes", lambda self: denied(self).read())
    with pytest.raises(ConfigError) as e:
        config.load_params(p)
    assert str(e.value) == f"{p}: cannot be read: Permission denied"


def test_yaml_merge_keys_work_and_an_explicit_key_twice_is_still_refused(tmp_path):
    p = tmp_path / "params.yaml"
    p.write_text("profile: smoke\n"
                 "gemm:\n"
                 "  common: &shared {repeats: 3, dtypes: [bf16, fp8]}\n"
                 "  smoke:\n"
                 "    <<: *shared\n"
                 "    repeats: 4\n"
                 "    shapes: [[16, 16, 16]]\n"
                 "  full: {<<: *shared, shapes: [[64, 64, 64]]}\n")
    raw = config.load_params(p)
    assert raw["gemm"]["smoke"] == {"repeats": 4, "dtypes": ["bf16", "fp8"],
                                    "shapes": [[16, 16, 16]]}
    assert raw["gemm"]["full"] == {"repeats": 3, "dtypes": ["bf16", "fp8"],
                                   "shapes": [[64, 64, 64]]}
    p.write_text(p.read_text().replace("    repeats: 4\n", "    repeats: 4\n    repeats: 5\n"))
    with pytest.raises(ConfigError, match=r"params.yaml: repeats: duplicate key \(lines 6 and 7"):
        config.load_params(p)
    p.write_text("profile: smoke\ngemm:\n  smoke: {<<: 3}\n")
    with pytest.raises(ConfigError) as e:
        config.load_params(p)
    assert "malformed YAML (line 3, column" in str(e.value) and "merge" in str(e.value)


# --------------------------------------------------------------------- seeds, once each

REPO_PARAMS = yaml.safe_load((__import__("pathlib").Path(__file__).resolve().parent.parent
                              / "params.yaml").read_text())


def _with(path: list, value):
    import copy

    data = copy.deepcopy(REPO_PARAMS)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


@pytest.mark.parametrize("path, value, says", [
    (["inference", "smoke", "seeds"], [0, -1],
     "inference.smoke.seeds: -1 is negative: seeds are integers >= 0"),
    (["inference", "full", "seeds"], [0, 1, 0],
     "inference.full.seeds: 0 given twice: give each seed once"),
    (["lm", "smoke", "runs", 0, "seeds"], [1, 1], "lm.smoke.runs[0].seeds: 1 given twice"),
    (["legged", "full", "peer", "seeds"], [3, -3],
     "legged.full.peer.seeds: -3 is negative"),
    (["rl_purejaxrl", "full", "seeds"], [1, 1024, 1024],
     "rl_purejaxrl.full.seeds: 1024 given twice"),
    (["rl_quality", "full", "seeds"], -4, "rl_quality.full.seeds: -4: a count of seeds is an "
     "integer >= 1"),
    (["inference", "smoke", "seeds"], [0, 1.5], "inference.smoke.seeds: 1.5 is not an integer"),
    (["legged", "full", "peer", "seed"], -1, "legged.full.peer.seed: -1 is negative"),
])
def test_negative_duplicate_or_fractional_seeds_are_refused_naming_the_key(tmp_path, path,
                                                                          value, says):
    """A seed given twice would run (and count) one run twice; a negative one wraps around
    where seeds become unsigned keys. Every ``seeds`` of params.yaml is checked, whatever
    section it is in."""
    p = tmp_path / "params.yaml"
    p.write_text(yaml.safe_dump(_with(path, value)))
    with pytest.raises(ConfigError) as e:
        config.load_params(p)
    assert str(e.value).startswith(f"params.yaml: {says}"), str(e.value)


def test_the_repository_seeds_pass_and_a_count_of_seeds_is_a_count():
    assert config.load_params()["rl_quality"]["full"]["seeds"] > 0
