from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import pandas as pd

from repro import results
from repro.analysis.stats import ratio, welch_interval
from repro.precision.recipes import REGISTRY


def longest_runs(quality: pd.DataFrame, min_seeds: int = 1) -> pd.DataFrame:
    """The rows of a quality table (``repro.experiments.legged.tables.quality_table``) that
    judge quality: per (hardware, recipe, env, width), the longest training
    (``total_timesteps``) among rows with >= ``min_seeds`` seeds (more seeds breaking a tie): a
    size trained for several budgets is judged where its training went furthest."""
    if not len(quality):
        return quality
    q = quality[quality.n_seeds >= min_seeds] if "n_seeds" in quality else quality
    order = q.assign(_steps=q.get("total_timesteps", 0), _seeds=q.get("n_seeds", 0)) \
        .sort_values(["_steps", "_seeds"])
    keys = ["hardware", "recipe"] + (["env"] if "env" in q else []) + ["width"]
    return order.groupby(keys, sort=False).tail(1) \
        .drop(columns=["_steps", "_seeds"]).sort_index()


def repeat_identical(df: pd.DataFrame, repeat: pd.DataFrame) -> pd.DataFrame:
    """A10 across processes: quality cells recorded twice, compared bitwise.

    ``repeat`` holds ``final_return`` records of cells that were run a second time in another
    process (``results/<hw>/rl_quality_repeat/``: same commit, machine and seeds; load it with
    ``keep_defective=True``: reproducibility does not depend on a numerics defect). One row per
    (hardware, env, variant) recorded at the same commit both times: the seeds compared,
    whether every seed's final return AND its learning curve are identical, and the commit.
    """
    cols = ["hardware", "env", "variant", "seeds", "identical", "commit", "commit_repeat"]

    def keyed(d):
        d = d[d.metric == "final_return"]
        return {(r.hardware, r.sizes["env"], r.extra["variant"], r.sizes["seed"]):
                (r.value, r.extra.get("curve"), r.git_commit) for r in d.itertuples()}

    if repeat.empty or df.empty:
        return pd.DataFrame(columns=cols)
    a, b = keyed(df), keyed(repeat)
    rows: dict[tuple, dict] = {}
    # a cell recorded again later with other code (e.g. re-recorded after a defect) is not a
    # repeat: only the same commit counts
    for k in sorted((k for k in set(a) & set(b) if a[k][2] == b[k][2]), key=str):
        cell = rows.setdefault(k[:3], {"hardware": k[0], "env": k[1], "variant": k[2],
                                       "seeds": 0, "identical": True,
                                       "commit": str(a[k][2])[:7],
                                       "commit_repeat": str(b[k][2])[:7]})
        va, vb = a[k][0], b[k][0]
        same = (va == vb or (np.isnan(va) and np.isnan(vb))) and a[k][1] == b[k][1]
        cell["seeds"] += 1
        cell["identical"] &= bool(same)
    return pd.DataFrame(list(rows.values()), columns=cols)


def _variant_col(df: pd.DataFrame) -> pd.Series:
    return df["extra"].map(lambda e: (e or {}).get("variant"))


def final_returns(df: pd.DataFrame, hardware: str | None = None) -> pd.DataFrame:
    """Tidy per-seed final returns: hardware, env, variant, seed, final_return, emulated."""
    d = df[df.metric == "final_return"].copy()
    if hardware is not None:
        d = d[d.hardware == hardware]
    d["variant"] = _variant_col(d)
    d["env"] = d["sizes"].map(lambda s: s["env"])
    d["seed"] = d["sizes"].map(lambda s: s["seed"])
    d["diverged"] = d["extra"].map(lambda e: e.get("diverged", False))
    d["skipped_steps"] = d["extra"].map(lambda e: e.get("skipped_steps", 0))
    cols = ["hardware", "env", "variant", "recipe", "seed", "value", "emulated", "diverged",
            "skipped_steps", "profile"]
    return d[cols].rename(columns={"value": "final_return"}).reset_index(drop=True)


def normalised_scores(df: pd.DataFrame, hardware: str, reference: str = "fp32",
                      order: Sequence[str] | None = None
                      ) -> tuple[dict[str, np.ndarray], list[str], pd.DataFrame]:
    """{variant: [seeds, envs]} of (return - random) / (reference mean - random), per hardware.

    The reference variant (fp32) scores 1 on average, a random policy 0; a diverged seed
    (NaN) scores 0. If the reference did not beat random on an env, the best variant's mean
    is the reference there. Only envs and seed counts present for every variant are used.
    ``order``: the variants' order in the result (default: the registry's).
    """
    fr = final_returns(df, hardware)
    rnd = df[(df.metric == "random_return") & (df.hardware == hardware)].copy()
    rnd["env"] = rnd["sizes"].map(lambda s: s["env"])
    floor = rnd.groupby("env")["value"].mean()
    envs = sorted(set(fr.env) & set(floor.index))
    variants = [v for v in (order or REGISTRY) if v in set(fr.variant)]
    envs = [e for e in envs if all(((fr.env == e) & (fr.variant == v)).any() for v in variants)]
    if not envs:
        return {}, [], pd.DataFrame()
    n = min(int(((fr.env == e) & (fr.variant == v)).sum()) for e in envs for v in variants)
    means = fr.groupby(["env", "variant"])["final_return"].mean()
    scores, rows = {}, []
    for v in variants:
        cols = []
        for e in envs:
            ref = means.get((e, reference), np.nan)
            if not np.isfinite(ref) or ref - floor[e] <= 1e-6:
                ref = means.loc[e].max()
            x = fr[(fr.env == e) & (fr.variant == v)].sort_values("seed")["final_return"]
            x = np.asarray(x, np.float64)[:n]
            z = np.nan_to_num((x - floor[e]) / max(ref - floor[e], 1e-6), nan=0.0)
            cols.append(z)
            rows += [{"env": e, "variant": v, "seed": i, "normalised": z[i]} for i in range(n)]
        scores[v] = np.stack(cols, axis=1)
    return scores, envs, pd.DataFrame(rows)


def fp8_stores(df: pd.DataFrame) -> pd.DataFrame:
    """Claim A1's table: per variant, how many of its four stores (parameters, GEMM
    activations, GEMM gradients, the optimizer update) are FP8 (``fp8_stores`` records), with
    the ``policy`` (value -> format) and the ``hardware`` and ``profile`` of the record (the
    last one loaded per variant: pass the committed records only, or a smoke record of this
    machine replaces the committed one)."""
    cols = ["variant", "stores", "hardware", "profile", "policy"]
    d = df[df.metric == "fp8_stores"] if len(df) else df
    if not len(d):
        return pd.DataFrame(columns=cols)
    d = d.assign(variant=d["sizes"].map(lambda s: s["variant"])).drop_duplicates(
        "variant", keep="last")
    return pd.DataFrame({"variant": d["variant"], "stores": d["value"].astype(int),
                         "hardware": d["hardware"], "profile": d["profile"],
                         "policy": d["extra"].map(lambda e: e["policy"])}).reset_index(drop=True)


def a3_projection(sp: pd.DataFrame, bandwidth_ratio: float, fp16_ratio: float) -> pd.DataFrame:
    """Claim A3's projection: each native, same-call FP8/FP16 whole-loop ratio of the MLP
    (``speedups``) times the H100/A100 FP16 datasheet ratio, by memory bandwidth (``lo``, a
    memory-bound loop) and by dense FP16 tensor-core rate (``hi``, a GEMM-bound loop)."""
    if not len(sp):
        return sp.assign(lo=[], hi=[])
    real = sp[(~sp.emulated) & (sp.baseline == "fp16") & (sp.network == "mlp") & sp.same_commit]
    return real.assign(lo=real.e2e * bandwidth_ratio, hi=real.e2e * fp16_ratio)


def throughput_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (hardware, network, width, num_envs, recipe) with the three metrics, and
    ``git_commit``: the commit(s) its records were made at, comma-separated. The timings of
    paired cells are left out (their ratios are :func:`paired_speedups`'); their update's
    memory, XLA's analysis of the same compiled program, is kept."""
    d = df[df.metric.isin(["env_steps_per_s", "update_time_ms", "update_memory_bytes"])]
    timing = d.metric != "update_memory_bytes" if len(d) else pd.Series(dtype=bool)
    d = d[~(d["extra"].map(is_paired) & timing)].copy() if len(d) else d.copy()
    if d.empty:
        return pd.DataFrame()
    for k in ("network", "width", "num_envs", "env", "batch"):
        d[k] = d["sizes"].map(lambda s, k=k: s.get(k))
    d["fp8_gemm_calls"] = d["extra"].map(lambda e: e.get("fp8_gemm_calls"))
    # records made before the FP8 CNN cells were flagged emulated say so only here
    d["emulated"] = d["emulated"].astype(bool) | d["extra"].map(
        lambda e: bool(e.get("conv_backward")))
    keys = ["hardware", "hardware_name", "network", "width", "num_envs", "recipe"]
    t = d.pivot_table(index=keys, columns="metric", values="value", aggfunc="median")
    em = d.groupby(keys)["emulated"].any().rename("emulated")
    calls = d.groupby(keys)["fp8_gemm_calls"].max()
    if "git_commit" not in d:
        d["git_commit"] = ""
    commit = d.groupby(keys)["git_commit"].agg(
        lambda c: ",".join(sorted({str(x) for x in c if isinstance(x, str) and x})))
    return t.join(em).join(calls).join(commit).reset_index()


def widest_fitting(table: pd.DataFrame, budget_bytes: float) -> pd.DataFrame:
    """The widest MLP whose PPO update fits ``budget_bytes`` of device memory, per (hardware,
    recipe, num_envs), from the compiled update's memory (``update_memory_bytes``) at the
    measured widths: a least-squares quadratic in the width (parameters, gradients and
    optimizer state grow as W^2, activations as W), solved for the budget. ``extrapolated``:
    the answer lies beyond the widest measured width (a projection, not a measurement). Needs
    three measured widths; others are left out."""
    cols = ["hardware", "recipe", "num_envs", "widths", "widest_width", "extrapolated",
            "max_rel_residual", "emulated"]
    if not len(table) or "update_memory_bytes" not in table:
        return pd.DataFrame(columns=cols)
    mlp = table[(table.network == "mlp")].dropna(subset=["update_memory_bytes"])
    rows = []
    for (h, r, n), g in mlp.groupby(["hardware", "recipe", "num_envs"]):
        g = g.groupby("width", as_index=False).agg(
            mem=("update_memory_bytes", "median"), emulated=("emulated", "any"))
        if len(g) < 3:
            continue
        w, m = g.width.to_numpy(float), g.mem.to_numpy(float)
        c2, c1, c0 = np.polyfit(w, m, 2)
        resid = float(np.max(np.abs(np.polyval([c2, c1, c0], w) - m) / m))
        roots = np.roots([c2, c1, c0 - budget_bytes])
        real = [x.real for x in roots if abs(x.imag) < 1e-9 and x.real > 0]
        widest = max(real) if real else float("nan")
        rows.append((h, r, int(n), [int(x) for x in w], widest,
                     bool(np.isfinite(widest) and widest > w.max()), resid,
                     bool(g.emulated.any())))
    return pd.DataFrame(rows, columns=cols)


def speedups(table: pd.DataFrame, recipe: str, baselines: Sequence[str] = ("fp16", "bf16")
             ) -> pd.DataFrame:
    """``recipe`` vs each baseline, per (hardware, network, width, num_envs): the end-to-end
    ratio of env-steps/s and the update-only ratio of times (> 1: ``recipe`` is faster).

    ``same_commit``: both cells were recorded at one git commit (in this repository's GPU
    workflow, one call: the same machine, in one sitting). A ratio across commits compares
    timings from different calls, possibly different machines of the same kind."""
    keys = ["hardware", "network", "width", "num_envs"]
    x = table[table.recipe == recipe].set_index(keys)
    rows = []
    for b in baselines:
        y = table[table.recipe == b].set_index(keys)
        j = x.join(y, lsuffix="", rsuffix="_base", how="inner")
        for k, r in j.iterrows():
            at = f"{recipe} vs {b} at {', '.join(map(str, k))}"
            rows.append({**dict(zip(keys, k)), "recipe": recipe, "baseline": b,
                         "e2e": ratio(r["env_steps_per_s"], r["env_steps_per_s_base"],
                                      f"env_steps_per_s of {at}"),
                         "update": ratio(r["update_time_ms_base"], r["update_time_ms"],
                                         f"update_time_ms of {at}"),
                         "memory": ratio(r.get("update_memory_bytes", np.nan),
                                         r.get("update_memory_bytes_base", np.nan),
                                         f"update_memory_bytes of {at}"),
                         "emulated": bool(r["emulated"] or r["emulated_base"]),
                         "same_commit": results.same_commit(r.get("git_commit"),
                                                            r.get("git_commit_base"))})
    return pd.DataFrame(rows)


FP8_RECIPES = ("fp8-current", "fp8-delayed")  # the RL study's FP8 recipes (claims A2-A4, A9)


def fp8_speedups(table: pd.DataFrame, recipes: Sequence[str] = FP8_RECIPES,
                 records: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`speedups` of every FP8 recipe of ``recipes`` recorded in ``table``, stacked;
    with ``records``, also the :func:`paired_speedups` of their paired cells (then a
    ``timing`` column says which rows are "paired" and which "separate")."""
    # the timed rows: a paired cell contributes only its update's memory to the table
    timed = table[table["env_steps_per_s"].notna()] if "env_steps_per_s" in table else \
        table.iloc[:0]
    have = set(timed.recipe) if len(timed) else set()
    parts = [speedups(timed, r) for r in recipes if r in have]
    out = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame()
    paired = paired_speedups(records, recipes) if records is not None else pd.DataFrame()
    if not len(paired):
        return out
    return pd.concat([out.assign(timing="separate"), paired], ignore_index=True) if len(out) \
        else paired


def separate(sp: pd.DataFrame) -> pd.DataFrame:
    """The ratios of ``sp`` from separately timed cells (its paired rows left out)."""
    return sp[sp.timing != "paired"] if len(sp) and "timing" in sp else sp


def paired_first(sp: pd.DataFrame) -> pd.DataFrame:
    """Per hardware, the ratios of ``sp`` from paired cells where it has any, else those of
    separately timed cells."""
    if not len(sp) or "timing" not in sp:
        return sp
    has = sp[sp.timing == "paired"].hardware.unique()
    return sp[(sp.timing == "paired") == sp.hardware.isin(has)]


def is_paired(extra) -> bool:
    """Whether a record's ``extra`` is a paired cell's (``timing: "paired"``)."""
    return isinstance(extra, Mapping) and extra.get("timing") == "paired"



def paired_runs(df: pd.DataFrame | None):
    """``((hardware, run_id), records)`` of each paired cell's run among ``df``'s records
    (those with ``extra.timing == "paired"``)."""
    d = df[df["extra"].map(is_paired)] if df is not None and len(df) else pd.DataFrame()
    return d.groupby(["hardware", d["extra"].map(lambda e: e["run_id"])]) if len(d) else []


def round_ratios(*pairs: tuple[Sequence[float], Sequence[float]], where: str = ""
                 ) -> list[np.ndarray]:
    """Per-round ratios ``a / b`` of each ``(a, b)`` pair of one paired cell's samples (sample
    k of each taken in round k); a ValueError naming ``where`` where the samples are not all
    of one (nonzero) number of rounds."""
    arrays = [(np.asarray(a, float), np.asarray(b, float)) for a, b in pairs]
    lengths = {len(x) for ab in arrays for x in ab}
    if len(lengths) != 1 or 0 in lengths:
        raise ValueError(f"{where} have different numbers of rounds")
    return [a / b for a, b in arrays]


def paired_speedups(df: pd.DataFrame, recipes: Sequence[str] = FP8_RECIPES,
                    baselines: Sequence[str] = ("fp16", "bf16")) -> pd.DataFrame:
    """Each of ``recipes`` over each baseline timed beside it in one paired cell (records with
    ``extra.timing == "paired"``; ``repro.experiments.rl_throughput.measure.paired_cell``), per
    run: the per-round ratios of the whole loop's times (``e2e``: their median,
    ``e2e_lo``/``e2e_hi``: their range) and of the update's (``update``,
    ``update_lo``/``update_hi``); > 1: the recipe is faster. ``memory`` is the compiled
    updates' ratio; ``same_commit`` is True (one run), ``rounds`` the number of rounds,
    ``timing`` "paired". The columns of :func:`speedups`."""
    cols = ["hardware", "network", "width", "num_envs", "recipe", "baseline", "e2e", "update",
            "memory", "emulated", "same_commit", "e2e_lo", "e2e_hi", "update_lo",
            "update_hi", "rounds", "run_id", "timing"]
    rows = []
    for (h, run), g in paired_runs(df):
        by = {(r.recipe, r.metric): r for r in g.itertuples()}
        for x in recipes:
            for b in baselines:
                if (x, "env_steps_per_s") not in by or (b, "env_steps_per_s") not in by:
                    continue
                e2e, upd = round_ratios(
                    (by[b, "env_steps_per_s"].extra["samples_s"],
                     by[x, "env_steps_per_s"].extra["samples_s"]),
                    (by[b, "update_time_ms"].extra["samples_ms"],
                     by[x, "update_time_ms"].extra["samples_ms"]),
                    where=f"paired cell {run} on {h}: {x} and {b}")
                mem_x, mem_b = by.get((x, "update_memory_bytes")), by.get((b, "update_memory_bytes"))
                sizes = by[x, "env_steps_per_s"].sizes
                rows.append({
                    "hardware": h, "network": sizes["network"], "width": sizes["width"],
                    "num_envs": sizes["num_envs"], "recipe": x, "baseline": b,
                    "e2e": float(np.median(e2e)), "update": float(np.median(upd)),
                    "memory": (mem_x.value / mem_b.value) if mem_x and mem_b else np.nan,
                    "emulated": bool(by[x, "env_steps_per_s"].emulated
                                     or by[b, "env_steps_per_s"].emulated),
                    "same_commit": True, "e2e_lo": float(e2e.min()), "e2e_hi": float(e2e.max()),
                    "update_lo": float(upd.min()), "update_hi": float(upd.max()),
                    "rounds": len(e2e), "run_id": run, "timing": "paired"})
    return pd.DataFrame(rows, columns=cols)


def _final_columns(ours: Mapping | None, theirs: Mapping | None) -> dict[str, float]:
    nan = float("nan")
    out = {"final_return": nan, "final_sd": nan, "purejaxrl final_return": nan,
           "purejaxrl final_sd": nan, "final_n": nan, "return_gap": nan, "gap_lo": nan,
           "gap_hi": nan}
    for prefix, f in (("", ours), ("purejaxrl ", theirs)):
        if f and f.get("mean") is not None:
            out[prefix + "final_return"] = f["mean"]
            out[prefix + "final_sd"] = nan if f.get("sd") is None else f["sd"]
    if ours and ours.get("mean") is not None:
        out["final_n"] = ours["n"]
    if (ours and theirs and ours.get("sd") is not None and theirs.get("sd") is not None
            and ours["n"] > 1 and theirs["n"] > 1):
        out["return_gap"], out["gap_lo"], out["gap_hi"] = welch_interval(
            ours["mean"], ours["sd"], ours["n"], theirs["mean"], theirs["sd"], theirs["n"])
    return out


def _purejaxrl_pairs(df: pd.DataFrame, metric: str):
    """``(group, ours, theirs, identity)`` per record of ours under ``metric`` in a cell of
    ``rl_purejaxrl`` with exactly one PureJaxRL record: the cell's records, the two records
    and the row's identity columns (hardware, seeds, ours, options, run, commit)."""
    d = df[(df.experiment == "rl_purejaxrl") & (df.metric == metric)]
    for _, g in d.groupby("source"):
        theirs = [r for _, r in g.iterrows() if r["extra"]["impl"] == "purejaxrl"]
        for _, ours in g.iterrows():
            if ours["extra"]["impl"] == "purejaxrl" or len(theirs) != 1:
                continue
            yield g, ours, theirs[0], {
                "hardware": ours["hardware"], "seeds": int(ours["size_seeds"]),
                "ours": ours["extra"]["impl"], "options": ours["extra"].get("options", {}),
                "run": int(ours["extra"].get("run", 1)), "commit": str(ours["git_commit"])[:12]}


def purejaxrl_first_results(df: pd.DataFrame) -> pd.DataFrame:
    """Ours and PureJaxRL's time to a first result in a fresh process (``first_result_s``
    records: compile + one training run, no compile caches), one row per cell (hardware,
    seeds, option set): both times and ``first ratio`` = PureJaxRL's / ours (> 1: ours has
    its first result sooner), with each one's compile time."""
    cols = ["hardware", "seeds", "ours", "options", "run", "repro first s", "purejaxrl first s",
            "first ratio", "repro compile s", "purejaxrl compile s", "commit"]
    if not len(df) or "size_seeds" not in df:
        return pd.DataFrame(columns=cols)
    rows = [{**ident, "repro first s": ours["value"], "purejaxrl first s": t["value"],
             "first ratio": ratio(t["value"], ours["value"],
                                  f"first_result_s of {ours['hardware']}"),
             "repro compile s": ours["extra"]["compile_s"],
             "purejaxrl compile s": t["extra"]["compile_s"]}
            for _, ours, t, ident in _purejaxrl_pairs(df, "first_result_s")]
    return pd.DataFrame(rows, columns=cols).sort_values(
        ["hardware", "seeds", "ours", "run"], ignore_index=True)


def purejaxrl_speedups(df: pd.DataFrame) -> pd.DataFrame:
    """Ours over PureJaxRL, one row per cell (hardware, seeds, option set of ours): median
    env-steps/s ratio, and the range of the per-repeat ratios (repeat i of each, timed back to
    back in one process). ``options``: the option set (``{}`` for cells recorded before options
    existed); ``best``: the highest ratio of its (hardware, seeds) -- picked after timing, so a
    selection among the rows; ``commit``: rows of different commits come from different
    processes (each ratio is still within one). ``same_returns``: for an option set that keeps
    the random streams (no ``prng``), whether its returns are bitwise those of the defaults
    timed in the same process (:func:`returns_digest`); None where that cannot be told.
    ``final_return`` / ``purejaxrl final_return``: mean over seeds of each run's final return
    (:func:`final_returns`), ``final_sd`` / ``purejaxrl final_sd`` their SDs, ``final_n`` the
    seed count; ``return_gap``, ``gap_lo``, ``gap_hi``: ours minus PureJaxRL's mean final
    return and its Welch 95% interval (NaN with fewer than 2 seeds or in older records).
    ``run``: 1 for a cell's first run, k for its ``_run{k}`` (``record(again=True)``);
    ``runs``: how many runs that (hardware, seeds, option set) has."""
    cols = ["hardware", "seeds", "ours", "options", "run", "runs", "repro steps/s",
            "purejaxrl steps/s",
            "speedup", "min", "max", "best", "emulated", "commit", "returns_digest",
            "same_returns", "final_return", "final_sd", "purejaxrl final_return",
            "purejaxrl final_sd", "final_n", "return_gap", "gap_lo", "gap_hi"]
    if not len(df) or "size_seeds" not in df:
        return pd.DataFrame(columns=cols)
    rows = []
    for g, ours, theirs, ident in _purejaxrl_pairs(df, "env_steps_per_s"):
        at = f"rl_purejaxrl {ours.get('source', ours['hardware'])}"
        per = np.asarray([ratio(t, o, f"run_s of {at}") for t, o in
                          zip(theirs["extra"]["run_s"], ours["extra"]["run_s"])])
        rows.append({**ident, "repro steps/s": ours["value"],
                     "purejaxrl steps/s": theirs["value"],
                     "speedup": ratio(ours["value"], theirs["value"], at),
                     "min": per.min(), "max": per.max(), "emulated": bool(g.emulated.any()),
                     "returns_digest": ours["extra"].get("returns_digest"),
                     **_final_columns(ours["extra"].get("final_return"),
                                      theirs["extra"].get("final_return"))})
    out = pd.DataFrame(rows, columns=cols).sort_values(["hardware", "seeds", "ours", "run"],
                                                       ignore_index=True)
    out["runs"] = out.groupby(["hardware", "seeds", "ours"]).run.transform("size")
    out["best"] = out.speedup.eq(out.groupby(["hardware", "seeds"]).speedup.transform("max"))
    plain = {(r.hardware, r.seeds, r.commit): r.returns_digest
             for r in out.itertuples() if not r.options and r.returns_digest}

    def same(r):
        ref = plain.get((r.hardware, r.seeds, r.commit))
        if not r.options or "prng" in r.options or ref is None or not r.returns_digest:
            return None
        return r.returns_digest == ref

    out["same_returns"] = [same(r) for r in out.itertuples()]
    return out


def purejaxrl_options(pj: pd.DataFrame, target: float = 1.2,
                      tolerance: float = 5.0) -> pd.DataFrame:
    """Which option set of ours (rows of :func:`purejaxrl_speedups`, defaults left out) a user
    should turn on, per hardware: ``fast`` if every run of it meets ``target`` at every seed
    count timed there; ``learns`` if every multi-seed run's return-gap interval has its lower
    end above ``-tolerance``; ``runs`` the fewest runs at any seed count. ``status``:
    ``recommended`` (fast, learns, confirmed by a second run), ``candidate`` (fast and learns,
    one run: picked among several, so a later run must confirm it), else ``option``."""
    cols = ["hardware", "options", "fast", "learns", "runs", "status", "why"]
    rows = []
    ours = pj[pj.ours != "repro"] if len(pj) else pj
    for (hw, name), g in (ours.groupby(["hardware", "ours"]) if len(ours) else []):
        counts = sorted(pj[pj.hardware == hw].seeds.unique())
        fast = {int(s): bool(len(g[g.seeds == s])) and bool((g[g.seeds == s].speedup
                                                             >= target).all())
                for s in counts}
        runs = int(g.groupby("seeds").size().reindex(counts, fill_value=0).min())
        checked = g.dropna(subset=["gap_lo"])
        learns = bool(len(checked)) and bool((checked.gap_lo > -tolerance).all())
        why = [f"{s} seed(s): {'meets' if ok else 'misses'} {target}x" for s, ok in fast.items()]
        why.append("learns at least as well as PureJaxRL" if learns else
                   "no multi-seed final-return check yet" if not len(checked) else
                   "learns worse than PureJaxRL")
        ok = all(fast.values()) and learns
        status = "option" if not ok else "candidate" if runs < 2 else "recommended"
        rows.append((hw, name, all(fast.values()), learns, runs, status, "; ".join(why)))
    return pd.DataFrame(rows, columns=cols)
