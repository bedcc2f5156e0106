"""Claims A1-A4 and A9: FP8 RL speed, memory and storage (notebook 03)."""

from __future__ import annotations

import pandas as pd

from repro.claims.verdicts._base import Verdict, _hw

RL_SPEED_SOURCE = "results/*/rl_throughput (env_steps_per_s, update_time_ms)"
RL_MEMORY_SOURCE = "results/*/rl_throughput (fp8_stores, update_memory_bytes)"
RL_NOTE = "notebook 03_rl_throughput"
A2_TARGET = 1.6     # the seed's "up to 1.6x" (FP8 over FP16, whole PPO loop)
A2_FASTER = 1.1     # below this FP8 is not called faster


def _native(sp: pd.DataFrame, baseline: str, mlp_only: bool = True) -> pd.DataFrame:
    """Ratios of non-emulated cells recorded in one GPU call (``same_commit``)."""
    if not len(sp):
        return sp
    keep = (~sp.emulated) & (sp.baseline == baseline) & sp.same_commit
    if mlp_only:
        keep &= sp.network == "mlp"
    return sp[keep]


def a1(stores: pd.DataFrame) -> Verdict:
    """A1 from ``repro.analysis.rl.fp8_stores``: how many of the four A1 stores (parameters,
    GEMM activations, GEMM gradients, the optimizer update) the most-FP8 variant keeps in FP8:
    4 reproduced, 2-3 partly, fewer contradicted."""
    if not len(stores):
        return Verdict("A1", "not yet measured", "no stores record", "none", RL_MEMORY_SOURCE,
                       RL_NOTE)
    best = stores.loc[stores["stores"].idxmax()]
    n = int(best["stores"])
    v = "reproduced" if n == 4 else "partly" if n >= 2 else "contradicted"
    key = (f"at most {n} of 4 A1 stores in FP8 (variant {best['variant']}); optimizer "
           "moments and update arithmetic stay FP32; FP8 weight storage held in a BF16 container")
    return Verdict("A1", v, key, str(best["hardware"]), RL_MEMORY_SOURCE, RL_NOTE,
                   numbers={"fp8_stores": n})


def a2(sp: pd.DataFrame) -> Verdict:
    """A2 from ``repro.analysis.rl.speedups`` (FP8 recipes over FP16, MLP): per hardware,
    reproduced if the whole PPO loop reaches 1.6x somewhere ("up to"), partly if only the
    update alone does or the loop is >= 1.1x faster, contradicted otherwise. "Up to" is
    met by any hardware: the best verdict of the hardware measured is the claim's."""
    real = _native(sp, "fp16")
    if not len(real):
        return Verdict("A2", "not yet measured",
                       "no FP8/FP16 ratio of native records made in one GPU call (emulated, "
                       "stale and unpaired cells do not count)", _hw(sp),
                       RL_SPEED_SOURCE, RL_NOTE)
    lines, verdicts, numbers = [], [], {}
    for h, g in real.groupby("hardware"):
        nmax = g.num_envs.max()
        best = g[g.num_envs == nmax].groupby("width")[["e2e", "update"]].max()
        e2e_max, upd_max = g.e2e.max(), g["update"].max()
        widths_ok = best.index[best.e2e >= A2_TARGET].tolist()
        if e2e_max >= A2_TARGET:
            verdicts.append("reproduced")
        elif upd_max >= A2_TARGET or e2e_max >= A2_FASTER:
            verdicts.append("partly")
        else:
            verdicts.append("contradicted")
        top = g.loc[g.e2e.idxmax()]
        numbers[h] = {"fp8_fp16_e2e_max": e2e_max, "fp8_fp16_update_max": upd_max}
        lines.append(f"{h}: FP8/FP16 whole loop up to {e2e_max:.2f}x (width {int(top.width)},"
                     f" {int(top.num_envs)} envs), update alone up to {upd_max:.2f}x; "
                     f">= 1.6x end to end at widths {widths_ok or 'none'}")
    order = ["reproduced", "partly", "contradicted"]
    return Verdict("A2", min(verdicts, key=order.index), "; ".join(lines), _hw(real),
                   RL_SPEED_SOURCE, RL_NOTE, numbers=numbers)


def a3(projection: pd.DataFrame, bandwidth_ratio: float, fp16_ratio: float,
       fp8_ceiling: float) -> Verdict:
    """A3 is always a projection (no A100 measured): the measured FP8/FP16 ratio times the
    H100/A100 FP16 datasheet ratios (``repro.analysis.rl.a3_projection``: columns ``lo``,
    ``hi``), or the datasheet bounds alone without measured ratios."""
    if len(projection):
        b = projection.loc[projection.hi.idxmax()]
        key = (f"projected {b.lo:.1f}-{b.hi:.1f}x at width {int(b.width)} ({b.hardware} "
               f"FP8/FP16 {b.e2e:.2f}x x H100/A100 FP16 {bandwidth_ratio:.2f}-"
               f"{fp16_ratio:.2f}x); seed claims 2.8x")
        hw = _hw(projection) + " -> a100-sxm (datasheet)"
        numbers = {"projected_lo": b.lo, "projected_hi": b.hi, "measured_fp8_fp16": b.e2e}
    else:
        key = (f"datasheet bounds only: {bandwidth_ratio:.2f}x (bandwidth) to "
               f"{fp8_ceiling:.2f}x (H100 FP8 peak / A100 FP16 peak); seed claims 2.8x")
        hw = "datasheets h100-sxm, a100-sxm"
        numbers = {"projected_lo": bandwidth_ratio, "projected_hi": fp8_ceiling}
    return Verdict("A3", "projected", key, hw,
                   "repro/data/hardware.yaml + results/*/rl_throughput",
                   "PROJECTION from datasheet ratios; no A100 measured", numbers=numbers)


#: A4's FP8 recipes: the default and the one that trades a read of the gradient for memory
A4_FP8 = ("fp8-delayed", "fp8-lean")
#: A4's baseline: FP16 as the claim has it, else BF16 (the same bytes)
A4_BASE = ("fp16", "bf16")


def a4(memory: pd.DataFrame) -> Verdict:
    """A4 from the throughput table's ``update_memory_bytes``: each FP8 recipe of
    :data:`A4_FP8` over the 16-bit baseline (:data:`A4_BASE`) at the widest MLP and most envs
    of each hardware (native records only). The leaner FP8 recipe decides (the claim is that
    FP8 can save memory; the key number names every recipe's ratio): reproduced <= 0.9,
    partly < 1.0, contradicted otherwise."""
    rows = []  # (hardware, baseline, {recipe: ratio}, {recipe: emulated}, width)
    mlp = memory[memory.network == "mlp"] if len(memory) else memory
    for h, g in (mlp.groupby("hardware") if len(mlp) else []):
        top = g[g.width == g.width.max()]
        top = top[top.num_envs == top.num_envs.max()].set_index("recipe")
        base = next((b for b in A4_BASE if b in top.index), None)
        fp8 = [r for r in A4_FP8 if r in top.index]
        if base is None or not fp8:
            continue
        mem = top["update_memory_bytes"]
        rows.append((h, base, {r: mem[r] / mem[base] for r in fp8},
                     {r: bool(top.loc[r, "emulated"]) for r in fp8}, int(g.width.max())))
    real = [(h, b, {r: x for r, x in ratios.items() if not emu[r]}, w)
            for h, b, ratios, emu, w in rows if not all(emu.values())]
    if not real:
        note = ""
        if rows:
            h, b, ratios, _, _ = rows[0]
            note = f" (emulated: FP8/{b.upper()} = {min(ratios.values()):.2f} on {h})"
        return Verdict("A4", "not yet measured", "no native-FP8 memory record" + note,
                       ", ".join(r[0] for r in rows) or "none", RL_MEMORY_SOURCE, RL_NOTE)

    def key(h, b, ratios, w):
        best = min(ratios, key=ratios.get)
        text = f"{h}: update memory FP8/{b.upper()} = {ratios[best]:.2f} at width {w}"
        others = [f"{r} {x:.2f}" for r, x in ratios.items() if r != best]
        return text + (f" ({best}; {', '.join(others)})" if others else "")

    ratio = min(min(r.values()) for _, _, r, _ in real)
    v = "reproduced" if ratio <= 0.9 else "partly" if ratio < 1.0 else "contradicted"
    return Verdict("A4", v, "; ".join(key(*r) for r in real), ", ".join(r[0] for r in real),
                   RL_MEMORY_SOURCE, RL_NOTE,
                   numbers={h: {f"update_memory_{r}_{b}": round(float(x), 4)
                                for r, x in ratios.items()} for h, b, ratios, _ in real})


def a9(sp: pd.DataFrame) -> Verdict:
    """A9's speed side from ``speedups`` over BF16: the best whole-loop FP8/BF16 ratio of the
    MLPs and of the CNNs (native, one call); reproduced if both are >= 1, partly if one is (or
    if the other was not measured natively: the key number says so)."""
    real = _native(sp, "bf16", mlp_only=False)
    if not len(real):
        return Verdict("A9", "not yet measured", "no native-FP8 records", _hw(sp),
                       "results/*/rl_throughput", RL_NOTE)
    best = real.groupby(real.network.map(lambda n: "mlp" if n == "mlp" else "cnn")).e2e.max()
    ok = {k: v >= 1.0 for k, v in best.items()}
    v = ("reproduced" if len(ok) == 2 and all(ok.values()) else
         "partly" if any(ok.values()) else "contradicted")
    key = "; ".join(f"best FP8/BF16 whole loop, {k}: {x:.2f}x" for k, x in best.items())
    if "cnn" not in best:
        key += ("; CNN speed not measured: every FP8 CNN cell is emulated (the FP8 convolution's "
                "backward runs through BF16)")
    return Verdict("A9", v, key + " (speed; quality in notebook 04)", _hw(real),
                   "results/*/rl_throughput", RL_NOTE,
                   numbers={f"{k}_fp8_bf16_e2e_max": x for k, x in best.items()})
