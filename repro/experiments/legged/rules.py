"""Claim A11: FP8 in legged-robot PPO on MuJoCo physics (notebook 10).

FP8 *pays* at a policy size when its whole PPO loop (physics included) reaches >= 1.1x BF16's
env-steps/s, the threshold notebook 03 uses for "faster". Its quality is a parity claim, judged
as A5, A6 and A10: P(FP8 > FP32) with its 95% interval [lo, hi] against the equivalence margin
[low, high] of A11's definition (``repro/data/claims.yaml``): **kept** if lo >= low, **lost** if
hi < low, **inconclusive** when the interval straddles low.
"""

from __future__ import annotations

from collections.abc import Sequence

import pandas as pd

from repro.analysis import rl as rl_analysis
from repro.analysis.rl import longest_runs
from repro.verdict import UNSURE, Verdict, margin, parity
from repro.verdict import rule as rule_of
from repro.catalogue import get as experiment

EXPERIMENT = experiment("legged").name
_RULE = rule_of("A11")  # the names and thresholds below are A11's rule in claims.yaml
RECIPE = _RULE["recipes"][0]
REFERENCE = _RULE["reference"]
BASELINE = _RULE["baseline"]  # the speed baseline; quality is shown (not judged) against it too
PAYS = _RULE["pays"]  # FP8 "pays" where the whole loop is >= PAYS x BF16's
MIN_SEEDS = _RULE["min_seeds"]
NOTE = "notebook 10_legged"


def crossover(pays: dict[int, bool]) -> int | None:
    """The smallest width from which FP8 pays at every wider measured width (None if it does
    not pay at the widest)."""
    out = None
    for w in sorted(pays, reverse=True):
        if not pays[w]:
            break
        out = w
    return out


def _where(env, width) -> tuple[str, int]:
    """A sort key and label part: ``(env or "", width)``."""
    return ("" if not isinstance(env, str) else env, int(width))


def _label(key: tuple[str, int]) -> str:
    env, width = key
    return f"{env} width {width}" if env else f"width {width}"


def _quality_kept(quality: pd.DataFrame, recipe: str, bounds: Sequence[float],
                  min_seeds: int = MIN_SEEDS, reference: str = REFERENCE,
                  baseline: str = BASELINE) -> dict[tuple[str, int], tuple[bool | str | None, str]]:
    """Per (env, width) with >= MIN_SEEDS seeds: (kept: True / False / UNSURE, its text), from
    the ``poi``, ``poi_lo``, ``poi_hi`` columns of
    ``repro.experiments.legged.tables.quality_table``, at the longest training
    (:func:`longest_runs`), the text also giving both sides' seeds and mean returns
    (``mean_return``; the rows shown beside it against the same FP32 mean) and P(recipe > BF16)
    where the table has it (``poi_bf16``). Where FP32 did not beat the random policy
    (``learned`` false) nothing learned, so nothing is compared: (None, why); likewise where
    the environment has no random-policy record (``learned`` NaN)."""
    q = longest_runs(quality[quality.recipe == recipe], min_seeds) if len(quality) else quality
    out = {}
    for r in q.itertuples():
        steps = getattr(r, "total_timesteps", 0)
        steps = int(steps) if pd.notna(steps) else 0
        ref = _rows_at(quality, r, steps)
        ref = ref[ref.recipe == reference]
        parts = [f"{steps / 1e6:.1f}M steps per seed"] if steps else []
        budget = f" ({parts[0]})" if parts else ""
        where = _where(getattr(r, "env", None), r.width)
        learned = getattr(r, "learned", True)
        if pd.isna(learned):
            env = getattr(r, "env", None)
            out[where] = (None, "not judged: no random-policy record"
                                + (f" ({env}_random)" if isinstance(env, str) else "")
                                + f" to tell whether FP32 learned{budget}")
            continue
        if not bool(learned):
            out[where] = (None, f"not judged: FP32's mean return {ref.mean_return.mean():.3g} "
                                f"did not beat the random policy's {r.random_return:.3g}{budget}")
            continue
        # a judged comparison also names the seeds of each side (cells may hold different
        # counts) and how large the difference is: P(recipe > FP32) says how often, not by
        # how much
        if len(ref) and "n_seeds" in ref and pd.notna(getattr(r, "n_seeds", None)):
            parts.append(f"{int(r.n_seeds)} seeds, FP32 {int(ref.n_seeds.iloc[0])}")
        theirs = ref.mean_return.iloc[0] if len(ref) and "mean_return" in ref else None
        if means := _means(getattr(r, "mean_return", None), theirs):
            parts.append(means)
        poi = pd.DataFrame([{"x": recipe, "y": reference, "p": r.poi, "lo": r.poi_lo,
                             "hi": r.poi_hi}])
        state, text = parity(poi, recipe, reference, bounds)
        text += f" ({'; '.join(parts)})" if parts else ""
        vs16 = getattr(r, "poi_bf16", float("nan"))
        if pd.notna(vs16):  # shown beside the judged comparison: FP8 against 16-bit compute
            text += (f"; P({recipe}>{baseline})={vs16:.2f} [{r.poi_bf16_lo:.2f},"
                     f"{r.poi_bf16_hi:.2f}] (not judged)")
        for c in _shown_beside(quality, recipe, r, steps, min_seeds, baseline).itertuples():
            means = _means(getattr(c, "mean_return", None), theirs)
            text += (f"; P({c.recipe}>{reference})={c.poi:.2f} [{c.poi_lo:.2f},{c.poi_hi:.2f}]"
                     f" over {int(c.n_seeds)} seeds" + (f", {means}" if means else "")
                     + " (not judged)")
        out[where] = (state, text)
    return out


def _means(mine, fp32) -> str:
    """The text ``mean return M, FP32 F: +D%`` (no percentage where FP32's mean is not
    positive); empty where either mean is missing."""
    if pd.isna(mine) or pd.isna(fp32):
        return ""
    return (f"mean return {mine:.4g}, FP32 {fp32:.4g}"
            + (f": {100 * (mine / fp32 - 1):+.1f}%" if fp32 > 0 else ""))


def _rows_at(quality: pd.DataFrame, row, steps: int) -> pd.DataFrame:
    """The rows of ``quality`` at ``row``'s environment and width, trained ``steps`` per seed
    (a column the table lacks does not filter)."""
    q = quality[quality.width == row.width]
    if "env" in q:
        q = q[q.env == getattr(row, "env", None)]
    if "total_timesteps" in q:
        q = q[q.total_timesteps.fillna(0).astype(int) == steps]
    return q


def _shown_beside(quality: pd.DataFrame, recipe: str, row, steps: int,
                  min_seeds: int = MIN_SEEDS, baseline: str = BASELINE) -> pd.DataFrame:
    """The rows shown beside the judged ``recipe``, never judged, at ``row``'s environment and
    width, trained ``steps`` per seed, with >= MIN_SEEDS seeds: BF16 (the speed baseline:
    does 16-bit compute keep FP32's return?), then ``recipe`` with another critic recipe
    (``{recipe}+critic-{critic}``; the speed pairs time ``recipe`` in both towers), then
    variants of ``recipe`` (``{recipe}:field=value``: levers tried on its return)."""
    q = _rows_at(quality, row, steps)
    critic, variant = (q.recipe.str.startswith(f"{recipe}{s}") for s in ("+critic-", ":"))
    q = q.assign(_order=critic.astype(int) + 2 * variant.astype(int))
    q = q[(q.recipe == baseline) | critic | variant]
    q = q[q.n_seeds >= min_seeds] if "n_seeds" in q else q
    return q.sort_values("_order", kind="stable")


def peer_parity(row, bounds: Sequence[float] | None = None) -> tuple[bool | str | None, str]:
    """Our PPO's return against brax's trainer (a row of
    ``repro.experiments.legged.tables.peer_table``), read by the rule A11 reads FP8 against
    FP32: P(ours > brax)'s interval against A11's margin (``bounds``). Shown in notebook 10; it
    changes no verdict."""
    poi = pd.DataFrame([{"x": "ours", "y": "brax", "p": row.poi, "lo": row.poi_lo,
                         "hi": row.poi_hi}])
    return parity(poi, "ours", "brax", bounds or margin("A11"))


def _held(kept: dict[tuple[str, int], tuple[bool | str | None, str]]) -> bool | str | None:
    """Quality over every measured width: lost anywhere -> False, else undecided anywhere ->
    UNSURE, else True; None if no width was judged."""
    states = [s for s, _ in kept.values() if s is not None]
    if not states:
        return None
    return False if False in states else UNSURE if UNSURE in states else True


def a11(ups: pd.DataFrame, quality: pd.DataFrame, recipe: str | None = None,
        bounds: Sequence[float] | None = None, rule=None) -> Verdict:
    """A11 ("FP8 matters for compute-heavy RL such as legged-robot training") from
    ``repro.experiments.legged.tables.speedups`` and ``quality_table`` of the full-profile GPU
    records (``repro.experiments.legged.tables.evidence``).

    Speed counts only for non-emulated ratios of two cells recorded in one call
    (``same_commit``). Ratios of paired cells (``timing`` "paired":
    ``repro.experiments.legged.tables.paired_speedups``, the median of per-round ratios) count
    only where the rule's ``cells`` say ``timing: paired-first``, and then alone on each
    hardware that has them (a width's key number then names the rounds and the per-round
    ratios' range); a rule without it never reads them. FP8 *pays* at a policy size when
    ``recipe``'s whole PPO loop reaches >= 1.1x BF16's env-steps/s; its quality is *kept* at a
    size when P(``recipe`` > FP32)'s 95% interval over >= 8 seeds lies at or above the
    margin's low bound (``bounds``, else A11's margin), judged per environment at the longest
    training recorded for that width with enough seeds; where FP32 did not beat the random
    policy, nothing is judged. The crossover is the smallest measured width from which FP8
    pays at every wider one. BF16 against FP32, the same policy recipe with another critic
    (``{recipe}+critic-fp32``) and variants of ``recipe`` (``{recipe}:field=value``) are shown
    beside it with their own intervals, not judged (:func:`_shown_beside`).

    **reproduced**: FP8 pays at the narrowest measured size (the standard legged policy) and
    its quality is kept wherever measured; **inconclusive**: it pays there, no size lost
    quality, but an interval is too wide to tell; **partly**: it pays only from a wider
    crossover on (or pays but its quality is lost or not measured); **contradicted**: it pays
    at no measured size; **not yet measured**: no such records.
    """
    bounds = bounds or margin("A11")
    rl = rule_of("A11", rule)
    recipe = recipe or rl["recipes"][0]
    pays_at, min_seeds = rl["pays"], rl["min_seeds"]
    ups = rl_analysis.paired_first(ups) if (rl.get("cells") or {}).get("timing") == \
        "paired-first" else rl_analysis.separate(ups)
    u = ups[(ups.recipe == recipe) & ~ups.emulated.astype(bool)
            & ups.same_commit.astype(bool)] if len(ups) else ups
    if not len(u):
        return Verdict("A11", "not yet measured",
                       f"no native-FP8 {recipe}/BF16 pairs of the legged study on a GPU", "",
                       f"results/*/{EXPERIMENT}", NOTE)
    hw = u.groupby("hardware").size().idxmax()
    u = u[u.hardware == hw]
    envs = sorted(set(u.env))
    # per width, the median over the environments measured at it (paired: with the range of
    # their per-round ratios and the fewest rounds)
    paired = "timing" in u and bool((u.timing == "paired").all())
    more = dict(rounds=("rounds", "min"), e2e_lo=("e2e_lo", "min"),
                e2e_hi=("e2e_hi", "max")) if paired else {}
    u = u.groupby("width", as_index=False).agg(
        e2e=("e2e", "median"), update=("update", "median"), size=("size", "first"),
        physics_share=("physics_share", "first"),
        env=("env", lambda x: "/".join(sorted(set(x)))), **more).sort_values("width")
    pays = {int(r.width): bool(r.e2e >= pays_at) for r in u.itertuples()}
    kept = _quality_kept(quality[quality.hardware == hw] if len(quality) else quality, recipe,
                         bounds, min_seeds, rl["reference"], rl["baseline"])
    held, cross, narrow = _held(kept), crossover(pays), int(u.width.min())
    if not any(pays.values()):
        verdict = "contradicted"
    elif pays[narrow] and held is True:
        verdict = "reproduced"
    elif pays[narrow] and held == UNSURE:
        verdict = "inconclusive"
    else:
        verdict = "partly"
    at = (lambda r: f"{r['env']} {r['size']}") if len(envs) > 1 else (lambda r: r["size"])
    def part(r):  # the physics share needs a fresh physics record of the speed cell's envs
        physics = (f"; physics {r['physics_share']:.0%} of the BF16 loop"
                   if pd.notna(r["physics_share"]) else "; physics share not measured")
        rounds = (f"; paired, median of {int(r['rounds'])} rounds, range {r['e2e_lo']:.2f}-"
                  f"{r['e2e_hi']:.2f}x" if paired else "")
        return (f"{r['e2e']:.2f}x at {at(r)} (width {int(r['width'])}{rounds}; update alone "
                f"{r['update']:.2f}x{physics})")

    speed = ", ".join(part(r) for _, r in u.iterrows())
    qual = (f"quality not measured with >= {min_seeds} seeds" if not kept else
            "quality vs FP32 " + ", ".join(f"{_label(k)}: {t}" for k, (_, t) in
                                           sorted(kept.items(), key=lambda kv: kv[0][::-1])))
    where = (f"FP8 pays from width {cross} on" if cross is not None else
             f"FP8 does not pay up to width {int(u.width.max())}")
    envs = ", ".join(envs)
    key = f"{recipe}/BF16 whole PPO loop on {envs} (MJX physics): {speed}; {where}; {qual}"
    # what decides: where FP8 pays, unless it pays at the narrowest size (then quality)
    decides = "" if verdict == "reproduced" else where if not pays[narrow] else qual
    return Verdict("A11", verdict, key, hw,
                   f"results/{hw}/{EXPERIMENT} (env_steps_per_s, update_ms, final_return, "
                   "physics_env_steps_per_s)", NOTE, decides=decides)
