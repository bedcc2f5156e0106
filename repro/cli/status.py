"""``repro status``: the stale records (made by other code or versions than this checkout's),
grouped by experiment and hardware with the verdicts they touch, and what refreshing them
costs; ``--write-index`` writes the program index and the stale set."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from repro.checkout import repo_root
from repro.cli.checks import rel


def _verdicts_of(folder: str, claims: set[str]) -> dict[str, bool]:
    """{claim: whether its verdict says it rests on stale records} for the verdicts that
    cite records of ``folder`` (their ``source``) or serve one of ``claims``."""
    import json

    from repro.claims.ledger import verdicts_dir

    out = {}
    for path in sorted(verdicts_dir().glob("*.json")):
        v = json.loads(path.read_text())
        cited = re.search(rf"\b{re.escape(folder)}\b", str(v.get("source", "")))
        # a verdict that names its records (``source``) is touched by those experiments only;
        # one that names none, by the records that serve its claim
        names_records = re.search(r"results/", str(v.get("source", "")))
        if cited or (not names_records and path.stem in claims):
            # says so: names this experiment's stale cells or records (repro.claims.staleness
            # .describe), or rests on no records at all; another experiment's stale note, or
            # the word "stale" elsewhere, does not count
            said = " ".join(str(v.get(k, "")) for k in ("key_number", "note", "stale_note"))
            out[path.stem] = v.get("verdict") == "not yet measured" or bool(re.search(
                rf"\b\d+ {re.escape(folder)} (cell|record)\(s\)", said))
    return dict(sorted(out.items(), key=lambda kv: (kv[0][0], int(kv[0][1:] or 0))))


def stale_report(cells: list[dict[str, Any]], defective: list[dict[str, Any]] = ()
                 ) -> list[dict[str, Any]]:
    """The stale cells grouped by experiment folder and hardware, with the reasons (each
    with its cells) and the verdicts they touch; and the ``defective`` records of each group
    (:func:`repro.evidence.scan_cells`: cell, record, metric, recipe, problem)."""
    groups: dict[tuple[str, str], dict[str, Any]] = {}

    def group(c: dict[str, Any]) -> dict[str, Any]:
        return groups.setdefault((c["folder"], c["hardware"]), {
            "experiment": c["folder"], "hardware": c["hardware"], "cells": 0, "records": 0,
            "claims": set(), "reasons": {}, "defective": []})

    for d in defective:
        group(d)["defective"].append({k: d[k] for k in ("cell", "record", "metric", "recipe",
                                                        "problem")})
    for c in cells:
        g = group(c)
        g["cells"] += 1
        g["records"] += c["stale"]
        g["claims"] |= set(c["claims"])
        r = g["reasons"].setdefault(c["summary"], {"reason": c["summary"], "cells": [],
                                                     "commits": set(), "since": set()})
        r["cells"].append(c["cell"])
        r["commits"].update(c["commits"])
        r["since"].update([c["since"]] if c["since"] else [])
    out = []
    for g in groups.values():
        g["verdicts"] = _verdicts_of(g["experiment"], g.pop("claims"))
        g["reasons"] = [{**r, "commits": sorted(r["commits"]), "since": sorted(r["since"])}
                        for r in g["reasons"].values()]
        out.append(g)
    return out


def cmd_status(args) -> int:
    import json

    from repro import evidence, results

    if args.write_index:
        from repro import refresh

        path, traced = evidence.write_index()
        print(f"wrote {rel(path)} ({traced} program(s) traced)")
        cells = evidence.stale_cells()
        path = refresh.write_stale_set(repo_root(), cells)
        print(f"wrote {rel(path)} ({len(cells)} stale cell(s))")
        return 0
    cells, defective = evidence.scan_cells()
    report = stale_report(cells, defective)
    if args.json:
        print(json.dumps(report, indent=1))
        return 0
    where = rel(results.results_dir())
    if defective:
        print(f"{len(defective)} defective record(s) under {where}, left out of every verdict "
              "(restore the file from git, or record the cell again):")
        for d in defective:
            what = ", ".join(str(d[k]) for k in ("metric", "recipe") if d[k])
            print(f"  {rel(Path(d['path']))}: record {d['record']} ({what}): {d['problem']}")
        print()
    if not cells:
        print(f"no stale records under {where}")
        return 0
    print(f"{sum(g['records'] for g in report)} stale record(s) in {len(cells)} cell(s) under "
          f"{where}; `repro record --stale` records them again")
    for g in report:
        if not g["cells"]:
            continue
        said = [f"{c}" + ("" if ok else " (does not say so)") for c, ok in g["verdicts"].items()]
        print(f"\n{g['experiment']} on {g['hardware']}: {g['cells']} cell(s), "
              f"{g['records']} record(s); verdicts: {', '.join(said) or 'none'}")
        for r in g["reasons"]:
            names = r["cells"][:8] + ([f"... {len(r['cells']) - 8} more"]
                                      if len(r["cells"]) > 8 else [])
            commits = r["commits"][:6] + (["..."] if len(r["commits"]) > 6 else [])
            print(f"  {r['reason']}\n    recorded at {', '.join(commits)}: {', '.join(names)}")
    from repro import refresh

    print("\nrefreshing all of it (`repro record --stale` on each hardware; estimated from "
          "the records' own times):")
    for line in refresh.describe(refresh.plan(cells)):
        print(f"  {line}")
    return 0


def add(sub) -> None:
    """The ``status`` command."""
    st = sub.add_parser("status", help="stale records (made by other code or versions than "
                        "this checkout's) and the verdicts they touch")
    st.add_argument("--json", action="store_true", help="a JSON list, one object per "
                    "experiment and hardware")
    st.add_argument("--write-index", action="store_true",
                    help="write results/programs/index.json, HEAD's program of every recorded "
                    "cell, so that checking them needs no tracing until their code changes "
                    "again, and results/programs/stale.json, the stale cells and why (commit "
                    "both: a change that stales a cell shows in the diff)")
    st.set_defaults(func=cmd_status)
