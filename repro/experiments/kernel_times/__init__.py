"""`repro trace`: kernel times of other experiments' steps (notebook 06): ``measure`` (its
study), ``tables``; ``spec``: its entry of :mod:`repro.experiments`."""
