"""Kernel-time profiles: kernel names to classes, trace events to per-step sums."""

import shutil
from pathlib import Path

import pandas as pd
import pytest

from repro import cli
from repro.experiments.kernel_times import measure as K
from repro.experiments.kernel_times import tables as traces

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def repo(tmp_path, monkeypatch):
    """A repository root of its own, with this repository's params.yaml."""
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    return tmp_path


def trace(argv, capsys):
    """``repro trace ARGV``: (exit status, last line of stderr)."""
    rc = cli.main(["trace", *argv])
    err = capsys.readouterr().err.strip().splitlines()
    return rc, err[-1] if err else ""


@pytest.mark.parametrize("name,cls", [
    ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1", "gemm"),
    ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopA_NNT", "gemm"),
    ("cutlass3x_sm90_tensorop_gemm_e4m3_e4m3_f32_bf16_bf16_128x128x128", "gemm"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", "collective"),
    ("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_3_64x128x128", "attention"),
    ("loop_multiply_fusion_3", "other"),
    ("input_reduce_fusion_1", "other"),
    ("Memcpy DtoD (Device -> Device)", "memory"),
])
def test_kernel_class(name, cls):
    assert traces.kernel_class(name) == cls


def _trace():
    M = lambda pid, what, name, tid=None: {"ph": "M", "pid": pid, "name": what,  # noqa: E731
                                           **({"tid": tid} if tid is not None else {}),
                                           "args": {"name": name}}
    X = lambda pid, tid, name, ts, dur: {"ph": "X", "pid": pid, "tid": tid,  # noqa: E731
                                         "name": name, "ts": ts, "dur": dur}
    return {"traceEvents": [
        M(1, "process_name", "/host:CPU"), M(1, "thread_name", "python", 7),
        M(2, "process_name", "/device:GPU:0 (NVIDIA H200)"),
        M(2, "thread_name", "Stream #13(Compute)", 1), M(2, "thread_name", "XLA Ops", 2),
        X(1, 7, "PjitFunction(step)", 0, 900),               # host: not a kernel
        X(2, 2, "fusion.3", 0, 500),                         # overlay line: not a kernel
        X(2, 1, "sm90_xmma_gemm_e4m3", 0, 300), X(2, 1, "sm90_xmma_gemm_e4m3", 400, 300),
        X(2, 1, "loop_convert_fusion", 300, 50), X(2, 1, "loop_convert_fusion", 700, 50),
        X(2, 1, "ncclDevKernel_AllReduce_Sum_f32", 750, 100),
    ]}


def test_kernel_events_and_per_step_sums_by_hand():
    k = K.kernel_events(_trace())
    assert len(k) == 5 and set(k["process"]) == {"/device:GPU:0 (NVIDIA H200)"}
    s = K.summarize(k, steps=2)
    assert s["gemm_ms_per_step"] == pytest.approx(0.600 / 2)
    assert s["other_ms_per_step"] == pytest.approx(0.100 / 2)
    assert s["collective_ms_per_step"] == pytest.approx(0.100 / 2)
    assert s["attention_ms_per_step"] == 0 and s["memory_ms_per_step"] == 0
    assert s["kernel_ms_per_step"] == pytest.approx(0.800 / 2)
    assert s["kernels_per_step"] == 2.5
    top = s["top_kernels"][0]
    assert top["name"] == "sm90_xmma_gemm_e4m3" and top["calls_per_step"] == 1.0
    with pytest.raises(ValueError):
        K.summarize(k, steps=0)


def test_cpu_run_records_nothing_and_bad_recipe_is_one_line(repo, capsys):
    rc = cli.main(["trace", "mlp", "--width", "32", "--batch", "64", "--recipes", "bf16",
                   "--steps", "1", "--profile", "smoke"])
    assert rc == 0 and "no device kernels" in capsys.readouterr().err
    assert not list(repo.rglob("*.json"))
    rc, err = trace(["mlp", "--recipes", "bf16,nope"], capsys)
    assert rc == 2 and "unknown recipe 'nope'" in err and "valid recipes" in err


def test_profile_cell_records_per_step_sums_and_marks_emulation(monkeypatch):
    """NVFP4 has no tensor cores here: its kernel times are the emulation's, and say so."""
    monkeypatch.setattr(K, "trace_steps", lambda run, steps, logdir: 0.002)
    monkeypatch.setattr(K, "load_trace", lambda logdir: _trace())
    recs = K.profile_cell("mlp", ["bf16", "nvfp4"], 2, {"width": 8},
                          lambda r: (lambda: None, {"fp8_lowering": "no-f8"}), "smoke")
    by = {(r["recipe"], r["metric"]): r for r in recs}
    assert by[("bf16", "gemm_ms_per_step")]["value"] == pytest.approx(0.3)
    assert by[("bf16", "wall_ms_per_step")]["value"] == pytest.approx(2.0)
    assert by[("bf16", "kernels_per_step")]["unit"] == "kernels"
    assert not by[("bf16", "gemm_ms_per_step")]["emulated"]
    assert by[("nvfp4", "gemm_ms_per_step")]["emulated"]
    assert by[("nvfp4", "gemm_ms_per_step")]["sizes"] == {"workload": "mlp", "width": 8}


def test_gemm_workload_traces_the_sweep_gemm_and_checks_its_arguments(repo, monkeypatch,
                                                                        capsys):
    run, facts = K._gemm_runner("fp8", 32, 16, 8)
    assert facts["emulated"]  # no FP8 GEMM on a CPU
    assert run().shape == (32, 8)
    rc = cli.main(["trace", "gemm", "--shapes", "32x16x8", "--steps", "1", "--profile", "smoke"])
    assert rc == 0 and "no device kernels" in capsys.readouterr().err
    assert not list(repo.rglob("*.json"))
    for bad, expected in ((["gemm", "--recipes", "bf16,fp7"], "unknown GEMM recipe(s) fp7"),
                          (["gemm", "--shapes", "32x16"], "--shapes: expected MxKxN"),
                          (["conv"], "unknown workload 'conv'")):
        rc, err = trace(bad, capsys)
        assert rc == 2 and err.startswith("repro: error: ") and expected in err
    # the dtype's own emulation flag goes into the records
    monkeypatch.setattr(K, "trace_steps", lambda run, steps, logdir: 0.002)
    monkeypatch.setattr(K, "load_trace", lambda logdir: _trace())
    recs = K.profile_cell("gemm", ["fp8"], 2, {"M": 1, "K": 1, "N": 1},
                          lambda r: (lambda: None, {"fp8_lowering": "cublaslt-f8",
                                                    "emulated": True}), "smoke")
    assert recs and all(r["emulated"] for r in recs)


@pytest.mark.slow
def test_ppo_workload_traces_the_throughput_cells_update(repo, monkeypatch, capsys):
    """``repro trace ppo`` traces the PPO update of an rl_throughput MLP cell (an RL variant
    name included): the runner its cell hands to ``profile_cell`` runs that update, and on a
    CPU its FP8 is emulated. An unknown recipe is one line. (The no-kernels path is the mlp
    test's.)"""
    import jax
    import numpy as np

    seen = {}

    def profile_cell(workload, recipes, steps, sizes, make_runner, profile):
        run, facts = make_runner(recipes[0])
        seen.update(workload=workload, sizes=sizes, facts=facts, out=run())
        return []

    monkeypatch.setattr(K, "profile_cell", profile_cell)
    assert cli.main(["trace", "ppo", "--width", "64", "--num-envs", "8", "--recipes",
                     "fp8-all-layers", "--steps", "1", "--profile", "smoke"]) == 0
    assert seen["workload"] == "ppo"
    assert seen["sizes"] == {"network": "mlp", "width": 64, "num_envs": 8}
    assert seen["facts"]["emulated"]  # no FP8 GEMM on a CPU
    floats = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(seen["out"])
              if np.issubdtype(np.asarray(x).dtype, np.floating)]
    assert floats and all(np.isfinite(x).all() for x in floats)
    assert not list(repo.rglob("*.json"))
    rc, err = trace(["ppo", "--recipes", "bf16,fp7"], capsys)
    assert rc == 2 and "unknown recipe 'fp7'" in err


def test_headroom_is_amdahls_law_on_hand_numbers():
    # BF16: 300 ms of GEMMs in a 400 ms step; FP8: GEMMs twice as fast (150 ms) but 40 ms more
    # outside them (140 instead of 100), so a 290 ms step.
    base = pd.Series({"gemm": 300.0, "kernel": 400.0})
    fast = pd.Series({"gemm": 150.0, "kernel": 290.0})
    h = traces.headroom(base, fast, target=1.5)
    assert h["gemm x"] == pytest.approx(2.0)
    assert h["update x"] == pytest.approx(400 / 290)
    assert h["bound"] == pytest.approx(1.6)  # 400 / (150 + 100)
    assert h["added ms"] == pytest.approx(40.0)
    assert h["allowed ms"] == pytest.approx(400 / 1.5 - 150)  # 116.7: it spends 140, over
    assert h["spent ms"] == pytest.approx(140.0)


def test_inference_workload_traces_the_speed_cells_program(repo, monkeypatch, capsys):
    """``repro trace inference`` traces a speed config's decode loop (or prefill) per
    inference format, compiled as the inference study's speed cell compiles it: the runner
    the cell hands to ``profile_cell`` runs it, and on a CPU a quantized format is emulated.
    Unknown formats, phases and configs are one line; a CPU trace records nothing."""
    pytest.importorskip("qwix")
    seen = {}

    def profile_cell(workload, recipes, steps, sizes, make_runner, profile):
        for r in recipes:
            run, facts = make_runner(r)
            seen[r] = (facts, run())
        seen["sizes"] = sizes
        return []

    monkeypatch.setattr(K, "profile_cell", profile_cell)
    rc = cli.main(["trace", "inference", "--config", "tiny", "--recipes", "bf16,fp8-w",
                   "--steps", "1", "--profile", "smoke"])
    assert rc == 0 and seen["sizes"] == {"config": "tiny", "phase": "decode", "batch": 1}
    (bf16, (tokens, _)), (fp8w, _) = seen["bf16"], seen["fp8-w"]
    assert not bf16["emulated"] and fp8w["emulated"]  # a CPU has no tensor cores
    assert tokens.shape == (1, 8)  # the smoke profile's decode_steps tokens, one sequence
    assert fp8w["lowering"] in ("reduce", "fused", "separate")
    monkeypatch.undo()
    for bad, expected in ((["inference", "--recipes", "bf16,fp9"], "unknown inference format"),
                          (["inference", "--phase", "train"], "unknown phase 'train'"),
                          (["inference", "--config", "huge", "--profile", "smoke"],
                           "no speed config 'huge'")):
        rc, err = trace(bad, capsys)
        assert rc != 0 and expected in err, (bad, err)

