"""How a record was made: what else computed on this process's GPUs while its cell ran.

:func:`run_conditions` asks ``nvidia-smi`` which other processes computed on this process's
GPUs; the study runner asks before and after each cell and stamps the two answers on its
records (``conditions``, :func:`merge_conditions`), so "alone on the GPU" is a fact of the
record, not a note. Nothing here imports the rest of the package.
"""

from __future__ import annotations

import os
import subprocess
from typing import Any

#: What ``nvidia-smi`` is asked (the free-text field last, so a comma in it cannot shift the
#: others): this machine's GPUs, and the processes computing on them.
GPU_QUERY = "index,uuid,memory.used,memory.total,utilization.gpu,name"
APPS_QUERY = "gpu_uuid,pid,used_memory,process_name"


class _Unreadable(ValueError):
    """What ``nvidia-smi`` gave instead of a table (one line)."""


def _smi(query: str, timeout_s: float) -> list[list[str]]:
    """The rows of one ``nvidia-smi --query-...`` (CSV, no header, no units), each split into
    the query's fields; :class:`_Unreadable` where it is missing, fails, hangs or prints
    something else."""
    cmd = ["nvidia-smi", query, "--format=csv,noheader,nounits"]
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except FileNotFoundError:
        raise _Unreadable("no nvidia-smi on PATH") from None
    except subprocess.TimeoutExpired:
        raise _Unreadable(f"nvidia-smi {query} took longer than {timeout_s:g} s") from None
    except (OSError, subprocess.SubprocessError) as e:
        raise _Unreadable(f"nvidia-smi could not run: {e}") from None
    if out.returncode != 0:
        said = (out.stderr.strip() or out.stdout.strip()).splitlines()
        raise _Unreadable(f"nvidia-smi {query} exited with {out.returncode}"
                          + (f": {said[0][:200]}" if said else ""))
    n = query.split("=", 1)[1].count(",") + 1
    rows = [[f.strip() for f in line.split(",", n - 1)] for line in out.stdout.splitlines()
            if line.strip() and not line.startswith("No running processes found")]
    if bad := next((r for r in rows if len(r) != n), None):
        raise _Unreadable(f"nvidia-smi {query} printed {','.join(bad)[:80]!r}, not {n} "
                          "fields")
    return rows


def _int(text: str, what: str, required: bool = False) -> int | None:
    """``text`` as an int; None where nvidia-smi has no value (``[N/A]``, ``[Not
    Supported]``), :class:`_Unreadable` where a ``required`` one (a pid, an index) is not."""
    try:
        return int(float(text))
    except (ValueError, OverflowError):
        if required or not text.startswith("["):
            raise _Unreadable(f"nvidia-smi printed {text[:40]!r} for {what}") from None
        return None


def _ours(gpus: list[dict[str, Any]], visible: str | None) -> list[dict[str, Any]]:
    """The GPUs ``CUDA_VISIBLE_DEVICES`` (``visible``) names, by index or by UUID (or a
    prefix of one, as CUDA accepts); every GPU where it is unset."""
    if visible is None:
        return gpus
    names = [v.strip() for v in visible.split(",") if v.strip()]
    return [g for g in gpus if any(str(g["index"]) == v or g["uuid"].startswith(v)
                                   for v in names)]


def run_conditions(timeout_s: float = 10.0) -> dict[str, Any]:
    """What else computed on this process's GPUs, as ``nvidia-smi`` lists them now:
    ``{"checked": "nvidia-smi", "gpus": [...], "others": [{"pid", "name", "used_mib",
    "gpu"}], "alone": bool}``. Only the GPUs ``CUDA_VISIBLE_DEVICES`` names count (indices
    are nvidia-smi's, the PCI bus order); this process is not among the others. Where
    ``nvidia-smi`` is missing, fails, takes longer than ``timeout_s`` or prints what cannot be
    read, or none of its GPUs is this process's: ``{"checked": None, "why": one line, "alone":
    None}``: a condition not checked is never "alone". Never raises.

    It sees what nvidia-smi sees: a process in a container whose PID namespace nvidia-smi
    cannot resolve may not be listed."""
    try:
        gpus = [{"index": _int(i, "a GPU index", True), "uuid": uuid, "name": name,
                 "memory_used_mib": _int(used, "memory.used"),
                 "memory_total_mib": _int(total, "memory.total"),
                 "utilization_pct": _int(util, "utilization.gpu")}
                for i, uuid, used, total, util, name in _smi(f"--query-gpu={GPU_QUERY}",
                                                             timeout_s)]
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        ours = {g["uuid"]: g["index"] for g in _ours(gpus, visible)}
        if not ours:
            raise _Unreadable("none of the GPUs nvidia-smi lists is this process's"
                              + (f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None
                                 else ""))
        others = []
        for uuid, pid, used, name in _smi(f"--query-compute-apps={APPS_QUERY}", timeout_s):
            pid = _int(pid, "a pid", True)
            if uuid in ours and pid != os.getpid():
                others.append({"pid": pid, "name": name, "used_mib": _int(used, "used_memory"),
                               "gpu": ours[uuid]})
    except _Unreadable as e:
        return {"checked": None, "why": " ".join(str(e).split()), "alone": None}
    return {"checked": "nvidia-smi", "gpus": [g for g in gpus if g["uuid"] in ours],
            "others": others, "alone": not others}


def merge_conditions(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """The ``conditions`` of a cell's records from :func:`run_conditions` taken before and
    after it ran: ``alone`` True only where both were checked and found no other process,
    False where either found one, else None (not checked); both samples kept."""
    samples = (before.get("alone"), after.get("alone"))
    alone = False if False in samples else True if samples == (True, True) else None
    return {"alone": alone, "before": before, "after": after}

