"""A program's file hashes (repro.fingerprint.source_hash) are the same under every Python minor
version that can parse the code, so a record traced on a machine with another Python (a TPU
VM's 3.11) is checked here without a retrace; and they still tell code apart."""

import glob
import os
import shutil
import subprocess
import sys

import pytest

from repro import checkout, fingerprint

CODE = """
import sys, glob
sys.path.insert(0, {root!r})
from repro import fingerprint
for f in sorted(glob.glob({root!r} + '/repro/**/*.py', recursive=True)):
    print(f, fingerprint.source_text_hash(open(f, 'rb').read()))
"""


def _others() -> list[str]:
    found = []
    for name in ("python3.11", "python3.13"):
        if (p := shutil.which(name)) and "shims" not in p and p not in found:
            found.append(p)
    for p in sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.1[13]*/bin/python3"))):
        if p not in found:
            found.append(p)
    return found


def test_code_changes_change_the_hash_prose_and_fstring_spelling_do_not():
    h = fingerprint.source_text_hash
    assert h('def f(x):\n    """Doc."""\n    return x + 1  # why\n') == h("def f(x):\n\n    return (x\n            + 1)\n")
    assert h("def f(x):\n    return x + 1\n") != h("def f(x):\n    return x + 2\n")
    assert h('y = f"{x:<{w}}"\n') != h('y = f"{x:>{w}}"\n')


@pytest.mark.parametrize("python", _others() or [None])
def test_the_hashes_of_this_package_agree_across_python_minor_versions(python):
    if python is None:
        pytest.skip("no other Python 3.11 or 3.13 on this machine")
    root = str(checkout.CHECKOUT)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    runs = [subprocess.run([exe, "-c", CODE.format(root=root)], capture_output=True, text=True,
                           env=env, timeout=120) for exe in (sys.executable, python)]
    assert all(r.returncode == 0 for r in runs), runs[1].stderr[-500:]
    assert runs[0].stdout == runs[1].stdout and runs[0].stdout.count("\n") > 50
