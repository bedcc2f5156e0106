"""The commands that make the repository's outputs from its records: ``repro notebook`` (one
notebook, converted and executed), ``repro claims`` (the ledger), ``repro registration`` (when each claim's rule was
fixed), ``repro site`` and
``repro pipeline`` (dvc.yaml)."""

from __future__ import annotations

import sys

from repro.checkout import inside_repository, repo_root
from repro.cli.checks import (UsageError, notebook_profile, number, parse_params, rel,
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

        checks = registration.table()
        for r in rows:
            r.update(checks.get(r["claim"], {}))
        print(json.dumps(rows, indent=1))
    else:
        from repro import tables

        print(claims.markdown_table(rows) if args.markdown else tables.ledger(rows))
    return 0


def cmd_registration(args) -> int:
    from repro.claims import registration, rulehistory

    if not (args.write or args.check):
        rows = registration.summary()
        if not rows:
            raise UsageError("no registration findings (repro/data/registration.json): "
                             "repro registration --write, in a clone with its whole history")
        print("| " + " | ".join(rows[0]) + " |\n|" + "---|" * len(rows[0]))
        for r in rows:
            print("| " + " | ".join(v.replace("|", "\\|") for v in r.values()) + " |")
        return 0
    root = repo_root()
    try:
        found = rulehistory.build(root, examples=args.examples, progress=lambda s: print(
            f"  {s}", file=sys.stderr) if args.verbose else None)
    except (ValueError, FileNotFoundError) as e:
        raise UsageError(str(e)) from None
    text = rulehistory.render(found)
    path = root / "repro" / registration.FINDINGS
    if args.check:
        same = path.is_file() and path.read_text() == text
        print(f"{rel(path)}: {'current' if same else 'OUT OF DATE: repro registration --write'}")
        return 0 if same else 1
    path.write_text(text)
    print(f"{rel(path)}: written ({len(found['claims'])} claims)", file=sys.stderr)
    return 0


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

    g = sub.add_parser("registration", help="whether each claim's rule preceded its data: "
                       "first rule, first data, the commits that changed a decision since")
    g.add_argument("--write", action="store_true", help="compute it from the whole git "
                   "history and write repro/data/registration.json")
    g.add_argument("--check", action="store_true", help="compute it and exit 1 when the "
                   "committed file differs")
    g.add_argument("--examples", type=number(int, -1, "--examples must be 0 or more"),
                   default=100, metavar="N",
                   help="tables generated per commit to look for a changed decision "
                   "(default 100)")
    g.add_argument("--verbose", action="store_true", help="name each commit as it is checked")
    g.set_defaults(func=cmd_registration)

    s = sub.add_parser("site", help="build the static HTML documentation site")
    s.add_argument("--out", metavar="DIR", type=text, help="output directory (default "
                   "build/site; an existing one only if a build made it)")
    s.set_defaults(func=cmd_site)
