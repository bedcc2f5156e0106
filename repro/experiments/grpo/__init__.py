"""GRPO fine-tuning (notebook 12): ``measure`` (its study), ``tables``, ``rules``; ``spec``:
its entry of :mod:`repro.experiments`."""
