"""Nothing outside a claim's ledger set changes its verdict: a notebook run on the committed
records with every record outside its claims' ledger sets perturbed (values times ten, plus
one) writes the same verdicts as a run on the records as they are. Slow: it runs a notebook
twice (about three minutes on 2 cores)."""

import os
import subprocess
import sys
import textwrap

import pytest

from repro import checkout

DRIVER = textwrap.dedent('''
    import contextlib, io, json, os, re, sys, tempfile
    import matplotlib; matplotlib.use("Agg")
    name, perturb = sys.argv[1], sys.argv[2] == "1"
    os.environ["REPRO_STAGING"] = tempfile.mkdtemp()
    from repro import evidence
    from repro.claims import ledger_set, registration
    from repro.verdict import definitions
    claims = [c for c, d in definitions().items() if d.get("notebook") == name]
    got, real = {}, registration.judged
    def judged(fn, claim, *a, **k):
        v = real(fn, claim, *a, **k); got[claim] = [v.verdict, v.key_number]; return v
    registration.judged = judged
    if perturb:
        ents, load = ledger_set.of_claims(claims), evidence.load_records
        def perturbed(*a, **k):
            df = load(*a, **k)
            if not len(df): return df
            inside = df["source"].map(lambda s: any(e.matches(*ledger_set.cell_of(s))
                                                    for e in ents))
            df = df.copy()
            df.loc[~inside, "value"] = df.loc[~inside, "value"] * 10 + 1
            return df
        evidence.load_records = perturbed
    src = open(f"notebooks/{name}.py").read()
    src = re.sub(r'^profile = "smoke"', 'profile = "full"', src, flags=re.M)
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(src, name, "exec"), {"__name__": "__main__"})
    print(json.dumps(got, sort_keys=True))
''')


def verdicts_of(name: str, perturb: bool) -> str:
    env = {**os.environ, "JAX_PLATFORMS": "cpu", "PYTHONPATH": str(checkout.CHECKOUT)}
    out = subprocess.run([sys.executable, "-c", DRIVER, name, "1" if perturb else "0"],
                         cwd=checkout.CHECKOUT, env=env, capture_output=True, text=True,
                         timeout=1200)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("name", ["03_rl_throughput"])
def test_records_outside_the_ledger_change_no_verdict(name):
    import json

    plain, perturbed = verdicts_of(name, False), verdicts_of(name, True)
    assert json.loads(plain), "the notebook judged no claim"
    assert plain == perturbed
