"""scripts/probe_step_memory.py on the CPU: it names the buffers live at the peak of the MLP
step and of the PPO update from XLA's dumps, and runs the program it compiled in a fresh
process to read the device's peak (a CPU has no memory statistics: it says so). What the GPU
prints cannot be checked here; the way each number is worded can."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "probe_step_memory.py"


@pytest.fixture
def probe(monkeypatch):
    monkeypatch.setenv("XLA_FLAGS", "")  # the module adds its dump flags: keep them here
    spec = importlib.util.spec_from_file_location("probe_step_memory", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_peak_line_says_which_peak_it_measured(probe):
    gb = 10 ** 9
    ran = probe.peak_line(4 * gb, {"stats": True, "resident": gb, "peak_before": 2 * gb,
                                   "peak_after": 5 * gb})
    assert "XLA's estimate 4.000 GB" in ran and "resident at the start 1.000 GB" in ran
    assert "measured peak 5.000 GB (the run's; 1.250 of XLA's estimate)" in ran
    setup = probe.peak_line(4 * gb, {"stats": True, "resident": gb, "peak_before": 6 * gb,
                                     "peak_after": 6 * gb})
    assert "did not raise the process's peak 6.000 GB" in setup and "at most" in setup
    assert "no memory statistics" in probe.peak_line(gb, {"stats": None})
    assert "failed: boom" in probe.peak_line(gb, {"error": "boom"})


def run(*args):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "JAX_PLATFORMS": "cpu", "XLA_FLAGS": ""}
    out = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                         env=env, cwd=ROOT, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def test_mlp_step_peak_buffers_and_the_run_in_a_fresh_process():
    out = run("--width", "64", "--batch", "128", "--depth", "2", "--measure", "--top", "4",
              "fp8-delayed:fp8_weights=stored")
    assert "== fp8-delayed:fp8_weights=stored  MLP step, width 64 batch 128 depth 2" in out
    assert "step memory" in out and "live at the peak" in out
    assert "f32[128,64]" in out  # an activation-sized buffer, named with its shape
    # the executable compiled here ran in the fresh process, which has no statistics
    assert "measured: this device reports no memory statistics" in out


@pytest.mark.slow  # compiles a PPO update of the full profile's shapes (narrowed)
def test_ppo_update_peak_buffers():
    out = run("--workload", "ppo", "--width", "64", "--envs", "8", "--top", "3", "fp8-delayed")
    assert "PPO update, Breakout-MinAtar MLP width 64, 8 envs x 128 steps" in out
    assert "live at the peak" in out and "traj_obs" in out  # the rollout, an argument
