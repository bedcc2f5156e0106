"""The committed records' program fingerprints recompute on this CPU: the program a GPU traced
when it recorded (or a backfill traced at the record's commit) is the program this checkout
traces for that GPU now.

A record is judged fresh without a retrace while the files its trace ran are unchanged, or
where the committed program index (or this machine's cache) says HEAD's program is its own;
this test retraces a sample of the fresh records from scratch (a different sample each day,
the same for every run of a day) and requires the stored hash.
"""

import datetime
import json
import random

import pytest

from repro import program as P
from repro import checkout, provenance, results, studies

MIN_RECORDS = 20  # fresh records whose programs each run retraces, at least
MIN_PROGRAMS = 3  # and distinct programs, at least (records of one cell share one)


def fresh_programs() -> dict[tuple, list[dict]]:
    """{(experiment, cell, key, platform, device kind, profile, hash, kit): its records} of
    every committed record the checker finds fresh by its program (the index or this
    machine's cache standing in for a trace), judged as the checker judges it (a record
    made with its platform's JAX by its lock fingerprint)."""
    check = studies.checker(trace=False)
    out: dict[tuple, list[dict]] = {}
    for path in sorted(results.results_dir().glob("*/*/*.json")):
        for rec in json.loads(path.read_text()):
            prog = rec.get("program") if isinstance(rec, dict) else None
            if not isinstance(prog, dict) or results.defect_of(rec) or check(rec).stale:
                continue
            prog = provenance.judged_program(prog, check._env["jax"])
            if prog.get("jax") and prog["jax"] != check._env["jax"]:
                continue  # no fingerprint this JAX can recompute (the checker says so)
            key = (rec["experiment"], prog["cell"], prog.get("key") or "", prog["platform"],
                   prog.get("device_kind") or "", rec.get("profile") or "full",
                   prog["hash"], prog["kit"])
            out.setdefault(key, []).append(rec)
    return out


def sample(programs: dict[tuple, list[dict]], seed: int) -> list[tuple]:
    """Programs drawn at random (``seed``) until they hold MIN_RECORDS records and
    MIN_PROGRAMS programs."""
    keys = sorted(programs)
    random.Random(seed).shuffle(keys)
    chosen, n = [], 0
    for k in keys:
        if n >= MIN_RECORDS and len(chosen) >= MIN_PROGRAMS:
            break
        chosen.append(k)
        n += len(programs[k])
    return chosen


def wrong_programs(keys: list[tuple]) -> list[str]:
    """Each program of ``keys`` traced anew here (no index, no cache), against its records'
    hash and kit: the ones that differ."""
    check = studies.checker()
    wrong = []
    for exp, cell, key, platform, kind, profile, digest, kit in keys:
        progs = check.cell_programs(exp, cell, profile, platform, kind)
        assert not isinstance(progs, str), f"{exp}/{cell}: {progs}"
        traced = P.trace(progs.get(key, progs.get("")), platform, kind)
        if (traced.hash, traced.kit) != (digest, kit):
            wrong.append(f"{exp}/{cell} [{key}] on {platform}: {traced.hash}/{traced.kit}, "
                         f"recorded {digest}/{kit}")
    return wrong


def test_committed_programs_recompute_on_this_cpu():
    """A different sample each day (the same for every run of a day), of at least
    MIN_RECORDS fresh records: none may pass because nothing was checked."""
    programs = fresh_programs()
    day = datetime.datetime.now(datetime.timezone.utc).date().toordinal()
    keys = sample(programs, day)
    checked = sum(len(programs[k]) for k in keys)
    assert checked >= MIN_RECORDS and len(keys) >= MIN_PROGRAMS, (
        f"only {checked} fresh record(s) in {len(keys)} program(s) to check")
    assert not (wrong := wrong_programs(keys)), "; ".join(wrong)


def test_a_planted_wrong_fingerprint_is_found():
    programs = fresh_programs()
    key = min(programs, key=lambda k: (k[0] != "mlp_step", k))  # a cheap one to trace
    planted = (*key[:6], "0" * 16, key[7])
    assert wrong_programs([planted]) and not wrong_programs([key])


def test_the_committed_program_index_is_current():
    """Every entry of ``results/programs/index.json`` made with this JAX still matches the
    files its trace ran: otherwise each fresh clone retraces those programs in every notebook
    (minutes on 2 cores). After an edit to a file a recorded program ran, refresh it with
    ``repro status --write-index``."""
    path = checkout.CHECKOUT.joinpath(*provenance.PROGRAM_INDEX)
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
    check = studies.checker()
    tpu = check.cell_programs("mlp_step", "w1024_b65536_d3", "full", "tpu", "TPU v5 lite")
    gpu = check.cell_programs("mlp_step", "w1024_b65536_d3", "full", "gpu", "NVIDIA H200")
    assert not isinstance(tpu, str) and not isinstance(gpu, str), (tpu, gpu)

    def digest(progs, key, platform, kind):
        return P.trace(progs[key], platform, kind).hash

    assert digest(tpu, "fp8-auto", "tpu", "TPU v5 lite") == \
        digest(tpu, "bf16", "tpu", "TPU v5 lite")
    assert digest(gpu, "fp8-auto", "gpu", "NVIDIA H200") != \
        digest(gpu, "bf16", "gpu", "NVIDIA H200")
