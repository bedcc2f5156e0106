"""Claim B6's inference half: FP8 / INT8 serving of a BF16-trained LM (notebook 11).

The accuracy parts are parity claims with one equivalence margin per format, fixed in B6's
definition (``repro/data/claims.yaml``) on the relative held-out loss gap (format - BF16) / BF16
with its 95% t-interval [lo, hi] over seeds: **kept** if hi <= high, **lost** if lo > high,
**inconclusive** when the interval straddles high (too wide to tell).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pandas as pd

from repro.verdict import UNSURE, Verdict, margin
from repro.verdict import rule as rule_of
from repro.experiments.inference.tables import best_evidence, widest_timed

SOURCE = "results/*/inference/*.json (notebooks/11_inference.py)"
LABEL = {True: "pass", False: "FAIL", None: "n/a", UNSURE: "inconclusive"}


def b6_margins(rule=None) -> dict[str, tuple[float, float]]:
    """B6's margin per format of its rule, from its definition."""
    return {f: margin("B6", f) for f in rule_of("B6", rule)["formats"]}


def at_config(spd: pd.DataFrame, config) -> pd.DataFrame:
    """The speed rows a rule's ``config`` judges, of records that ran on tensor cores (not
    emulated): ``widest`` (each format at the widest config it was timed at,
    :func:`~repro.experiments.inference.tables.widest_timed`) or ``{d_model: N}`` (every format
    there)."""
    if config == "widest":
        return widest_timed(spd)
    real = spd[~spd["emulated"].astype(bool)] if len(spd) else spd
    return real[real["d_model"] == config["d_model"]] if len(real) else real


def _part(ok: bool | str | None, text: str) -> dict:
    return {"ok": ok, "text": text}


def _accuracy_parts(acc: pd.DataFrame, bounds: Mapping[str, Sequence[float]],
                    min_seeds: int) -> list[dict]:
    """One part per format of ``bounds`` (a format name -> its margin), judged from
    ``min_seeds`` seeds (a t-interval needs two to be shown at all)."""
    parts = []
    for fmt, (_, high) in bounds.items():
        r = acc[acc["format"] == fmt]
        if r.empty or int(r["n_seeds"].iloc[0]) < 2:
            parts.append(_part(None, f"{fmt.upper()} accuracy not measured"))
            continue
        r = r.iloc[0]
        ok = (None if r["n_seeds"] < min_seeds else True if r["rel_hi"] <= high
              else False if r["rel_lo"] > high else UNSURE)
        parts.append(_part(ok, f"{fmt.upper()} held-out loss {100 * r['rel_gap']:+.2f}% vs "
                               f"BF16 (95% CI {100 * r['rel_lo']:+.2f}% .. "
                               f"{100 * r['rel_hi']:+.2f}%, {int(r['n_seeds'])} seeds, "
                               f"margin {100 * high:.1f}%)"))
    return parts


def _prefill_part(wide: pd.DataFrame, fmt: str, target: float) -> dict:
    r = wide[(wide["format"] == fmt) & (wide["phase"] == "prefill")] if len(wide) else wide
    return _part(None, f"{fmt.upper()} prefill not measured") if r.empty else _part(
        bool(r["speedup"].iloc[0] >= target),
        f"{fmt.upper()} prefill {r['speedup'].iloc[0]:.2f}x BF16 at d_model "
        f"{int(r['d_model'].iloc[0])} (target {target}x)")


def judged_fp8(acc: pd.DataFrame, spd: pd.DataFrame, high: float, rule=None) -> str:
    """The FP8 weights+activations format B6 judges: its rule's ``fp8_formats``, the first
    whose accuracy (FP8's margin) AND prefill both pass where it says ``first-passing``
    (else the first of them), the first alone where it says ``one``: a recipe passes on its
    own numbers, never on the accuracy of one and the speed of another."""
    r = rule_of("B6", rule)
    fmts = r["fp8_formats"]
    if r["combine"] != "first-passing":
        return fmts[0]
    wide = at_config(spd, r["config"])
    for fmt in fmts:
        a = _accuracy_parts(acc, {fmt: (-high, high)}, r["min_seeds"])[0]
        if a["ok"] is True and _prefill_part(wide, fmt, r["prefill"])["ok"] is True:
            return fmt
    return fmts[0]


def _speed_parts(spd: pd.DataFrame, fp8: str, r, stale: int = 0) -> list[dict]:
    wide = at_config(spd, r["config"])
    if wide.empty:
        return [_part(None, f"speed stale: {stale} record(s) of older code left out, none fresh"
                      if stale else
                      "speed not measured on tensor cores (emulated or no records)")]
    parts = [_prefill_part(wide, fp8, r["prefill"])]
    fmts, batch, target = (r["decode"][k] for k in ("formats", "batch", "target"))
    for f in fmts:
        r = wide[(wide["format"] == f) & (wide["phase"] == "decode") & (wide["batch"] == batch)]
        parts.append(_part(None, f"{f} decode not measured") if r.empty else _part(
            bool(r["speedup"].iloc[0] >= target),
            f"{f} decode {r['speedup'].iloc[0]:.2f}x BF16 at batch {batch}, d_model "
            f"{int(r['d_model'].iloc[0])} (target {target}x)"))
    return parts


def common_config_caveat(spd: pd.DataFrame, fp8: str, rule=None) -> str:
    """Where the rule judges each format at the widest config it was timed at and those
    differ: the speed parts at the widest d_model where every judged format was timed on
    tensor cores (the ledger's caveat: what the formats give at one common config)."""
    r = rule_of("B6", rule)
    if r["config"] != "widest" or not len(spd):
        return ""
    real = spd[~spd["emulated"].astype(bool)]
    fmts, batch = r["decode"]["formats"], r["decode"]["batch"]
    want = [(fp8, "prefill")] + [(f, "decode") for f in fmts]

    def timed(f, phase):
        g = real[(real["format"] == f) & (real["phase"] == phase)]
        return set(g[g["batch"] == batch]["d_model"]) if phase == "decode" else set(g["d_model"])

    sets = [timed(f, ph) for f, ph in want]
    common = set.intersection(*sets) if sets else set()
    if not common or all(max(x) == max(common) for x in sets):
        return ""
    d = max(common)
    parts = [p["text"].split(" BF16")[0] for p in _speed_parts(spd, fp8, {**r, "config":
                                                                         {"d_model": d}})]
    return (f"at d_model {int(d)}, the widest every format was timed at: " + ", ".join(parts)
            + f" (targets {r['prefill']}x, {r['decode']['target']}x)")


def decode_by_width(spd: pd.DataFrame, rule=None) -> str:
    """The weight-only formats' batch-1 decode speedups at every config timed on tensor
    cores, narrowest first: where the decode target holds and where it does not."""
    fmts, batch = (rule_of("B6", rule)["decode"][k] for k in ("formats", "batch"))
    real = spd[~spd["emulated"].astype(bool)] if len(spd) else spd
    out = []
    for f in fmts:
        r = real[(real["format"] == f) & (real["phase"] == "decode") & (real["batch"] == batch)
                 ] if len(real) else real
        if len(r):
            r = r.sort_values("d_model")
            out.append(f"{f} " + ", ".join(f"{v:.2f}x at {int(d)}" for v, d in
                                           zip(r["speedup"], r["d_model"])))
    return f"batch-{batch} decode by d_model: " + "; ".join(out) if out else ""


def _bytes_parts(mem: pd.DataFrame, targets: Mapping[str, float]) -> list[dict]:
    parts = []
    for fmt, limit in targets.items():
        r = mem[mem["format"] == fmt]
        parts.append(_part(None, f"{fmt} bytes not measured") if r.empty else _part(
            bool(r["ratio_to_bf16"].iloc[0] <= limit),
            f"{fmt} weights {r['ratio_to_bf16'].iloc[0]:.3f}x BF16 (target <= {limit}x)"))
    return parts


def _combine(oks: list[bool | str | None]) -> str:
    """Every part passes: reproduced; every part fails or is undecided (one at least fails):
    contradicted; every part passes or is undecided: inconclusive; otherwise partly."""
    if all(o is True for o in oks):
        return "reproduced"
    if False in oks and all(o is False or o == UNSURE for o in oks):
        return "contradicted"
    if all(o is True or o == UNSURE for o in oks):
        return "inconclusive"
    return "partly"


def b6(acc: pd.DataFrame, mem: pd.DataFrame, spd: pd.DataFrame,
       bounds: Mapping[str, Sequence[float]] | None = None, rule=None,
       stale_speed: int = 0) -> Verdict:
    """B6's inference half from ``repro.experiments.inference.tables``'s ``accuracy_table``,
    ``bytes_table`` and ``speed_table`` (best evidence of each: full profile, a GPU; memory
    and speed on the hardware of the accuracy records, so that one machine decides the claim).

    Parts: FP8 and INT8 held-out loss within their margins of BF16 (``bounds`` per format,
    else B6's; >= 3 seeds); FP8 prefill >= 1.3x BF16 and weight-only FP8 / INT8 decode at
    batch 1 >= 1.5x, each at the format's widest config timed, from records whose products
    ran on tensor cores (not emulated); weight bytes <= 0.52x (FP8/INT8 weight-only) and <= 0.30x (NVFP4)
    of BF16 over the whole model. All parts pass: **reproduced**; all fail: **contradicted**;
    none fails but an accuracy interval is too wide to tell: **inconclusive**; otherwise (a
    part failed or was not measured): **partly**. No accuracy records, or smoke records only:
    **not yet measured**. The thresholds, formats and config are B6's ``rule``
    (``repro/data/claims.yaml``); ``stale_speed``: how many speed records were left out as
    stale (the speed part then says "stale", not "not measured").
    """
    r = rule_of("B6", rule)
    bounds = b6_margins(r) if bounds is None else bounds
    acc = best_evidence(acc)
    hw = str(acc["hardware"].iloc[0]) if len(acc) else None
    mem, spd = best_evidence(mem, hw), best_evidence(spd, hw)  # one claim, one machine
    if acc.empty:
        return Verdict("B6", "not yet measured", "no inference accuracy records", "", SOURCE)
    slot = r["formats"][0]  # the margin of FP8 weights and activations
    fp8 = judged_fp8(acc, spd, bounds[slot][1], r)
    own = {(fp8 if f == slot else f): b for f, b in bounds.items()}
    judged = (_accuracy_parts(acc, own, r["min_seeds"])
              + _speed_parts(spd, fp8, r, stale_speed))  # the key number's parts
    parts = judged + _bytes_parts(mem, r["bytes"])
    verdict = _combine([p["ok"] for p in parts])
    key = "; ".join(p["text"] for p in judged)
    # what decides: the first judged part that fails, else one that cannot tell
    decides = next((p["text"] for want in (False, UNSURE, None) for p in judged
                    if p["ok"] is want or (want == UNSURE and p["ok"] == UNSURE)), "") \
        if verdict != "reproduced" else ""
    smoke = acc["profile"].iloc[0] != "full"
    if smoke:
        key = f"smoke records only ({verdict} as a pipeline check, not evidence): {key}"
        verdict = "not yet measured"
    speed_hw = "" if spd.empty else str(spd["hardware"].iloc[0])
    wide = at_config(spd, r["config"])
    others = [_prefill_part(wide, f, r["prefill"])["text"]
              for f in list(r["fp8_formats"]) + list(r.get("shown", [])) if f != fp8]
    how = (f"the first of {', '.join(r['fp8_formats'])} whose accuracy and prefill both pass, "
           "else the first" if r["combine"] == "first-passing" else "the rule's one format")
    note = ("inference half of B6 (FP4 training: B4). Accuracy: the same BF16-trained "
            "checkpoint per seed, exported with qwix, step picked by held-out loss. "
            f"FP8 weights and activations judged as {fp8} ({how}"
            + (f"; also timed: {'; '.join(others)}" if others else "") + "). "
            + (f"{decode_by_width(spd, r)}. " if decode_by_width(spd, r) else "")
            + ("Smoke records only: a pipeline check, not evidence. " if smoke else "")
            + "; ".join(f"{LABEL[p['ok']]}: {p['text']}" for p in parts))
    return Verdict("B6", verdict, key, hw if speed_hw in ("", hw) else f"{hw}, {speed_hw}",
                   SOURCE, note, bool(acc[acc["format"].isin(own)]["emulated"].any()),
                   caveat=common_config_caveat(spd, fp8, r), decides=decides)
