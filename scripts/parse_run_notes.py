"""Give the committed records structured run conditions parsed from their run notes.

Records made before the runner checked its GPUs with nvidia-smi carry only a free-text
``run_note`` ("alone on the GPU", "GPU 1 of 2; beside it on GPU 0: repro.lm.experiments ...").
This script adds the note's meaning as ``conditions`` (:func:`repro.claims.staleness.
conditions_of_note`) to every record under results/ that has a note it can read and no
``conditions`` yet; the note stays, and nothing else in the file changes (a record that has
``conditions``, measured or parsed, is left as it is). Run it again: it changes nothing.

    python scripts/parse_run_notes.py            # rewrite the record files
    python scripts/parse_run_notes.py --check    # exit 1 if a file would change
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from repro.claims.staleness import conditions_of_note
from repro.results import results_dir


def with_conditions(records: list) -> tuple[list, int]:
    """``records`` with parsed ``conditions`` added where a note reads and none is there; how
    many were added."""
    added = 0
    out = []
    for rec in records:
        if isinstance(rec, dict) and "conditions" not in rec:
            c = conditions_of_note(rec.get("run_note"))
            if c is not None:
                rec = {**rec, "conditions": c}
                added += 1
        out.append(rec)
    return out, added


def text(records: list) -> str:
    """A record file's text, as :func:`repro.results.write_records` writes it."""
    return json.dumps(records, indent=1, sort_keys=True) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--check", action="store_true", help="write nothing; exit 1 if a record "
                   "file would change")
    args = p.parse_args(argv)
    files = added = 0
    for path in sorted(Path(results_dir()).glob("*/*/*.json")):
        data = json.loads(path.read_text())
        records = data if isinstance(data, list) else [data]
        new, n = with_conditions(records)
        if not n:
            continue
        files += 1
        added += n
        if not args.check:
            path.write_text(text(new if isinstance(data, list) else new[0]))
    verb = "would give" if args.check else "gave"
    print(f"{verb} {added} record(s) in {files} file(s) conditions parsed from their run notes")
    return 1 if args.check and added else 0


if __name__ == "__main__":
    sys.exit(main())
