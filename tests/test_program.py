"""Program fingerprints (repro.program): a record goes stale when the program it measured
changes, and only then.

Each scenario copies the package and params.yaml into a checkout of its own, fingerprints
mlp_step records of five recipes there (a fresh process), edits one file, and asks a second
fresh process which records are stale. With the old rule (a hash of every source file on the
study's import path) every edit below would stale every record.
"""

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from repro import program as P
from repro import checkout

REAL = checkout.CHECKOUT
RECIPES = ["bf16", "fp16", "fp32", "fp8-delayed", "fp8-current"]
CELL = "w64_b32_d2"


def _run(root: Path, code: str) -> str:
    env = {**os.environ, "PYTHONPATH": str(root), "JAX_PLATFORMS": "cpu",
           "REPRO_ROOT": str(root)}
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=root, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    """A checkout with mlp_step records of RECIPES, each stamped with its program."""
    root = tmp_path_factory.mktemp("checkout")
    shutil.copytree(REAL / "repro", root / "repro",
                    ignore=shutil.ignore_patterns("__pycache__"))
    for f in ("params.yaml", "requirements.lock", "dvc.yaml"):
        shutil.copy(REAL / f, root / f)
    (root / "results").mkdir()
    import yaml

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["mlp_step"]["smoke"] = {"batch": 32, "widths": [64], "repeats": 2,
                                   "recipes": RECIPES}
    params["mlp_step"]["common"]["depth"] = 2
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    _run(root, f"""
        import json
        from repro import hardware, results, studies
        from repro.studies import runner
        s = studies.study("mlp_step")
        (cell,) = [c for c in s.cells(studies.params("mlp_step", "smoke")) if c.name == "{CELL}"]
        recs = [results.make_record("mlp_step", "step_time_ms", 1.0, "ms", recipe=r,
                                    profile="smoke", sizes=dict(width=64, batch=32, depth=2),
                                    hardware=hardware.lookup("h200")) for r in {RECIPES!r}]
        with hardware.target("gpu", "NVIDIA H200"):
            recs = runner.stamp_programs(recs, cell, results.results_dir(), s)
        json.dump(recs, open("records.json", "w"))
        print("ok")
        """)
    return root


def stale_after(base: Path, tmp_path: Path, edit) -> dict[str, bool]:
    """{recipe: stale} after ``edit(checkout)`` in a copy of ``base``."""
    root = tmp_path / "edited"
    shutil.copytree(base, root)
    edit(root)
    out = _run(root, """
        import json
        from repro import studies
        c = studies.checker()
        recs = json.load(open("records.json"))
        print(json.dumps({r["recipe"]: c(r).stale for r in recs}))
        """)
    return json.loads(out)


def replace(root: Path, rel: str, old: str, new: str) -> None:
    path = root / rel
    text = path.read_text()
    assert old in text, f"{rel}: {old!r} not found"
    path.write_text(text.replace(old, new, 1))


def test_the_records_are_fresh_as_made(base, tmp_path):
    assert stale_after(base, tmp_path, lambda root: None) == dict.fromkeys(RECIPES, False)


@pytest.mark.parametrize("what, edit", [
    ("a docstring of a measured function", lambda root: replace(
        root, "repro/precision/scaling.py", '"""Push `amax` into the history',
        '"""Pushes `amax` into the history')),
    ("an error message of a measured function", lambda root: replace(
        root, "repro/precision/scaling.py", 'f"delayed_update: algo must be one of',
        'f"delayed_update: the algo must be one of')),
    ("config checking", lambda root: replace(
        root, "repro/config.py", 'expected a mapping at the top level',
        'expected a mapping (key: value) at the top level')),
    ("a recipe's about text", lambda root: replace(
        root, "repro/precision/recipes.py", "amax history of 1024 steps)",
        "amax history of 1024 steps).")),
    ("a new recipe", lambda root: replace(
        root, "repro/precision/recipes.py", '    Recipe("fp8-noscale",',
        '    Recipe("fp8-delayed-16", base="fp8-delayed", gemm="fp8", scaling="delayed",'
        ' **_BF16, amax_history_len=16, about="a short history"),\n    Recipe("fp8-noscale",')),
    ("a new lever variant", lambda root: replace(
        root, "params.yaml", "levers: []", "levers: ['fp8-delayed:amax_history_len=16']")),
])
def test_edits_outside_the_programs_stale_nothing(base, tmp_path, what, edit):
    assert stale_after(base, tmp_path, edit) == dict.fromkeys(RECIPES, False), what


def test_changing_delayed_scaling_stales_exactly_the_delayed_records(base, tmp_path):
    def edit(root):
        replace(root, "repro/precision/scaling.py",
                "ok = jnp.isfinite(a) & (a > 0)", "ok = jnp.isfinite(a) & (a > 1e-30)")

    stale = stale_after(base, tmp_path, edit)
    assert stale == {**dict.fromkeys(RECIPES, False), "fp8-delayed": True}


def test_changing_the_fp8_cast_stales_the_fp8_records_only(base, tmp_path):
    def edit(root):
        # the native FP8 cast of every FP8 GEMM operand; BF16/FP16/FP32 never call it
        replace(root, "repro/precision/formats.py",
                "return jnp.clip(y, -fmax, fmax).astype(dtype)",
                "return jnp.clip(y + 0.0, -fmax, fmax).astype(dtype)")

    stale = stale_after(base, tmp_path, edit)
    assert stale == {"bf16": False, "fp16": False, "fp32": False, "fp8-delayed": True,
                     "fp8-current": True}


def test_a_stale_record_says_which_program_and_the_first_differing_line(base, tmp_path):
    root = tmp_path / "edited"
    shutil.copytree(base, root)
    replace(root, "repro/precision/scaling.py",
            "ok = jnp.isfinite(a) & (a > 0)", "ok = jnp.isfinite(a) & (a > 1e-30)")
    out = _run(root, """
        import json
        from repro import studies
        recs = json.load(open("records.json"))
        (r,) = [r for r in recs if r["recipe"] == "fp8-delayed"]
        print(json.dumps(studies.checker()(r).reason))
        """)
    reason = json.loads(out)
    # the first differing line is named from committed texts only (the note must read alike
    # on every machine); HEAD's text of this edit is not committed
    assert "its program (fp8-delayed) changed" in reason
    assert "first difference" not in reason


def test_canonical_text_has_no_addresses_and_hashes_constants():
    import jax
    import jax.numpy as jnp
    import numpy as np

    table = np.arange(8, dtype=np.float32)

    def f(x):
        return x * jnp.asarray(table)[: x.shape[0]]

    a = P.trace(P.Program(f, (jax.ShapeDtypeStruct((4,), jnp.float32),)), "cpu")
    table[0] = 1.0  # the same program with another captured constant
    b = P.trace(P.Program(f, (jax.ShapeDtypeStruct((4,), jnp.float32),)), "cpu")
    assert " at 0x" not in a.text
    assert a.hash != b.hash
    assert P.trace(P.Program(f, (jax.ShapeDtypeStruct((4,), jnp.float32),)), "cpu").hash \
        == b.hash


def test_the_kit_hash_ignores_docstrings_not_code():
    def timing_a(x):
        """Doc."""
        return x + 1

    def timing_b(x):
        """Another doc."""
        return x + 1

    def timing_c(x):
        return x + 2

    ka, kb, kc = (P.kit_hash([f]) for f in (timing_a, timing_b, timing_c))
    assert ka != kc
    # the function's name is part of its source: same body, different name, different hash
    assert P.kit_hash([timing_a]) == P.kit_hash([timing_a]) and kb != kc


def test_the_target_switch_chooses_code_paths_for_the_traced_device():
    from repro import hardware
    from repro.precision import kernels

    assert not kernels.fits((128, 256))  # this CPU
    with hardware.target("gpu", "NVIDIA H200"):
        assert hardware.platform() == "gpu" and hardware.device_kind() == "NVIDIA H200"
        assert kernels.fits((128, 256))
    assert hardware.platform() == "cpu"


def test_a_params_yaml_section_is_part_of_a_programs_files(base, tmp_path):
    """A setting a cell reads from params.yaml but no traced file holds (a learning rate)
    must send the check to a retrace: what a run of the record's profile reads of the
    section (its ``common`` part and that profile's) is hashed among the program's files;
    an edit of another profile is not."""
    recs = json.loads((base / "records.json").read_text())
    assert "params.yaml#mlp_step@smoke" in recs[0]["program"]["files"]
    import yaml

    def check_after(key, value):
        root = tmp_path / f"edited-{key}"
        shutil.copytree(base, root)
        params = yaml.safe_load((root / "params.yaml").read_text())
        params["mlp_step"][key]["repeats"] = value  # not part of the program
        (root / "params.yaml").write_text(yaml.safe_dump(params))
        return json.loads(_run(root, """
            import json
            from repro import studies
            c = studies.checker()
            recs = json.load(open("records.json"))
            p = recs[0]["program"]
            print(json.dumps([c.unchanged(p["files"], p["python"]), c(recs[0]).stale,
                              c.traced]))
            """))

    # the records' own profile: retraced, the same program, fresh
    unchanged, stale, traced = check_after("smoke", 3)
    assert (unchanged, stale) == (False, False) and traced >= 1
    # another profile: nothing to retrace
    assert check_after("full", 7) == [True, False, 0]
