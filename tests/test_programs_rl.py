"""Program fingerprints of the RL studies (rl_throughput, rl_quality, rl_purejaxrl, legged).

For each study, at smoke sizes on the CPU (traced for the H200, as records are checked):
the programs are deterministic (a second build from a record's settings traces to the same
hash), a change stales exactly the programs that run it (the PPO loss: every PPO program of
the four studies and no other, nor mlp_step's; one recipe's settings: that recipe's cells
only), and ``program_settings`` of a record the study makes gives back its cell's program.
Records come from the studies' own cell functions with the device work (compiling, timing,
training) stubbed out, so their sizes and extras are what a real run writes.

Each PPO trace costs a few CPU seconds, so the unchanged programs are traced once
(:func:`base`) and shared by the tests.
"""

from __future__ import annotations

import ast
import builtins
import dataclasses
import inspect
import textwrap

import jax.numpy as jnp
import numpy as np
import pytest

from repro import program as P
from repro import results, studies
from repro.experiments.legged import cells as LC
from repro.experiments.legged import measure as L
from repro.experiments.rl_purejaxrl import measure as J
from repro.experiments.rl_quality import measure as Q
from repro.experiments.rl_throughput import measure as T
from repro.models import ppo_core
from repro.precision import recipes as R

TARGET = ("gpu", "NVIDIA H200")


def fingerprint(prog: P.Program) -> tuple[str, str]:
    t = P.trace(prog, *TARGET)
    return t.hash, t.kit


def legged_params() -> dict:
    """legged's smoke section with a speed cell (the smoke profile has none)."""
    p = dict(studies.params("legged", "smoke"))
    p["speed"] = {"num_envs": 16, "updates": 2, "repeats": 1, "sizes": ["brax"],
                  "recipes": ["bf16"]}
    return p


_CELLS: dict[str, dict] = {}


def cells(experiment: str) -> dict:
    if experiment not in _CELLS:
        p = legged_params() if experiment == "legged" else \
            studies.params(experiment, "smoke")
        _CELLS[experiment] = {c.name: c for c in studies.study(experiment).cells(p)}
    return _CELLS[experiment]


def prog(experiment: str, cell: str, key: str = "") -> P.Program:
    return cells(experiment)[cell].programs()[key]


_BASE: dict[tuple, tuple[str, str]] = {}


def base(experiment: str, cell: str, key: str = "") -> tuple[str, str]:
    """The fingerprint of a cell's program as the code is (traced once per session)."""
    if (experiment, cell, key) not in _BASE:
        _BASE[experiment, cell, key] = fingerprint(prog(experiment, cell, key))
    return _BASE[experiment, cell, key]


def called_with(study, experiment: str, cell: str, key: str = "") -> dict:
    """The arguments the cell's ``programs()`` passes to ``study.program`` for ``key``, with
    the defaults filled in (what :func:`bound` gives for a record's settings)."""
    seen = {}
    real = study.program

    def spy(*a, **k):
        out = real(*a, **k)
        seen[id(out)] = bound(real, *a, **k)
        return out

    study.program = spy
    try:
        made = cells(experiment)[cell].programs()[key]
    finally:
        study.program = real
    return seen[id(made)]


def bound(program, *a, **k) -> dict:
    """``program``'s arguments, defaults filled in."""
    b = inspect.signature(program).bind(*a, **k)
    b.apply_defaults()
    return {n: tuple(v) if isinstance(v, list) else v for n, v in b.arguments.items()}


def distinct(recs, settings_of):
    """One record per distinct settings."""
    return list({repr(sorted(settings_of(r).items())): r for r in recs}.values())


def unclipped_value_loss(values, batch, targets, c):
    """PPO's value loss without its clipping: a change to one term of the loss."""
    return 0.5 * jnp.mean(jnp.square(values - targets))


def fake_metrics(seeds: int, updates: int) -> dict[str, np.ndarray]:
    shape = (seeds, updates)
    return {"episode_return": np.arange(np.prod(shape), dtype=np.float32).reshape(shape),
            "episodes": np.ones(shape, np.int32), "skipped": np.zeros(shape, np.int32),
            "loss_scale": np.ones(shape, np.float32),
            "nonfinite_params": np.zeros(shape, bool)}


class _Compiled:
    def lower(self, *a):
        return self

    def compile(self):
        return self


class _Timing:
    median_s, iqr_s, samples = 0.1, 0.01, (0.1, 0.1)


# ------------------------------------------------------------------------- rl_throughput


def test_throughput_records_find_their_cells_program(monkeypatch):
    p = studies.params("rl_throughput", "smoke")
    import types

    import jax

    monkeypatch.setattr(T, "jax", types.SimpleNamespace(
        jit=lambda f, **k: _Compiled(), random=jax.random, devices=jax.devices))
    monkeypatch.setattr(T, "update_program", lambda c: (_Compiled(), (), 0.0))
    monkeypatch.setattr(T, "_time_fn", lambda fn, *a, repeats, warmup=1: (0.1, 0.01, [0.1]))
    monkeypatch.setattr(T, "compiled_facts", lambda c: {
        "fp8_gemm_calls": 0, "fp8_lowering": "none", "memory_bytes": 1024})
    recs = T.throughput_cell("mlp", 64, "fp16", 8, p)
    monkeypatch.undo()
    assert {r["metric"] for r in recs} == {"env_steps_per_s", "update_time_ms",
                                           "update_memory_bytes"}
    assert set(cells("rl_throughput")["mlp_w64_fp16_e8"].programs()) == {"fp16"}
    assert {r["recipe"] for r in recs} == {"fp16"}  # each record finds its recipe's key
    (rec,) = distinct(recs, T.program_settings)  # all three: one program
    assert fingerprint(T.program(**T.program_settings(rec))) == \
        base("rl_throughput", "mlp_w64_fp16_e8", "fp16")


def test_throughput_stores_programs_follow_the_registry_facts_of_their_family(monkeypatch):
    store = cells("rl_throughput")["stores"]
    recs = store.run(None)

    def fps():
        return {k: fingerprint(v) for k, v in store.programs().items()}

    before = fps()
    assert {r["recipe"] for r in recs} == set(before)  # a program per recipe family
    for r in recs:  # each record's settings give its cell's program
        assert fingerprint(T.program(**T.program_settings(r))) == before[r["recipe"]]
    assert fps() == before
    # FP8 gradients in E4M3: the fp8-delayed family's stores change, no other family's
    orig = R.REGISTRY["fp8-delayed"]
    monkeypatch.setitem(R.REGISTRY, "fp8-delayed", orig.replace(bwd_dtype="float8_e4m3fn"))
    after = fps()
    assert {k for k in before if before[k] != after[k]} == {"fp8-delayed"}
    # a setting no store depends on (the amax history) changes none of them
    monkeypatch.setitem(R.REGISTRY, "fp8-delayed", orig.replace(amax_history_len=7))
    assert fps() == before


def test_one_recipes_change_stales_only_its_throughput_cells(monkeypatch):
    names = {"mlp_w64_fp16_e8": "fp16", "mlp_w64_fp8-delayed_e8": "fp8-delayed"}
    before = {n: base("rl_throughput", n, k) for n, k in names.items()}
    monkeypatch.setitem(R.REGISTRY, "fp8-delayed",
                        R.REGISTRY["fp8-delayed"].replace(amax_history_len=7))
    after = {n: fingerprint(prog("rl_throughput", n, k)) for n, k in names.items()}
    assert [n for n in names if before[n] != after[n]] == ["mlp_w64_fp8-delayed_e8"]


# ---------------------------------------------------------------------------- rl_quality


def test_quality_records_and_their_repeat_copies_find_their_cells_programs(monkeypatch):
    p = studies.params("rl_quality", "smoke")
    monkeypatch.setattr(Q, "run_seeds", lambda c, seeds: fake_metrics(len(seeds),
                                                                       c.num_updates))
    monkeypatch.setattr(Q, "random_return", lambda env: 21.0)
    monkeypatch.setattr(Q, "seeds_runner", lambda c: lambda seeds: fake_metrics(
        len(seeds), c.num_updates))
    env = "CartPole-v1"
    made = {f"{env}_fp32": Q.quality_cell(env, "fp32", p),
            f"{env}_fp8-delayed": Q.quality_cell(env, "fp8-delayed", p),
            f"{env}_random": Q.random_cell(env, p),
            f"{env}_determinism_fp8-e2e": Q.determinism_cell(env, "fp8-e2e", p)}
    monkeypatch.undo()
    for name, recs in made.items():
        assert set(cells("rl_quality")[name].programs()) == {""}  # one program per cell
        (rec,) = distinct(recs, Q.program_settings)
        assert bound(Q.program, **Q.program_settings(rec)) == called_with(Q, "rl_quality", name)
    # the same settings, the same program: built and traced again
    for name in (f"{env}_fp32", f"{env}_random"):
        st = Q.program_settings(made[name][0])
        assert fingerprint(Q.program(**st)) == base("rl_quality", name)
    # the determinism cell's statistic is another kit
    det = cells("rl_quality")[f"{env}_determinism_fp8-e2e"].programs()[""]
    e2e = cells("rl_quality")[f"{env}_fp8-e2e"].programs()[""]
    assert P.kit_hash(det.kit) != P.kit_hash(e2e.kit)
    # rl_quality_repeat holds copies of rl_quality records (their experiment: rl_quality):
    # a copy's settings are its cell's, whatever folder holds it
    rec = made[f"{env}_fp8-delayed"][1]
    assert rec["experiment"] == "rl_quality"
    assert Q.program_settings(dict(rec)) == \
        Q.program_settings(made[f"{env}_fp8-delayed"][0])
    # a record made with other PPO settings than params.yaml's has no derivable program
    assert Q.program_settings({**rec, "sizes": {**rec["sizes"], "num_envs": 5}}) is None


def test_the_clip_coefficient_is_in_the_quality_program():
    st = Q.program_settings(results.make_record(
        "rl_quality", "final_return", 1.0, "return", recipe="fp32", profile="smoke",
        sizes={"env": "CartPole-v1", "variant": "fp32", "seeds": 3}))
    st["ppo_config"] = {**st["ppo_config"], "clip_eps": 0.25}
    assert fingerprint(Q.program(**st))[0] != base("rl_quality", "CartPole-v1_fp32")[0]


# -------------------------------------------------------------------------- rl_purejaxrl


@pytest.mark.slow  # records a PureJaxRL cell end to end
def test_purejaxrl_cells_carry_our_program_and_records_find_it():
    p = studies.params("rl_purejaxrl", "smoke")
    assert set(cells("rl_purejaxrl")) == {"CartPole-v1_s1", "CartPole-v1_s1_unroll-8"}
    assert set(cells("rl_purejaxrl")["CartPole-v1_s1"].programs()) == {""}
    # the option set is ours: another program
    assert base("rl_purejaxrl", "CartPole-v1_s1") != \
        base("rl_purejaxrl", "CartPole-v1_s1_unroll-8")
    opts = {"unroll": 8}
    name = J.label(opts)
    facts = {"purejaxrl": {"final_returns": None}, name: {"final_returns": None}}
    first = {impl: {"first_result_s": 1.0, "compile_s": 0.5, "process_s": 2.0}
             for impl in ("purejaxrl", name)}
    recs = J._records(p, [], 1, name, {"purejaxrl": [1.0], name: [1.0]}, facts, opts, 1,
                      first)
    settings = []
    for r in recs:
        st = J.program_settings(r)
        if st is None:  # PureJaxRL's first_result_s record: only its cell's name says
            assert (r["extra"]["impl"], r["metric"]) == ("purejaxrl", "first_result_s")
            st = J.program_settings({**r, "program": {"cell": "CartPole-v1_s1_unroll-8"}})
        settings.append(st)
    assert all(st == settings[0] for st in settings) and settings[0]["options"] == opts
    assert fingerprint(J.program(**settings[0])) == \
        base("rl_purejaxrl", "CartPole-v1_s1_unroll-8")
    # option sets parse back from cell names, underscores in names and values included
    rec = {**recs[0], "extra": {"config": recs[0]["extra"]["config"]},
           "program": {"cell": "CartPole-v1_s1024_prng-unsafe_rbg_unroll-8_update_unroll-4"
                               "_run2"}}
    assert J.program_settings(rec)["options"] == {"prng": "unsafe_rbg", "unroll": 8,
                                                  "update_unroll": 4}


# -------------------------------------------------------------------------------- legged


def test_legged_records_find_their_cells_programs(monkeypatch):
    p = legged_params()
    assert set(cells("legged")) == {"ant_physics_e16_default", "ant_speed_brax_bf16",
                                    "ant_quality_brax_fp32", "ant_quality_brax_fp8-delayed"}
    assert set(cells("legged")["ant_speed_brax_bf16"].programs()) == {"bf16"}

    class FakeEnv:  # no brax, no MJX
        obs_size, action_size, env = 27, 8, None

    one_seed = {k: v[0] for k, v in fake_metrics(1, 4).items()}
    monkeypatch.setattr(L.pc, "make_env", lambda c: FakeEnv())
    monkeypatch.setattr(LC, "compile_", lambda p, fn, *a: (lambda k: one_seed, 0.0))
    quality = L.quality_cell(p, "ant", "brax", "fp32", p["profile"])
    monkeypatch.setattr(LC, "time_fn", lambda fn, *a, repeats, warmup=1: _Timing())
    monkeypatch.setattr(LC, "speed_parts", lambda p, c, env, r: (0.01, _Timing(), None))
    monkeypatch.setattr(LC, "_emulated", lambda r, c: (False, {
        "fp8_lowering": "none", "fp8_gemm_calls": 0, "memory_bytes": 1}))
    speed = L.speed_cell(p, "ant", "brax", "bf16", p["profile"])
    monkeypatch.setattr(LC, "compile_", lambda p, fn, *a: (
        lambda k: (np.zeros(16), np.zeros(16, bool)), 0.0))
    monkeypatch.setattr(LC, "matmul_facts", lambda env, n: {})
    physics = L.physics_cell(p, "ant", 16, "default", p["profile"])
    monkeypatch.undo()
    for name, recs, key in (("ant_quality_brax_fp32", quality, ""),
                            ("ant_speed_brax_bf16", speed, "bf16"),
                            ("ant_physics_e16_default", physics, "")):
        (rec,) = distinct(recs, L.program_settings)
        assert bound(L.program, **L.program_settings(rec)) == called_with(L, "legged", name, key)
    # the same settings, the same program: built and traced again
    assert fingerprint(L.program(**L.program_settings(quality[0]))) == \
        base("legged", "ant_quality_brax_fp32")
    # a record of another training length than params.yaml's keeps its own (stale)
    r = quality[0]
    longer = {**r, "sizes": {**r["sizes"], "total_timesteps": 2 * r["sizes"]
                             ["total_timesteps"]}}
    assert L.program_settings(longer)["config"]["total_timesteps"] == \
        2 * L.program_settings(r)["config"]["total_timesteps"]


def test_legged_programs_leave_the_physics_out_but_track_its_adapter():
    t = P.trace(prog("legged", "ant_physics_e16_default"), *TARGET)
    assert "repro/models/envs.py" in t.files  # an edit to the adapter retraces
    assert not any("brax" in f or "mujoco" in f for f in t.files)
    # the physics' settings are in the program: its precision and its time limit
    p = legged_params()
    st = L.cell_settings(p, "ant", "physics", num_envs=16, precision="default")
    assert fingerprint(L.program(**st)) == (t.hash, t.kit)
    high = L.cell_settings(p, "ant", "physics", num_envs=16, precision="highest")
    assert fingerprint(L.program(**high))[0] != t.hash
    cfg = dict(st["config"], episode_length=st["config"]["episode_length"] + 1)
    assert fingerprint(L.program(**{**st, "config": cfg}))[0] != t.hash
    assert dataclasses.asdict(L.pc.validate(st["config"])) == st["config"]  # plain data


# ------------------------------------------------------------- the PPO loss, everywhere


@pytest.mark.slow
def test_a_change_to_the_ppo_loss_stales_every_ppo_program_and_nothing_else(monkeypatch):
    from repro.experiments.mlp_step import measure as mlp_step

    ppo_progs = [("rl_throughput", "mlp_w64_fp8-delayed_e8", "fp8-delayed"),
                 ("rl_quality", "CartPole-v1_fp32", ""),
                 ("rl_purejaxrl", "CartPole-v1_s1_unroll-8", ""),
                 ("legged", "ant_speed_brax_bf16", "bf16"),
                 ("legged", "ant_quality_brax_fp32", "")]
    others = [("rl_throughput", "stores", "bf16"), ("rl_quality", "CartPole-v1_random", ""),
              ("legged", "ant_physics_e16_default", "")]
    before = {k: base(*k) for k in ppo_progs + others}
    mlp = fingerprint(mlp_step.program("bf16", 64, 32, 2))
    monkeypatch.setattr(ppo_core, "value_loss", unclipped_value_loss)
    after = {k: fingerprint(prog(*k)) for k in ppo_progs + others}
    assert {k for k in before if before[k][0] != after[k][0]} == set(ppo_progs)
    assert {k: after[k][1] for k in before if before[k][1] != after[k][1]} == {}  # same kits
    assert fingerprint(mlp_step.program("bf16", 64, 32, 2)) == mlp


# ----------------------------------------------------------------------------- settings


def test_settings_of_foreign_records_are_none():
    junk = {"metric": "x", "sizes": {}, "extra": {}}
    for study in (T, Q, J, L):
        assert study.program_settings(junk) is None, study.__name__


@pytest.mark.parametrize("study", [T, Q, J, L], ids=lambda m: m.__name__.rsplit(".", 1)[1])
def test_program_names_only_names_of_its_module(study):
    """``program`` is self-contained: the names it reads are its own, builtins or its
    module's (so it can be exec'd against an older version of the module); ``Program`` is
    imported inside it (older modules do not import it)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(study.program)))
    bound = {a.arg for a in ast.walk(tree) if isinstance(a, ast.arg)}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
              and isinstance(n.ctx, ast.Store)}
    bound |= {a.asname or a.name.split(".")[0] for n in ast.walk(tree)
              if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    used = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)
            and isinstance(n.ctx, ast.Load)}
    free = used - bound - set(dir(builtins))
    assert not {n for n in free if not hasattr(study, n)}
    assert "Program" not in free
