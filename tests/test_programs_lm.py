"""Program fingerprints of the GEMM, LM, inference, multi-device and kernel-trace studies
(``program(**settings)`` / ``program_settings(rec)`` of repro.experiments.gemm.measure,
lm_step, lm_quality, inference, multigpu and kernel_times), at smoke sizes, in this process.

For each study: its cells' programs trace deterministically; a change to one recipe's cast
(monkeypatched here: a function only that recipe's programs call) changes exactly that
recipe's programs; and ``program_settings`` of a record gives the program of the record's
cell. JAX's tracing caches and the package's ``functools`` caches are emptied around every
patch: a cached trace would hide it.
"""

import contextlib
import dataclasses
import functools
import json
import os
import subprocess
import sys
import textwrap

import pytest

from repro import program as P
from repro import checkout, studies

PLATFORM, KIND = "gpu", "NVIDIA H200"


def clear_caches() -> None:
    import jax

    jax.clear_caches()
    for name, mod in list(sys.modules.items()):
        if not name.startswith("repro") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, functools._lru_cache_wrapper):
                obj.cache_clear()


@contextlib.contextmanager
def patched(obj, name: str, wrap):
    """``obj.name`` replaced by ``wrap(original)`` inside the block, caches emptied around."""
    original = getattr(obj, name)
    setattr(obj, name, wrap(original))
    clear_caches()
    try:
        yield
    finally:
        setattr(obj, name, original)
        clear_caches()


def text(prog, platform: str = PLATFORM, kind: str = KIND) -> str:
    """The canonical text ``repro.program.trace`` hashes, without the files its trace ran
    (several times faster; :func:`test_fingerprint_is_the_traced_hash` checks they agree)."""
    import jax

    from repro import hardware

    with hardware.target(platform, kind):
        closed = jax.make_jaxpr(prog.fn)(*prog.args)
    return P.canonical(closed)


def fingerprint(prog) -> str:
    return P.text_hash(text(prog))


def hashes(programs: dict, keys=None) -> dict[str, str]:
    return {k: fingerprint(programs[k]) for k in (keys or programs)}


def cell_programs(cells, name: str, keys=None) -> dict[str, str]:
    (cell,) = [c for c in cells if c.name == name]
    return hashes(cell.programs(), keys)


def doubled_input(f):
    """A cast that scales its input first: the same signature, another program."""
    def g(x, *a, **k):
        return f(x * 2, *a, **k)
    return g


def changed(before: dict, after: dict) -> set[str]:
    assert before.keys() == after.keys()
    return {k for k in before if before[k] != after[k]}


# ----------------------------------------------------------------------------------- gemm


def gemm_cells():
    from repro.experiments.gemm import measure as gemm

    p = gemm.Params(profile="smoke", shapes=((64, 32, 16),), repeats=1,
                    error_shape=(32, 32, 32))
    return gemm, gemm.cells(p)


def test_fingerprint_is_the_traced_hash():
    from repro.experiments.gemm import measure as gemm

    prog = gemm.program("fp8", 64, 32, 16)
    traced = P.trace(prog, PLATFORM, KIND)
    assert fingerprint(prog) == traced.hash
    assert "repro/experiments/gemm/measure.py" in traced.files
    assert "repro/precision/formats.py" in traced.files


def test_gemm_programs_are_deterministic_and_differ_by_dtype():
    gemm, cells = gemm_cells()
    a, b = (cell_programs(cells, "64x32x16") for _ in range(2))
    assert a == b
    assert set(a) == set(gemm.GEMM_DTYPES) and len(set(a.values())) == len(a)  # tf32 != fp32
    err = cell_programs(cells, "rel_error_32x32x32")
    assert not set(err.values()) & set(a.values())


def test_gemm_fp8_quantize_stales_only_the_fp8_keys():
    from repro.precision import formats

    _, cells = gemm_cells()
    before = {c: cell_programs(cells, c) for c in ("64x32x16", "rel_error_32x32x32")}
    with patched(formats, "fp8_quantize", doubled_input):
        after = {c: cell_programs(cells, c) for c in before}
    for c in before:
        assert changed(before[c], after[c]) == {"fp8"}, c


def test_gemm_program_settings_give_the_cells_program():
    gemm, cells = gemm_cells()
    for cell, metric, (m, k, n) in (("64x32x16", "tflops", (64, 32, 16)),
                                    ("rel_error_32x32x32", "rel_error", (32, 32, 32))):
        want = cell_programs(cells, cell, ["fp8", "bf16"])
        for r in ("fp8", "bf16"):
            rec = {"experiment": "gemm", "metric": metric, "recipe": r,
                   "sizes": {"M": m, "K": k, "N": n}, "profile": "smoke"}
            s = gemm.program_settings(rec)
            assert fingerprint(gemm.program(**s)) == want[r], (cell, r)
    assert gemm.program_settings({"recipe": "fp8", "sizes": {"M": 1}}) is None


# -------------------------------------------------------------------------------- lm_step


LM_STEP_RECIPES = ("bf16", "fp8-delayed", "fp8-current")


def lm_step_cells():
    from repro.experiments.lm_step import measure as lm_step

    p = lm_step.Params(profile="smoke", sizes=("tiny",), batch=2, recipes=LM_STEP_RECIPES,
                       repeats=1)
    return lm_step, lm_step.cells(p)


def test_lm_step_programs_are_deterministic_and_the_fp8_cast_stales_only_fp8():
    from repro.precision import formats

    _, cells = lm_step_cells()
    before = cell_programs(cells, "tiny_b2")
    assert before["bf16"] == cell_programs(cells, "tiny_b2", ["bf16"])["bf16"]
    assert len(set(before.values())) == len(LM_STEP_RECIPES)
    with patched(formats, "fp8_cast", doubled_input):
        after = cell_programs(cells, "tiny_b2")
    assert changed(before, after) == {"fp8-delayed", "fp8-current"}


def test_lm_step_program_is_the_gpu_step_with_cudnn_attention():
    lm_step, _ = lm_step_cells()
    gpu = text(lm_step.program("bf16", "tiny", 2))
    assert "dot_product_attention_fwd_wrapper" in gpu  # what the H200 ran, traced on a CPU
    assert "dot_product_attention_fwd_wrapper" not in text(lm_step.program("bf16", "tiny", 2),
                                                           "cpu", "")


def test_lm_step_program_settings_give_the_cells_program():
    lm_step, cells = lm_step_cells()
    want = cell_programs(cells, "tiny_b2", ["fp8-delayed"])
    rec = {"experiment": "lm_step", "metric": "step_time_ms", "recipe": "fp8-delayed",
           "sizes": {"model": "tiny", "batch": 2, "seq_len": 128}, "profile": "smoke"}
    s = lm_step.program_settings(rec)
    assert fingerprint(lm_step.program(**s)) == want["fp8-delayed"]
    other = lm_step.program_settings({**rec, "sizes": {"model": "tiny", "batch": 4}})
    assert fingerprint(lm_step.program(**other)) != want["fp8-delayed"]


# ------------------------------------------------------------------------------------ lm


def lm_cells(variants=("bf16", "fp8-delayed")):
    from repro.experiments.lm import measure as lm_quality

    p = studies.params("lm", "smoke")
    runs = tuple(dataclasses.replace(r, steps=20, seeds=(0, 1)) for r in p.runs)
    p = dataclasses.replace(p, runs=runs, variants=variants)
    return lm_quality, p, lm_quality.cells(p)


def test_lm_training_programs_are_deterministic_and_the_fp8_cast_stales_only_fp8():
    from repro.precision import formats

    _, _, cells = lm_cells()
    names = ["tiny_bf16_s0", "tiny_fp8-delayed_s0", "tiny_bf16_memory",
             "tiny_fp8-delayed_memory"]
    before = {n: cell_programs(cells, n) for n in names}
    assert before["tiny_fp8-delayed_s0"] == cell_programs(cells, "tiny_fp8-delayed_s0")
    # the seed is part of a trained function's program, as are the settings
    assert cell_programs(cells, "tiny_bf16_s1") != before["tiny_bf16_s0"]
    with patched(formats, "fp8_cast", doubled_input):
        after = {n: cell_programs(cells, n) for n in names}
    assert {n for n in names if before[n] != after[n]} == {"tiny_fp8-delayed_s0"}


def test_lm_memory_program_is_the_stored_bytes():
    lm_quality, _, cells = lm_cells(("bf16", "nvfp4"))
    before = cell_programs(cells, "tiny_nvfp4_memory")
    with patched(lm_quality, "tensor_bytes", lambda f: lambda *a: f(*a) + 1):
        assert cell_programs(cells, "tiny_nvfp4_memory") != before


def test_lm_trained_program_holds_its_data():
    from repro.models import lm_data

    _, _, cells = lm_cells(("bf16",))
    before = cell_programs(cells, "tiny_bf16_s0")
    with patched(lm_data, "load_splits", lambda f: lambda *a: lm_data.split(
            f(*a).train[::-1], source="reversed")):
        assert cell_programs(cells, "tiny_bf16_s0") != before


def test_lm_program_settings_give_the_cells_program():
    from repro.experiments.lm import measure as lm_quality

    p = studies.params("lm", "smoke")
    cells = lm_quality.cells(p)
    (run,) = lm_quality.plan(p)
    cfg = lm_quality.M.get_config(run.size)
    train = {"experiment": "lm", "metric": "final_eval_loss", "recipe": "fp8-delayed",
             "profile": "smoke", "sizes": {"model": run.size, "seed": 1,
                                           "steps": run.train.steps,
                                           "batch_size": run.train.batch_size},
             "extra": {"lr": run.train.lr, "warmup_steps": run.train.warmup_steps}}
    memory = {"experiment": "lm", "metric": "stored_weight_bytes", "recipe": "nvfp4",
              "profile": "smoke", "sizes": {"model": run.size,
                                            "tokens": run.train.batch_size * cfg.seq_len}}
    want = {}
    for rec, cell in ((train, "tiny_fp8-delayed_s1"), (memory, "tiny_nvfp4_memory")):
        s = lm_quality.program_settings(rec)
        want[cell] = cell_programs(cells, cell)[rec["recipe"]]
        assert fingerprint(lm_quality.program(**s)) == want[cell], cell
    # a record of another run (its learning rate) measured another program
    s = lm_quality.program_settings({**train, "extra": {"lr": 1e-4, "warmup_steps": 10}})
    assert s["train"]["lr"] == 1e-4
    assert fingerprint(lm_quality.program(**s)) != want["tiny_fp8-delayed_s1"]


# ----------------------------------------------------------------------------- inference


def inference_params():
    p = dict(studies.params("inference", "smoke"))
    p["formats"] = ["bf16", "fp8-tensor", "int8-w"]
    p["seeds"] = [0]
    p["train"] = {**p["train"], "steps": 10}
    p["speed"] = {**p["speed"], "configs": {"tiny": {"preset": "tiny", "prefill_batch": 2,
                                                     "formats": ["fp8-tensor", "int8-w"]}}}
    return p


@pytest.mark.slow
def test_inference_fp8_tensor_quantizer_stales_only_fp8_tensor():
    from repro.experiments.inference import measure as inference
    from repro.precision import export

    cells = inference.cells(inference_params())
    names = ["quality_s0", "speed_tiny_fp8-tensor", "speed_tiny_int8-w"]
    clear_caches()  # traced from cold caches, then warm ones: the same programs
    before = {n: cell_programs(cells, n) for n in names}
    assert before["speed_tiny_int8-w"] == cell_programs(cells, "speed_tiny_int8-w")
    assert before["quality_s0"]["fp8-tensor"] == cell_programs(
        cells, "quality_s0", ["fp8-tensor"])["fp8-tensor"]
    assert set(before["quality_s0"]) == {"bf16", "fp8-tensor", "int8-w"}
    with patched(export, "quantize_per_tensor", doubled_input):
        after = {n: cell_programs(cells, n) for n in names}
    assert changed(before["quality_s0"], after["quality_s0"]) == {"fp8-tensor"}
    assert after["speed_tiny_fp8-tensor"] != before["speed_tiny_fp8-tensor"]
    assert after["speed_tiny_int8-w"] == before["speed_tiny_int8-w"]


def test_inference_program_settings_give_the_cells_program():
    from repro.experiments.inference import measure as inference
    from repro.models import lm as M

    p = studies.params("inference", "smoke")
    cells = inference.cells(p)
    cfg, sp = M.get_config(p["model"]), p["speed"]
    quality = {"experiment": "inference", "metric": "kl_to_bf16", "recipe": "fp8-tensor",
               "profile": "smoke", "sizes": {
                   "model": p["model"], "seed": 1, "step": 10, "steps": p["train"]["steps"],
                   "eval_tokens": p["eval_windows"] * p["train"]["batch_size"] * cfg.seq_len}}
    speed = {"experiment": "inference", "metric": "decode_tokens_per_s", "recipe": "int8-w",
             "profile": "smoke", "sizes": {
                 "config": "tiny", "phase": "decode", "batch": sp["decode_batches"][0],
                 "d_model": cfg.d_model, "n_layers": cfg.n_layers,
                 "params": M.param_count(cfg), "prompt_len": sp["prompt_len"],
                 "steps": sp["decode_steps"]}}
    for rec, cell in ((quality, "quality_s1"), (speed, "speed_tiny_int8-w")):
        s = inference.program_settings(rec)
        want = cell_programs(cells, cell, [rec["recipe"]])[rec["recipe"]]
        assert fingerprint(inference.program(**s)) == want, cell
    # a record of a phase the cell does not time is not derivable
    assert inference.program_settings({**speed, "sizes": {**speed["sizes"], "batch": 3}}) \
        is None


# ------------------------------------------------------------------------------ multigpu


def multigpu_cells(n_available=2):
    from repro.experiments.multigpu import measure as multigpu

    p = studies.params("multigpu", "smoke")
    p = dataclasses.replace(p, workloads=("ppo", "lm_dp", "lm_fsdp"), device_counts=(1, 2))
    return multigpu, p, multigpu.cells(p, n_available)


def test_multigpu_programs_per_device_count_and_the_fp8_cast():
    from repro.precision import formats

    _, _, cells = multigpu_cells()
    names = ["lm_dp_bf16_n2", "lm_dp_fp8-delayed_n2", "lm_fsdp_bf16_n2", "ppo_bf16_n2",
             "lm_dp_bf16_n1"]
    before = {n: cell_programs(cells, n) for n in names}
    assert before["lm_fsdp_bf16_n2"] == cell_programs(cells, "lm_fsdp_bf16_n2")
    assert len({h for v in before.values() for h in v.values()}) == len(names)
    names = names[:2]
    with patched(formats, "fp8_cast", doubled_input):
        after = {n: cell_programs(cells, n) for n in names}
    assert {n for n in names if before[n] != after[n]} == {"lm_dp_fp8-delayed_n2"}


def test_multigpu_program_settings_give_the_cells_program():
    multigpu, p, cells = multigpu_cells()
    for w, sizes in (("lm_fsdp", {"model": p.lm["size"],
                                  "batch_per_device": p.lm["batch_per_device"]}),
                     ("ppo", {"env": p.ppo["env"], "width": p.ppo["width"]})):
        rec = {"experiment": "multigpu", "recipe": "bf16", "profile": "smoke",
               "sizes": {"workload": w, "n_devices": 2, **sizes}}
        s = multigpu.program_settings(rec)
        want = cell_programs(cells, f"{w}_bf16_n2")["bf16"]
        assert fingerprint(multigpu.program(**s)) == want, w
    assert multigpu.program_settings({**rec, "sizes": {**rec["sizes"], "width": 7}}) is None


def test_multigpu_program_does_not_depend_on_the_devices_of_the_tracing_machine():
    """The abstract mesh: 8 simulated CPU devices trace the program one device traces."""
    multigpu, p, _ = multigpu_cells()
    args = ("lm_dp", "bf16", 2, dict(p.ppo), dict(p.lm))
    here = fingerprint(multigpu.program(*args))
    code = textwrap.dedent(f"""
        import jax
        from repro import program as P
        from repro.experiments.multigpu import measure as multigpu
        assert jax.device_count() == 8
        print(P.trace(multigpu.program(*{args!r}), "{PLATFORM}", "{KIND}").hash)
        """)
    env = {**os.environ, "JAX_PLATFORMS": "cpu",
           "XLA_FLAGS": os.environ.get("XLA_FLAGS", "")
           + " --xla_force_host_platform_device_count=8"}
    r = subprocess.run([sys.executable, "-c", code], cwd=checkout.CHECKOUT, env=env,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.strip().splitlines()[-1] == here


# -------------------------------------------------------------------------- kernel_times


def test_kernel_times_traces_the_studies_own_programs():
    from repro.experiments.gemm import measure as gemm
    from repro.experiments.kernel_times import measure as kernel_times
    from repro.experiments.mlp_step import measure as mlp_step
    from repro.precision import formats

    p = kernel_times.Params(workload="gemm", recipes=("bf16", "fp8"), shapes=((64, 32, 16),),
                            profile="smoke")
    (cell,) = kernel_times.cells(p)
    progs = cell.programs()
    for r in ("bf16", "fp8"):  # the gemm study's program, this study's kit
        g = P.trace(gemm.program(r, 64, 32, 16), PLATFORM, KIND)
        k = P.trace(progs[r], PLATFORM, KIND)
        assert (k.hash, k.kit != g.kit) == (g.hash, True)
    before = hashes(progs)
    with patched(formats, "fp8_quantize", doubled_input):
        assert changed(before, hashes(cell.programs())) == {"fp8"}
    p = kernel_times.Params(workload="mlp", recipes=("bf16",), width=64, depth=2, batch=32,
                            profile="smoke")
    (cell,) = kernel_times.cells(p)
    assert hashes(cell.programs())["bf16"] == fingerprint(mlp_step.program("bf16", 64, 32, 2))


@pytest.mark.parametrize("workload, sizes, params", [
    ("gemm", {"M": 64, "K": 32, "N": 16}, {"shapes": ((64, 32, 16),)}),
    ("lm", {"model": "tiny", "batch": 2}, {"size": "tiny", "batch": 2}),
    ("ppo", {"network": "mlp", "width": 64, "num_envs": 16},
     {"width": 64, "num_envs": 16}),
    ("inference", {"config": "tiny", "phase": "decode", "batch": 2},
     {"config": "tiny", "phase": "decode", "batch": 2}),
])
def test_kernel_times_program_settings_give_the_cells_program(workload, sizes, params):
    from repro.experiments.kernel_times import measure as kernel_times

    recipe = {"gemm": "fp8", "inference": "int8-w"}.get(workload, "fp8-delayed")
    p = kernel_times.Params(workload=workload, recipes=(recipe,), profile="smoke", **params)
    (cell,) = kernel_times.cells(p)
    rec = {"experiment": "kernel_times", "recipe": recipe, "profile": "smoke",
           "sizes": {"workload": workload, **sizes}}
    s = kernel_times.program_settings(rec)
    assert json.loads(json.dumps(s)) == s  # the settings travel as JSON (backfills)
    assert fingerprint(kernel_times.program(**s)) == \
        hashes(cell.programs())[recipe]
