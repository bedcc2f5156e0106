"""The experiments: one package each, ``repro/experiments/<name>/``, declared in
:mod:`repro.catalogue`.

A package holds ``measure.py``, its study (the module exporting its ``STUDY``: cells and
programs, :mod:`repro.studies.runner`), ``tables.py``, its tables from records, ``rules.py``, its
claims' decision rules (each where it has its own), and any helper module that is its alone. An
experiment's modules import no other experiment's: what several share lives on a floor below
(:mod:`repro.studies`, :mod:`repro.analysis`, :mod:`repro.models`).
"""
