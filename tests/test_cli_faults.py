"""The `repro` command under faults: nothing deleted that it did not create, hardware identity
detected (not asserted), full-profile studies on a CPU only with --yes, every error one line,
Ctrl-C exits 130 cleanly and keeps the finished cells."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from repro import cli, hardware, site
from repro.hardware import HardwareInfo, lookup

ROOT = Path(__file__).resolve().parent.parent
GEMM_PARAMS = """profile: smoke
gemm:
  common: {dtypes: [fp32, bf16], repeats: 1, input_sets: 1}
  smoke: {shapes: [[32, 16, 16]], error_shape: [16, 16, 16]}
  full: {shapes: [[64, 64, 64]]}
"""


def one_line(capsys, status, argv):
    assert cli.main(argv) == status
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("repro: error: "), err
    return err[0]


@pytest.fixture
def repo(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text(GEMM_PARAMS)
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    return tmp_path


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


# ---------------------------------------------------------------------------------- site


@pytest.mark.parametrize("target", ["docs", ".", "notes.txt"])
def test_site_refuses_to_replace_what_it_did_not_build(repo, capsys, target):
    (repo / "docs").mkdir()
    (repo / "docs" / "CLAIMS.md").write_text("claims")
    (repo / "notes.txt").write_text("mine")
    before = tree(repo)
    line = one_line(capsys, 2, ["site", "--out", str(repo / target)])
    assert f"--out {repo / target}" in line
    assert ("not a site this command built" in line) or ("a file is there" in line)
    assert tree(repo) == before  # nothing deleted, nothing written


def test_site_replaces_its_own_build_and_an_empty_folder(repo, capsys):
    out = repo / "public"
    out.mkdir()  # empty: fine
    assert cli.main(["site", "--out", str(out)]) == 0
    assert (out / site.MARKER).is_file() and (out / "index.html").is_file()
    (out / "old.html").write_text("from the last build")
    assert cli.main(["site", "--out", str(out)]) == 0  # marked: replaced whole
    assert not (out / "old.html").exists()
    (out / site.MARKER).unlink()
    capsys.readouterr()
    assert "not a site this command built" in one_line(capsys, 2, ["site", "--out", str(out)])


def test_the_default_site_folder_built_before_markers_is_still_replaced(repo):
    old = repo / "build" / "site"
    (old / "figures").mkdir(parents=True)
    (old / "index.html").write_text("old")
    (old / "figures" / "01_x.png").write_bytes(b"png")
    assert cli.main(["site"]) == 0
    assert (old / site.MARKER).is_file() and not (old / "figures" / "01_x.png").exists()


def test_site_under_a_file_is_one_line(repo, capsys):
    (repo / "f").write_text("x")
    assert "is not a folder" in one_line(capsys, 2, ["site", "--out", str(repo / "f" / "s")])


def test_a_notebook_scratch_folder_holding_foreign_files_is_not_emptied(tmp_path):
    from repro import run_notebook

    scratch = tmp_path / "scratch"
    (scratch / "cpu" / "gemm").mkdir(parents=True)
    (scratch / "cpu" / "gemm" / "a.json").write_text("[]")
    (scratch / "thesis.tex").write_text("mine")
    with pytest.raises(run_notebook.NotebookError, match=r"holds thesis.tex, which is not a "
                                                         r"record"):
        run_notebook._empty_scratch(scratch)
    assert (scratch / "thesis.tex").exists()
    (scratch / "thesis.tex").unlink()
    run_notebook._empty_scratch(scratch)  # only records: its own, emptied
    assert not scratch.exists()


# ---------------------------------------------------------------------- hardware label

H200 = HardwareInfo("h200", "NVIDIA H200", "gpu", "9.0")
NEW_GPU = HardwareInfo("nvidia-x1", "NVIDIA X1", "gpu", "9.0")


@pytest.mark.parametrize("label, device, want", [
    ("h200", lookup("cpu"), "it names NVIDIA H200 (GPU) and JAX runs on the CPU"),
    ("my-h200", lookup("cpu"), "it names NVIDIA H200 (GPU) and JAX runs on the CPU"),
    ("b200", H200, "compute capability 10.0) and this device has compute capability 9.0"),
    ("h100-sxm", H200, "this device is NVIDIA H200 (h200)"),
    ("cpu", H200, "it names CPU (no accelerator) (CPU) and JAX runs on the GPU"),
])
def test_a_label_contradicting_the_device_is_refused(label, device, want):
    with pytest.raises(ValueError) as e:
        hardware.check_label(label, device)
    assert str(e.value).startswith(f"--hardware {label!r} contradicts the detected device: ")
    assert want in str(e.value)


@pytest.mark.parametrize("label, device, slug", [
    ("test-box", lookup("cpu"), "test-box"),  # a machine the registry lacks
    ("H200", H200, "h200"),  # the device itself
    ("h200-node7", H200, "h200-node7"),
    ("h100-sxm", NEW_GPU, "h100-sxm"),  # an unregistered GPU of the same kind
])
def test_a_label_that_agrees_or_is_unregistered_is_kept(label, device, slug):
    assert hardware.check_label(label, device) == slug


@pytest.mark.parametrize("label", ["../../x", "x/y", "..", ".", ".hidden", "x\\y", "/abs"])
def test_a_label_that_is_a_path_is_refused_not_mapped_to_a_name(label):
    with pytest.raises(ValueError) as e:
        results.slug(label)
    assert str(e.value) == (f"--hardware {label!r}: a machine's name, not a path (records go "
                            "under results/NAME/): leave out '/', '\\' and a leading '.'")


@pytest.mark.parametrize("argv", [["record", "gemm"], ["record", "--stale", "--profile", "full"],
                                  ["trace", "gemm"]])
def test_every_command_that_records_checks_its_label(repo, capsys, argv):
    for label, says in [("../../x", "a machine's name, not a path"),
                        ("h200", "contradicts the detected device")]:
        line = one_line(capsys, 2, argv + ["--hardware", label])
        assert f"--hardware {label!r}" in line and says in line, line
    assert not (repo / "build").exists() and not any((repo / "results").iterdir())


def test_record_under_a_contradicting_label_writes_nothing(repo, capsys):
    line = one_line(capsys, 2, ["record", "gemm", "--hardware", "h200"])
    assert "contradicts the detected device" in line
    assert not (repo / "build").exists() and not any((repo / "results").iterdir())


# ------------------------------------------------------------------ full profile on CPU


def test_a_full_profile_study_on_a_cpu_needs_yes_and_says_how_long(repo, capsys,
                                                                 monkeypatch):
    gpu = repo / "results" / "h200" / "gemm"
    gpu.mkdir(parents=True)
    for cell, when, tflops in [("a", "10:00", 500.0), ("b", "10:30", 600.0),
                               ("c", "11:30", 550.0)]:
        (gpu / f"{cell}.json").write_text(json.dumps([{
            "experiment": "gemm", "backend": "gpu", "metric": "tflops", "value": tflops,
            "recipe": "bf16", "timestamp": f"2025-01-01T{when}:00+00:00"}]))
    monkeypatch.setattr(hardware, "_cpu_matmul_tflops", lambda: 0.5)
    line = one_line(capsys, 2, ["record", "gemm", "--profile", "full"])
    # 90 minutes between the first and the last cell on the h200; 600 / 0.5 = 1200x slower
    assert ("its cells took about 90 minutes on the h200 (by their records' timestamps) and "
            "this CPU multiplies BF16 matrices about 1,200x slower than the h200's recorded "
            "GEMMs: roughly 11 weeks here") in line
    assert line.endswith("use --profile smoke, or add --yes to run it here anyway")
    assert not (repo / "results" / "cpu").exists()


# -------------------------------------------------------------------- one-line errors


@pytest.mark.parametrize("argv, want", [
    (["record", "gemm", "--time-budget", "nan"], "--time-budget: expected seconds > 0"),
    (["record", "gemm", "--time-budget", "-5"], "--time-budget: expected seconds > 0"),
    (["record", "gemm", "--time-budget", "inf"], "--time-budget: expected seconds > 0"),
    (["record", "gemm", "--recipe", ","], "--recipe: no name given"),
    (["record", "gemm", "--hardware", " "], "--hardware: expected a non-empty value"),
    (["trace", "mlp", "--steps", "0"], "--steps: expected a positive integer, got '0'"),
    (["trace", "mlp", "--batch", "-3"], "--batch: expected a positive integer"),
    (["trace", "mlp", "--width", "1.5"], "--width: invalid int value: '1.5'"),
])
def test_bad_arguments_name_themselves(repo, capsys, argv, want):
    assert want in one_line(capsys, 2, argv)


def test_any_other_error_is_one_line_with_status_1(repo, capsys, monkeypatch):
    def broken(args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli.device, "cmd_hardware", broken)
    line = one_line(capsys, 1, ["hardware"])
    assert line == ("repro: error: OSError: [Errno 28] No space left on device (--debug shows "
                    "the traceback)")
    with pytest.raises(OSError):
        cli.main(["--debug", "hardware"])


# ----------------------------------------------------------------------------- Ctrl-C


SWALLOWED = """
import os, signal, sys, time
from repro.cli import Interrupts
it = Interrupts(every=0.2).install() if sys.argv[1] == "installed" else None
class D:
    def __del__(self):  # a KeyboardInterrupt raised in here is swallowed by Python
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(10 ** 6):
            pass
d = D()
del d
print("swallowed", flush=True)
try:
    t0 = time.time()
    while time.time() - t0 < 5:
        time.sleep(0.01)
    print("lost", flush=True)
except KeyboardInterrupt:
    it.handled()
    print("raised again", flush=True)
"""


@pytest.mark.parametrize("mode,want", [("installed", "raised again"), ("default", "lost")])
def test_a_ctrl_c_swallowed_inside_a_finalizer_is_raised_again(mode, want):
    """JAX's garbage-collection callback is where a Ctrl-C often lands; Python swallows an
    exception raised there. With :class:`repro.cli.Interrupts` (the ``repro`` command's
    handler) it comes again; with Python's own handler it is lost."""
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT)}
    p = subprocess.run([sys.executable, "-c", SWALLOWED, mode], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=60,
                       preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.split()[:1] == ["swallowed"], p.stderr
    assert p.stdout.strip().endswith(want), p.stdout + p.stderr
    assert "KeyboardInterrupt" in p.stderr  # Python's "Exception ignored in" note


@pytest.mark.slow  # two record processes, one interrupted
def test_ctrl_c_during_record_exits_130_keeps_cells_and_the_rerun_resumes(tmp_path):
    shapes = ", ".join(f"[{16 * i}, 16, 16]" for i in range(1, 9))
    (tmp_path / "params.yaml").write_text(GEMM_PARAMS.replace("[[32, 16, 16]]", f"[{shapes}]"))
    (tmp_path / "results").mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "REPRO_ROOT": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-m", "repro.cli", "record", "gemm", "--hardware", "test-box"]
    # A test run started in the background of a non-interactive shell inherits an ignored
    # SIGINT; a terminal's program does not: give the child the default disposition.
    p = subprocess.Popen(argv, cwd=ROOT, env=env, start_new_session=True, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    cells = tmp_path / "build" / "results" / "test-box" / "gemm"
    # Finished cells only: a cell being written is a hidden ".CELL.json.*.tmp" beside them,
    # and a Ctrl-C during that write rightly discards it.
    finished = lambda: [f.name for f in sorted(cells.glob("*.json"))]  # noqa: E731
    deadline = time.time() + 120
    while p.poll() is None and not finished() and time.time() < deadline:
        time.sleep(0.05)
    os.killpg(p.pid, signal.SIGINT)  # what a terminal's Ctrl-C does
    _, err = p.communicate(timeout=120)
    kept = finished()
    assert p.returncode == 130, err
    assert err.strip().splitlines()[-1] == ("repro: interrupted; finished cells are kept: "
                                            "rerun the same command to resume")
    assert "Traceback" not in err, err
    assert kept and not list(cells.glob(".*"))
    for name in kept:
        json.loads((cells / name).read_text())
    again = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert f"{len(kept)} already recorded" in again.stdout
    assert len(list(cells.glob("*.json"))) == 9


# ------------------------------------------------------------------- full disk, permissions

import errno  # noqa: E402

from repro import results  # noqa: E402
from repro import studies  # noqa: E402
from repro.studies import runner  # noqa: E402

GEMM_RECORD = json.loads(sorted((ROOT / "results" / "h200" / "gemm").glob("*.json"))[0]
                         .read_text())[0]


def fake_study(names=("a", "b", "c")):
    def cell(name):
        return runner.Cell(name, lambda left: [dict(GEMM_RECORD)])
    return runner.Study("gemm", claims=(), cells=lambda p: [cell(n) for n in names],
                        section=None, module="repro.results")


def written(root: Path) -> list[str]:
    return sorted(p.name for p in root.rglob("*") if p.is_file())


def failing_on(calls: int, exc: OSError, real):
    """``real``, raising ``exc`` from its ``calls``-th call on."""
    count = {"n": 0}

    def fn(*a, **k):
        count["n"] += 1
        if count["n"] >= calls:
            raise exc
        return real(*a, **k)
    return fn


@pytest.mark.parametrize("target", ["os.replace", "json.dump"])
def test_a_full_disk_names_the_cell_and_the_file_and_keeps_finished_cells(tmp_path,
                                                                         monkeypatch, target):
    mod, name = target.split(".")
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(getattr(results, mod), name,
                        failing_on(2, full, getattr(getattr(results, mod), name)))
    with pytest.raises(runner.WriteFailed) as e:
        runner.run(fake_study(), None, tmp_path, hardware="test-box", progress=False)
    msg = str(e.value)
    path = tmp_path / "test-box" / "gemm" / "b.json"
    assert msg == (f"gemm/b: cannot write {path}: No space left on device (ENOSPC); nothing "
                   "of it was written; the run stopped there: the 1 cell(s) written before "
                   "it are kept (rerun to resume)")
    assert written(tmp_path) == ["a.json"]  # no partial b.json, no temporary file
    monkeypatch.undo()
    out = runner.run(fake_study(), None, tmp_path, hardware="test-box", progress=False,
                     checker=studies.checker())  # its committed record's program: retraced
    assert out.skipped == ["a"] and [p.name for p in out.written] == ["b.json", "c.json"]


def test_a_folder_without_permission_is_named(tmp_path, monkeypatch):
    folder = tmp_path / "test-box" / "gemm"
    denied = PermissionError(errno.EACCES, "Permission denied", str(folder))
    monkeypatch.setattr(results.tempfile, "mkstemp", failing_on(1, denied, None))
    with pytest.raises(runner.WriteFailed) as e:
        runner.run(fake_study(), None, tmp_path, hardware="test-box", progress=False)
    assert str(e.value).startswith(f"gemm/a: cannot write {folder / 'a.json'}: Permission "
                                   f"denied (EACCES) at {folder}; nothing of it was written; "
                                   "the run stopped there: the 0 cell(s) written before")
    assert written(tmp_path) == []


def test_record_on_a_full_disk_is_one_line_with_status_1(repo, capsys, monkeypatch):
    full = OSError(errno.ENOSPC, "No space left on device")
    monkeypatch.setattr(results.os, "replace", failing_on(1, full, None))
    assert cli.main(["record", "gemm", "--hardware", "test-box"]) == 1
    line = capsys.readouterr().err.strip().splitlines()[-1]  # after the progress bar
    assert line.startswith("repro: error: gemm/") and "cannot write " in line, line
    assert "No space left on device (ENOSPC)" in line and "the 0 cell(s) written" in line
    assert not [p for p in (repo / "build" / "results").rglob("*") if p.is_file()]


# ---------------------------------------------------------------- one run per results folder


def test_a_second_record_of_the_same_study_is_refused_naming_the_holder(repo, capsys):
    root = results.record_root("smoke")
    with results.record_lock(root, "test-box", "gemm"):
        line = one_line(capsys, 1, ["record", "gemm", "--hardware", "test-box"])
        # another study, or the same study on another hardware's folder, is not held
        with results.record_lock(root, "test-box", "mlp_step"), \
                results.record_lock(root, "other-box", "gemm"):
            pass
    folder = (root / "test-box" / "gemm").resolve()
    assert line.startswith(f"repro: error: {folder} is being recorded by another run "
                           f"(pid {os.getpid()}, lock "), line
    assert not (root / "test-box").exists()
    with results.record_lock(root, "test-box", "gemm"):  # released: free again
        pass


def test_the_lock_is_released_when_its_holder_dies(tmp_path, monkeypatch):
    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    (tmp_path / "results").mkdir()
    monkeypatch.setenv("REPRO_ROOT", str(tmp_path))
    code = ("import sys, time; from repro import results\n"
            "with results.record_lock(sys.argv[1], 'box', 'gemm'):\n"
            "    print('held', flush=True); time.sleep(60)\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], env=env,
                         stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(results.Busy, match=rf"\(pid {p.pid}, lock "):
            with results.record_lock(tmp_path, "box", "gemm"):
                pass
    finally:
        p.kill()
        p.wait()
    with results.record_lock(tmp_path, "box", "gemm"):
        pass


# ------------------------------------------------------------ Ctrl-C in a busy main thread

STUCK = """
import os, signal, sys, time
from repro import results
from repro.cli import Interrupts
it = Interrupts(every=0.2, grace=1.0).install()
it.command = "record"
tmp = sys.argv[1]
open(tmp, "w").write("{")  # a record file being written
results.IN_FLIGHT.add(tmp)
print("ready", flush=True)
t0 = time.monotonic()
while True:  # every KeyboardInterrupt is lost, as in a long compiled call
    try:
        time.sleep(0.01)
        if time.monotonic() - t0 > 30:
            break
    except KeyboardInterrupt:
        pass
print("not interrupted", flush=True)
"""


@pytest.mark.parametrize("sig, says", [
    (signal.SIGINT, "repro: interrupted; finished cells are kept: rerun the same command to "
     "resume (exited 1 s after Ctrl-C: the main thread was busy in a compiled call)"),
    (signal.SIGTERM, "repro: stopped by SIGTERM; finished cells are kept: rerun the same "
     "command to resume (exited 1 s after SIGTERM: the main thread was busy in a compiled "
     "call)")])
def test_a_ctrl_c_the_main_thread_cannot_handle_ends_the_process_within_the_grace(tmp_path,
                                                                                 sig, says):
    tmp = tmp_path / ".x.json.abc.tmp"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", STUCK, str(tmp)], env=env, text=True,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert p.stdout.readline().strip() == "ready"
    time.sleep(0.5)  # into the loop
    t0 = time.monotonic()
    p.send_signal(sig)
    out, err = p.communicate(timeout=30)
    assert p.returncode == 128 + sig and time.monotonic() - t0 < 10, (out, err)
    assert "not interrupted" not in out
    assert err.strip().splitlines()[-1] == says
    assert not tmp.exists()  # the cell being written is discarded


# ------------------------------------------------- SIGTERM and SIGHUP, as Ctrl-C is handled

KILLED_MID_WRITE = """
import json, sys, time, types
from repro import cli, hardware, results, studies
from repro.studies import runner

record = dict(json.loads(sys.argv[1]), hardware="test-box")
def cell(name):
    return runner.Cell(name, lambda left: [dict(record, recipe=name)])
mod = types.ModuleType("toy_study")
mod.STUDY = runner.Study("gemm", (), lambda p: [cell(n) for n in "abc"], section=None,
                         module="repro.results")
sys.modules["toy_study"] = mod
studies.EXPERIMENTS = {"gemm": "toy_study"}
studies.params = lambda name, profile=None, raw=None: None
studies.check_params = lambda name, raw=None: None
hardware.detect = lambda: hardware.lookup("cpu")
real_dump = results.json.dump
def dump(obj, f, **kw):  # the second cell's write stops halfway: the signal lands there
    if obj[0]["recipe"] == "b":
        f.write("[{")
        f.flush()
        print("writing", flush=True)
        time.sleep(60)
    return real_dump(obj, f, **kw)
results.json.dump = dump
sys.argv = ["repro", "record", "gemm", "--profile", "smoke", "--hardware", "test-box"]
sys.exit(cli.main())
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_kill_during_a_write_leaves_the_finished_cells_and_nothing_else(tmp_path, sig):
    """What ``timeout``, ``docker stop`` or a batch scheduler send (SIGTERM), or a closed
    terminal (SIGHUP), ends ``repro record`` as Ctrl-C does: the cell in flight is abandoned,
    its temporary file removed, one line says what was kept, and the exit status is
    128 + the signal's number. What is left loads as exactly the finished cells."""
    from repro import evidence

    (tmp_path / "params.yaml").write_text("profile: smoke\n")
    (tmp_path / "results").mkdir()
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "REPRO_ROOT": str(tmp_path),
           "PYTHONPATH": str(ROOT)}
    p = subprocess.Popen([sys.executable, "-c", KILLED_MID_WRITE, json.dumps(GEMM_RECORD)],
                         cwd=tmp_path, env=env, text=True, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, start_new_session=True)
    try:
        line = p.stdout.readline()
        while line and line.strip() != "writing":
            line = p.stdout.readline()
        assert line.strip() == "writing", p.stderr.read()
        p.send_signal(sig)
        out, err = p.communicate(timeout=60)
    finally:
        p.kill()
    name = signal.Signals(sig).name
    assert p.returncode == 128 + sig, (p.returncode, err)
    assert err.strip().splitlines()[-1] == (f"repro: stopped by {name}; finished cells are "
                                            "kept: rerun the same command to resume"), err
    assert "Traceback" not in err
    cells = tmp_path / "build" / "results" / "test-box" / "gemm"
    assert sorted(p.name for p in cells.iterdir()) == ["a.json"]
    df = evidence.load_records(roots=tmp_path / "build" / "results")
    assert list(df.recipe) == ["a"]


# ------------------------------------------------------------- a terminal that is not UTF-8


def test_output_survives_a_terminal_that_is_not_utf8():
    """The ledger has dashes and arrows beyond ASCII: on a terminal that cannot show them (the
    C locale, without Python's UTF-8 mode) they are written as escapes (``\\u2014``), not a
    crash."""
    env = {"LC_ALL": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0"}
    r = subprocess.run([sys.executable, "-m", "repro.cli", "claims"], cwd=ROOT,
                       env={**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(ROOT),
                            **env}, capture_output=True, timeout=300)
    assert r.returncode == 0, r.stderr.decode("ascii", "backslashreplace")
    out = r.stdout.decode("ascii")  # nothing but ASCII reached the terminal
    assert "\\u2014" in out and "A1" in out
