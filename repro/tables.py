"""The text tables ``repro`` prints: the claims ledger, the hardware and the recipe registry."""

from __future__ import annotations

import shutil
import textwrap
from collections import Counter
from typing import Any


def ledger(rows: list[dict[str, Any]], width: int | None = None) -> str:
    """The ledger for a terminal: one block per claim (verdict, hardware, key number, caveat,
    record), stale verdicts marked as on the ledger's page (" — stale", and the mark of the stale
    note that follows the ledger, one per notebook)."""
    from repro.claims.ledger import CHANGED, LEGEND, VERDICTS, caveat, changed, first_rule, \
        stale_mark, stale_notes

    width = width or min(shutil.get_terminal_size((100, 24)).columns, 120)
    counts = Counter(r["verdict"] for r in rows)
    head = ", ".join(f"{counts[v]} {v}" for v in VERDICTS if counts[v])
    out = [f"claims ledger: {len(rows)} claims ({head})", ""]
    vw = max(len(v) for v in VERDICTS)

    def wrap(label: str, text: str) -> list[str]:
        return textwrap.wrap(f"{label}{text}", width=width, initial_indent="     ",
                             subsequent_indent="       ")

    for r in rows:
        hw = f"  on {r['hardware']}" if r["hardware"] else ""
        emu = "  (emulated)" if r.get("emulated") else ""
        verdict = r["verdict"] + (f" {CHANGED}" if changed(r) else "") + (
            f" first rule: {first_rule(r)}" if first_rule(r) else "")
        out.append(f"{r['claim']:<4} {verdict:<{vw + 2}}{hw}{emu}{stale_mark(r)}")
        out += wrap("", r["statement"])
        if r["key_number"]:
            out += wrap("key number: ", r["key_number"])
        if cav := caveat(r):
            out += wrap("caveat: ", cav)
        if r["source"]:
            out += wrap("record: ", r["source"])
        out += wrap("notebook: ", f"notebooks/{r['notebook']}.py" if r["notebook"]
                    else "none (not tested in this repository)")
    if any(changed(r) for r in rows):
        out += [""] + textwrap.wrap(LEGEND, width=width)
    notes = stale_notes(rows)
    if notes:
        out += ["", "stale records:"]
        for mark, text in notes.items():
            out += textwrap.wrap(f"[{mark}] {text}", width=width, initial_indent="  ",
                                 subsequent_indent="       ")
    return "\n".join(out)


def hardware() -> str:
    """The detected hardware, then the datasheet registry (dense TFLOP/s, TB/s)."""
    from repro import hardware as hw

    info = hw.detect()
    yes = {True: "yes", False: "no"}
    out = [f"detected: {info.slug} ({info.name}), backend {info.backend}, compute capability "
           f"{info.compute_capability or '-'}, native FP8 {yes[info.has_fp8]}, "
           f"native FP4 {yes[info.has_fp4]}, native INT8 {yes[info.has_int8]}", "",
           "registry (repro/data/hardware.yaml): datasheet dense TFLOP/s (int8: TOP/s), TB/s; "
           "-: no tensor-core / matrix-unit support, blank: not listed"]
    kinds = ["fp4", "fp8", "int8", "bf16", "fp16", "tf32", "fp32"]
    out.append(f"{'slug':<10} {'backend':>7} {'cc':>5} " + " ".join(f"{k:>7}" for k in kinds)
               + f" {'TB/s':>6} {'GiB':>5}  name")

    def fmt(v):
        return "-" if v is None else f"{v:g}"

    for slug in hw.registry():
        e = hw.lookup(slug)
        peaks = e.peak_tflops
        out.append(f"{slug:<10} {e.backend:>7} {e.compute_capability or '-':>5} "
                   + " ".join(f"{fmt(peaks[k]) if k in peaks else '':>7}" for k in kinds)
                   + f" {fmt(e.memory_bandwidth_tbs):>6} {fmt(e.memory_gib):>5}  {e.name}")
    return "\n".join(out)


def recipes() -> str:
    """The precision registry (``repro.precision.REGISTRY``), one row per entry."""
    from repro.precision.recipes import REGISTRY

    cols = ("name", "family", "gemm", "scaling", "backend", "scope", "storage", "about")
    rows = [(r.name, r.family, r.gemm, r.scaling, r.backend, r.scope, r.master_weights, r.about)
            for r in REGISTRY.values()]
    widths = [max(len(c), *(len(str(row[i])) for row in rows)) for i, c in enumerate(cols[:-1])]
    return "\n".join("  ".join([*(str(v).ljust(w) for v, w in zip(row, widths)), str(row[-1])])
                     for row in [cols, *rows])
