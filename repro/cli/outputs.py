"""The commands that make the repository's outputs from its records: ``repro notebook`` (one
notebook, converted and executed), ``repro claims`` (the ledger), ``repro site`` and
``repro pipeline`` (dvc.yaml)."""

from __future__ import annotations

import sys

from repro.checkout import inside_repository, repo_root
from repro.cli.checks import (UsageError, notebook_profile, parse_params, rel,
                              resolved_profile, text)


def cmd_notebook(args) -> int:
    from repro import run_notebook

    params = parse_params(args.param)
    profile = resolved_profile(notebook_profile(args.profile, params.pop("profile", None)))
    try:
        return run_notebook.run(args.name, profile, params)
    except run_notebook.NotebookError as e:
        raise UsageError(str(e)) from None


def cmd_claims(args) -> int:
    import json

    from repro.claims import ledger as claims

    rows = claims.ledger()
    if args.write:
        path, changed = claims.write_page()
        print(f"{rel(path)}: ledger {'written' if changed else 'already up to date'} "
              f"({len(rows)} claims)", file=sys.stderr)
        if not (args.json or args.markdown):
            return 0
    if args.json:
        from repro.claims import registration

        loaded: dict = {}  # each experiment's records loaded once for every claim
        checks = registration.table(records_of=lambda studies: _records_used(studies, loaded))
        for r in rows:
            r.update(checks.get(r["claim"], {}))
        print(json.dumps(rows, indent=1))
    else:
        from repro import tables

        print(claims.markdown_table(rows) if args.markdown else tables.ledger(rows))
    return 0


def _records_used(studies: list[str], loaded: dict | None = None):
    """The committed full-profile records of ``studies`` a verdict may use (stale speed
    records left out, as the notebooks leave them out); ``loaded`` keeps each study's
    records for the next claim that reads them."""
    import pandas as pd

    from repro import evidence, results
    from repro.claims import staleness

    loaded = {} if loaded is None else loaded
    parts = []
    for s in studies:
        if s not in loaded:
            df = evidence.load_records(s, roots=results.results_dir())
            loaded[s] = staleness.split(df[df["profile"] == "full"])[0] if len(df) else df
        if len(loaded[s]):
            parts.append(loaded[s])
    return pd.concat(parts, ignore_index=True) if parts else None


def cmd_site(args) -> int:
    from repro import site

    root = repo_root()
    out = inside_repository(f"--out {args.out}", args.out, root, error=UsageError) \
        if args.out else root / "build" / "site"
    index = site.build_site(root, out)
    print(f"wrote {rel(index)} ({len(site.notebook_pages(root / 'build' / 'notebooks'))} "
          f"notebook page(s))", file=sys.stderr)
    return 0


def cmd_pipeline(args) -> int:
    from repro import pipeline
    path = repo_root() / "dvc.yaml"
    if args.check:
        if path.exists() and path.read_text() == pipeline.render():
            return 0
        print(f"repro: {rel(path)} is out of date: run `repro pipeline`", file=sys.stderr)
        return 1
    changed = pipeline.write(path)
    print(f"{rel(path)}: {'written' if changed else 'already up to date'} "
          f"({len(pipeline.stages())} stages)", file=sys.stderr)
    return 0


def add_notebook(sub) -> None:
    """The ``notebook`` command."""
    n = sub.add_parser("notebook", help="convert (jupytext) and execute (papermill) a notebook")
    n.add_argument("name", metavar="NAME", help="notebooks/NAME.py")
    n.add_argument("--profile", help="smoke | full | auto (default: params.yaml's profile)")
    n.add_argument("-p", "--param", action="append", metavar="KEY=VALUE",
                   help="a parameter of the notebook's parameters cell (value parsed as YAML)")
    n.set_defaults(func=cmd_notebook)


def add_pipeline(sub) -> None:
    """The ``pipeline`` command."""
    pl = sub.add_parser("pipeline", help="write dvc.yaml: each notebook stage's deps from "
                        "its imports")
    pl.add_argument("--check", action="store_true",
                    help="write nothing; exit 1 when dvc.yaml is out of date")
    pl.set_defaults(func=cmd_pipeline)


def add(sub) -> None:
    """The ``claims`` and ``site`` commands."""
    c = sub.add_parser("claims", help="the claims ledger: verdict, key number, hardware, record")
    fmt = c.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="a JSON list, one object per claim")
    fmt.add_argument("--markdown", action="store_true", help="the ledger's markdown table")
    c.add_argument("--write", action="store_true",
                   help="write the ledger's page, docs/ledger.md (the README links it)")
    c.set_defaults(func=cmd_claims)

    s = sub.add_parser("site", help="build the static HTML documentation site")
    s.add_argument("--out", metavar="DIR", type=text, help="output directory (default "
                   "build/site; an existing one only if a build made it)")
    s.set_defaults(func=cmd_site)
