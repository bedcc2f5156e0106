"""The GEMM roofline sweep (notebook 02): ``measure`` (its study); ``spec``: its entry of
:mod:`repro.experiments`."""
