"""The committed records' program fingerprints recompute on this CPU: the program a GPU traced
when it recorded (or a backfill traced at the record's commit) is the program this checkout
traces for that GPU now.

A record whose traced files are all unchanged is trusted without a retrace
(:meth:`repro.provenance.Checker.unchanged`); this test retraces a sample of them (a different
sample each day, the same for every run of a day) and requires the stored hash.
"""

import datetime
import json
import random

import pytest

from repro import program as P
from repro import provenance, results

SAMPLE = 6  # distinct programs a run retraces (each takes a second or a few on 2 cores)


def trusted_programs() -> list[tuple]:
    """(experiment, cell, key, platform, device kind, hash, kit) of every committed record
    whose program a Checker trusts without tracing."""
    check = provenance.Checker(trace=False)
    out = set()
    for path in sorted(results.results_dir().glob("*/*/*.json")):
        for rec in json.loads(path.read_text()):
            prog = rec.get("program") if isinstance(rec, dict) else None
            if not isinstance(prog, dict) or results.defect_of(rec):
                continue
            if prog.get("jax") and prog["jax"] != check._env["jax"]:
                continue  # traced with its platform's JAX: verified there, not here
            if check.unchanged(prog.get("files") or {}, prog.get("python")):
                out.add((rec["experiment"], prog["cell"], prog.get("key") or "",
                         prog["platform"], prog.get("device_kind") or "", prog["hash"],
                         prog["kit"], rec.get("profile") or "full"))
    return sorted(out)


def test_committed_programs_recompute_on_this_cpu():
    programs = trusted_programs()
    if not programs:
        pytest.skip("no committed record carries a program fingerprint")
    day = datetime.datetime.now(datetime.timezone.utc).date().toordinal()
    sample = random.Random(day).sample(programs, min(SAMPLE, len(programs)))
    check = provenance.Checker()
    wrong = []
    for exp, cell, key, platform, kind, digest, kit, profile in sample:
        progs = check.cell_programs(exp, cell, profile)
        assert not isinstance(progs, str), f"{exp}/{cell}: {progs}"
        traced = P.trace(progs.get(key, progs.get("")), platform, kind)
        if (traced.hash, traced.kit) != (digest, kit):
            wrong.append(f"{exp}/{cell} [{key}]: {traced.hash}/{traced.kit}, recorded "
                         f"{digest}/{kit}")
    assert not wrong, "; ".join(wrong)


def test_the_committed_program_index_is_current():
    """Every entry of ``results/programs/index.json`` made with this JAX still matches the
    files its trace ran: otherwise each fresh clone retraces those programs in every notebook
    (minutes on 2 cores). After an edit to a file a recorded program ran, refresh it with
    ``repro status --write-index``."""
    path = provenance.CHECKOUT.joinpath(*provenance.PROGRAM_INDEX)
    if not path.is_file():
        pytest.skip("no committed program index")
    check = provenance.Checker(trace=False)
    index = json.loads(path.read_text())
    outdated = sorted(name for name, entry in index.items()
                      if entry.get("jax") == check._env["jax"] and not check._valid(entry))
    assert not outdated, (f"{len(outdated)} index entr(ies) outdated, e.g. {outdated[:3]}: "
                          "run `repro status --write-index`")


def test_a_cell_program_is_built_for_the_records_device():
    """fp8-auto chooses its layers' formats as its program is built: for a TPU (no FP8
    arithmetic) every layer stays BF16, so its program is bf16's; for a GPU it is not."""
    check = provenance.Checker()
    tpu = check.cell_programs("mlp_step", "w1024_b65536_d3", "full", "tpu", "TPU v5 lite")
    gpu = check.cell_programs("mlp_step", "w1024_b65536_d3", "full", "gpu", "NVIDIA H200")
    assert not isinstance(tpu, str) and not isinstance(gpu, str), (tpu, gpu)

    def digest(progs, key, platform, kind):
        return P.trace(progs[key], platform, kind).hash

    assert digest(tpu, "fp8-auto", "tpu", "TPU v5 lite") == \
        digest(tpu, "bf16", "tpu", "TPU v5 lite")
    assert digest(gpu, "fp8-auto", "gpu", "NVIDIA H200") != \
        digest(gpu, "bf16", "gpu", "NVIDIA H200")
