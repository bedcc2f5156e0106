"""Every claim's decision rule, as a pure function of small tables.

One function per claim (``a1`` ... ``a12``, ``b1`` ... ``b6``, ``c1``, ``c2``), collected here from each
experiment's ``rules`` (``repro/experiments/<name>/rules.py``) and from the rules shared by
several experiments' records (:mod:`repro.claims.verdicts.nvfp4`): each takes the tables that
``repro.analysis`` builds from the records (or the few numbers a claim needs) and returns a
:class:`Verdict`: the verdict, its key number (text, with units), the hardware and records it
rests on. Nothing here reads files, draws or writes: the notebooks compute the tables, call these
functions, show the result, and hand it to ``repro.claims.ledger.write_verdict``.

The vocabulary (:data:`VERDICTS`): **reproduced** (the data support the claim), **partly** (part
of it holds, or it holds in a narrower scope), **contradicted** (the data go against it),
**inconclusive** (measured, but the data cannot tell), **projected** (a model's projection, not a
measurement), **not yet measured**.
"""

from repro.verdict import VERDICTS, Verdict, definitions, margin, rule
from repro.claims.verdicts.nvfp4 import b1, b2, b3, b4, b5
from repro.experiments.grpo.rules import a12
from repro.experiments.inference.rules import b6
from repro.experiments.legged.rules import a11
from repro.experiments.rl_quality.rules import QualityEvidence, a5, a6, a7, a8, a10, c2
from repro.experiments.rl_throughput.rules import a1, a2, a3, a4, a9, c1

__all__ = ["VERDICTS", "QualityEvidence", "Verdict", "definitions", "margin", "rule",
           "a1", "a2", "a3", "a4", "a5", "a6", "a7", "a8", "a9", "a10", "a11", "a12",
           "b1", "b2", "b3", "b4", "b5", "b6", "c1", "c2"]
