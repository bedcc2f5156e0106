"""Low-precision inference: quality and speed (notebook 11): ``measure`` (its study),
``tables``, ``rules``, ``speed`` (the speed half of its study); ``spec``: its entry of
:mod:`repro.experiments`."""
