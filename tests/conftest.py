"""Suite-wide settings, applied before any test module imports JAX.

The tests check what programs compute, not how fast they run: XLA's CPU backend is asked for
its cheapest code generation (LLVM optimization level 0, no expensive LLVM passes). Compiling
is most of this suite's time: on 2 cores it runs in about two thirds of the time. The HLO
passes, and with them every fusion and rounding the numerics tests look at, are unchanged.
A caller's own XLA_FLAGS come after these and so win where they set the same flag;
subprocesses inherit them.
"""

import os

SUITE_XLA_FLAGS = "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true"

os.environ["XLA_FLAGS"] = f"{SUITE_XLA_FLAGS} {os.environ.get('XLA_FLAGS', '')}".strip()
