"""A verdict's inputs as data: JSON that keeps tables, tuples, dataclasses and non-finite
numbers (:func:`dump`, :func:`load`), so that every version of a claim's rule can be run again
on exactly what today's verdict saw (:func:`repro.claims.registration.write_inputs` writes them
to ``verdicts/inputs/``; :mod:`repro.claims.rulecode` runs the rules)."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import math
from types import SimpleNamespace
from typing import Any

import numpy as np
import pandas as pd


def encode(x: Any) -> Any:
    """``x`` as JSON-able data that :func:`decode` turns back into an equal object."""
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, (int, np.integer)) and not isinstance(x, bool):
        return int(x)
    if isinstance(x, (float, np.floating)):
        x = float(x)
        return x if math.isfinite(x) else {"__float__": repr(x)}
    if isinstance(x, np.bool_):
        return bool(x)
    if isinstance(x, tuple):
        return {"__tuple__": [encode(v) for v in x]}
    if isinstance(x, list):
        return [encode(v) for v in x]
    if isinstance(x, (set, frozenset)):
        return {"__set__": sorted((encode(v) for v in x), key=repr)}
    if isinstance(x, dict):
        return {"__dict__": [[encode(k), encode(v)] for k, v in x.items()]}
    if isinstance(x, pd.Timestamp):
        return {"__timestamp__": x.isoformat()}
    if x is pd.NaT:
        return {"__nat__": True}
    if isinstance(x, np.ndarray):
        return {"__array__": encode(x.tolist()), "dtype": str(x.dtype)}
    if isinstance(x, pd.DataFrame):
        return {"__frame__": {
            "columns": [encode(c) for c in x.columns],
            "dtypes": [str(t) for t in x.dtypes],
            "index": _index(x.index),
            "rows": [[encode(v) for v in row] for row in x.itertuples(index=False, name=None)]}}
    if isinstance(x, pd.Series):
        return {"__series__": {"name": encode(x.name), "dtype": str(x.dtype),
                               "index": _index(x.index),
                               "values": [encode(v) for v in x.tolist()]}}
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        cls = type(x)
        return {"__dataclass__": f"{cls.__module__}:{cls.__qualname__}",
                "fields": {f.name: encode(getattr(x, f.name)) for f in dataclasses.fields(x)}}
    raise TypeError(f"cannot write a {type(x).__name__} as verdict input data")


def _index(ix: pd.Index) -> dict[str, Any]:
    if isinstance(ix, pd.RangeIndex) and ix.start == 0 and ix.step == 1:
        return {"range": len(ix), "name": encode(ix.name)}
    return {"values": [encode(v) for v in ix.tolist()], "names": [encode(n) for n in ix.names],
            "dtype": str(ix.dtype)}


def _unindex(d: dict[str, Any]) -> pd.Index:
    if "range" in d:
        return pd.RangeIndex(d["range"], name=decode(d["name"]))
    values = [decode(v) for v in d["values"]]
    names = [decode(n) for n in d["names"]]
    if len(names) > 1:
        return pd.MultiIndex.from_tuples(values, names=names)
    ix = pd.Index(values, name=names[0], dtype="object" if d["dtype"] == "object" else None)
    return ix.astype(d["dtype"]) if d["dtype"] != "object" and len(ix) else ix


def decode(x: Any) -> Any:
    """The object :func:`encode` wrote."""
    if isinstance(x, list):
        return [decode(v) for v in x]
    if not isinstance(x, dict):
        return x
    if "__float__" in x:
        return float(x["__float__"])
    if "__tuple__" in x:
        return tuple(decode(v) for v in x["__tuple__"])
    if "__set__" in x:
        return {decode(v) for v in x["__set__"]}
    if "__dict__" in x:
        return {_hashable(decode(k)): decode(v) for k, v in x["__dict__"]}
    if "__timestamp__" in x:
        return pd.Timestamp(x["__timestamp__"])
    if "__nat__" in x:
        return pd.NaT
    if "__array__" in x:
        return np.array(decode(x["__array__"]), dtype=x["dtype"])
    if "__frame__" in x:
        f = x["__frame__"]
        cols = [_hashable(decode(c)) for c in f["columns"]]
        rows = [[decode(v) for v in r] for r in f["rows"]]
        df = pd.DataFrame.from_records(rows, columns=pd.Index(cols, dtype=object),
                                       nrows=len(rows)) if rows else pd.DataFrame(columns=cols)
        df.columns = pd.Index(cols)
        for c, t in zip(cols, f["dtypes"]):
            if t != "object" and str(df[c].dtype) != t:
                with contextlib.suppress(TypeError, ValueError):
                    df[c] = df[c].astype(t)
        df.index = _unindex(f["index"])
        return df
    if "__series__" in x:
        s = x["__series__"]
        out = pd.Series([decode(v) for v in s["values"]], index=_unindex(s["index"]),
                        name=decode(s["name"]), dtype="object")
        if s["dtype"] != "object":
            with contextlib.suppress(TypeError, ValueError):
                out = out.astype(s["dtype"])
        return out
    if "__dataclass__" in x:
        fields = {k: decode(v) for k, v in x["fields"].items()}
        module, _, name = x["__dataclass__"].partition(":")
        try:
            cls = importlib.import_module(module)
            for part in name.split("."):
                cls = getattr(cls, part)
            return cls(**fields)
        except (ImportError, AttributeError, TypeError):
            return SimpleNamespace(**fields)
    return {k: decode(v) for k, v in x.items()}


def _hashable(x: Any) -> Any:
    return tuple(_hashable(v) for v in x) if isinstance(x, list) else x


def dump(args: tuple, kw: dict[str, Any]) -> str:
    """The text of a verdict's inputs: its positional and keyword arguments."""
    return json.dumps({"args": encode(list(args)), "kwargs": encode(kw)}, indent=None,
                      separators=(",", ":")) + "\n"


def load(text: str) -> tuple[tuple, dict[str, Any]]:
    """(args, kwargs) of a text :func:`dump` wrote."""
    data = json.loads(text)
    return tuple(decode(data["args"])), decode(data["kwargs"])
