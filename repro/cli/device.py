"""The commands about this machine and the recipes: ``repro check`` (the numerics check of
this device), ``repro hardware`` and ``repro recipes``."""

from __future__ import annotations




def cmd_check(args) -> int:
    import jax

    from repro.precision import check as numerics

    rows = numerics.checks()
    dev = jax.devices()[0]
    print(f"numerics check on {dev.platform}:{dev.device_kind} (jax {jax.__version__})")
    for r in rows:
        flag = "ok  " if r["ok"] else ("FAIL" if r["required"] else "note")
        print(f"  [{flag}] {r['check']}")
    return 1 if any(r["required"] and not r["ok"] for r in rows) else 0


def cmd_hardware(args) -> int:
    from repro import tables

    print(tables.hardware())
    return 0


def cmd_recipes(args) -> int:
    from repro import tables

    print(tables.recipes())
    return 0


def add_check(sub) -> None:
    """The ``check`` command."""
    sub.add_parser("check", help="check that every rounding the experiments rely on happens "
                   "on this device").set_defaults(func=cmd_check)


def add(sub) -> None:
    """The ``hardware`` and ``recipes`` commands."""
    sub.add_parser("hardware", help="the detected hardware and the datasheet registry"
                   ).set_defaults(func=cmd_hardware)
    sub.add_parser("recipes", help="the precision registry").set_defaults(func=cmd_recipes)
