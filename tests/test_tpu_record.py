"""scripts/tpu_record.sh's argument handling and plan, in its dry run (no pip, no JAX): what it
installs from where (carried wheels, the image's index; /tmp/site at the end of PYTHONPATH),
that the numerics check comes before any item, and each item's command and time limits."""

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts" / "tpu_record.sh"

pytestmark = pytest.mark.skipif(not shutil.which("bash") or not shutil.which("python3"),
                                reason="needs bash and python3")


def run(tmp_path, *args, commit="abc", lock="zz-from-index==1.0\nzz-carried==2.0\n",
        index=("zz-from-index==1.0",), wheels=("zz_carried-2.0-py3-none-any.whl",)):
    (tmp_path / "idx").mkdir(exist_ok=True)
    (tmp_path / "whl").mkdir(exist_ok=True)
    for pin in index:  # the index holds each package's files: NAME/NAME-VERSION-...whl
        name, version = pin.split("==")
        (tmp_path / "idx" / name).mkdir(exist_ok=True)
        (tmp_path / "idx" / name / f"{name.replace('-', '_')}-{version}-py3-none-any.whl"
         ).write_bytes(b"")
    for w in wheels:
        (tmp_path / "whl" / w).write_bytes(b"")
    (tmp_path / "lock").write_text(lock)
    env = {**os.environ, "REPRO_TPU_INDEX": str(tmp_path / "idx"),
           "REPRO_TPU_WHEELS": str(tmp_path / "whl"), "REPRO_TPU_LOCK": str(tmp_path / "lock"),
           "REPRO_TPU_SITE": str(tmp_path / "site"), "OUT": str(tmp_path / "out")}
    env.pop("REPRO_GIT_COMMIT", None)
    if commit:
        env["REPRO_GIT_COMMIT"] = commit
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, env=env, text=True,
                          capture_output=True, timeout=60)


def test_the_script_parses():
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0


def test_dry_run_installs_beside_the_images_jax_checks_then_records(tmp_path):
    r = run(tmp_path, "--dry-run", "--note", "beside nothing", "540", "mlp_step:--recipe=int8",
            "record rl_throughput --profile full --recipe int8,fp32 --only *_paired_*")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    pip_index = next(x for x in lines if "--index-url" in x)
    assert f"file://{tmp_path}/idx" in pip_index and "zz-from-index==1.0" in pip_index
    assert f"--target {tmp_path}/site" in pip_index and "--no-deps" in pip_index
    pip_wheels = next(x for x in lines if "--no-index" in x)
    assert "zz_carried-2.0-py3-none-any.whl" in pip_wheels and "zz-carried" not in pip_index
    path = next(x for x in lines if x.startswith("== PYTHONPATH="))
    assert path.split()[1].endswith(f":{tmp_path}/site")  # the image's JAX comes first
    at = {k: next(i for i, x in enumerate(lines) if k in x)
          for k in ("repro.cli check", "cli record mlp_step", "cli record rl_throughput")}
    assert at["repro.cli check"] < at["cli record mlp_step"] < at["cli record rl_throughput"]
    first = lines[at["cli record mlp_step"]]
    m = re.match(r"\+ timeout -k 20 --signal=INT (\d+) python3 -m repro.cli record mlp_step "
                 r"--profile full --recipe=int8 --time-budget (\d+) ", first)
    assert m and 515 <= int(m[1]) <= 525 and int(m[2]) == int(m[1]) - 30, first
    assert "--note beside\\ nothing" in first
    second = lines[at["cli record rl_throughput"]]
    assert "--recipe int8\\,fp32 --only \\*_paired_\\*" in second  # no globbing, one word
    packs = [i for i, x in enumerate(lines) if "results.tgz results/" in x]
    assert len(packs) == 2 and packs[0] > at["cli record mlp_step"] and packs[1] > packs[0]
    assert not (tmp_path / "site").exists() and not (tmp_path / "out").exists()  # ran nothing


def test_a_probe_item_runs_its_script_without_a_time_budget(tmp_path):
    r = run(tmp_path, "--dry-run", "300", "scripts/probe_int8_hlo.py --width 1024", "gemm")
    assert r.returncode == 0, r.stderr
    probe = next(x for x in r.stdout.splitlines() if "probe_int8_hlo.py" in x and x[0] == "+")
    assert re.match(r"\+ timeout -k 20 --signal=INT \d+ python3 scripts/probe_int8_hlo.py "
                    r"--width 1024$", probe), probe
    assert any("python3 -m repro.cli record gemm --profile full --time-budget" in x
               for x in r.stdout.splitlines())


def test_a_package_neither_carried_nor_in_the_index_stops_everything(tmp_path):
    r = run(tmp_path, "--dry-run", "540", "gemm", index=())
    assert r.returncode == 1 and "repro.cli" not in r.stdout
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "zz-from-index==1.0" in err[0] and ".whl-tpu" not in err[0]


def test_a_locked_version_the_index_lacks_stops_everything(tmp_path):
    # the index has the package, but not at the locked version: pip would fail mid-install
    r = run(tmp_path, "--dry-run", "540", "gemm", index=("zz-from-index==1.0.1",))
    assert r.returncode == 1 and "repro.cli" not in r.stdout
    err = r.stderr.strip().splitlines()
    assert len(err) == 1 and "zz-from-index==1.0" in err[0]


@pytest.mark.parametrize("args,commit,expected", [
    ((), "abc", "usage: scripts/tpu_record.sh"),
    (("soon",), "abc", "SECONDS: a whole number, got 'soon'"),
    (("--frobnicate", "540"), "abc", "unknown option --frobnicate"),
    (("540", "gemm"), "", "set REPRO_GIT_COMMIT"),
])
def test_bad_arguments_are_one_line_and_exit_2(tmp_path, args, commit, expected):
    r = run(tmp_path, *args, commit=commit)
    assert r.returncode == 2 and expected in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert r.stdout == ""


def test_help_is_the_header():
    r = subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True)
    assert r.returncode == 0 and "usage: scripts/tpu_record.sh" in r.stdout
    assert "gymnax" in r.stdout and "set -uo" not in r.stdout
