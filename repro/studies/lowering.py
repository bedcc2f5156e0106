"""What a compiled program computes its narrow-format products in, read from its optimized
HLO text, per platform: the ground for a record's ``emulated`` and ``weight_storage``.

Two questions, kept apart because a verdict needs them apart:

* **compute**: do the products run in the format on the device's matrix units? On a GPU,
  FP8 as cuBLASLt's FP8 GEMM (``__cublas$lt$matmul$f8``) or XLA's Triton GEMM with f8
  operands (:func:`fp8_lowering_gpu`), INT8 as an ``s8 x s8 -> s32`` dot or GEMM call
  (:func:`int8_lowering_gpu`). On a TPU, XLA's compiler makes no library calls: a product is
  a ``dot`` or ``convolution`` instruction (usually inside a fusion); ``s8 x s8 -> s32`` is
  the MXU's INT8 mode (native). An f8 product on a TPU is FP8 arithmetic only on a chip that
  has it (none of v5e, v5p, v6e: the registry's ``has_fp8``): elsewhere the compiler converts
  the f8 values to BF16, before the product or inside its fusion, and the reading says
  "upcast" whether or not the optimized HLO still spells a ``dot`` of two f8 operands. A
  record whose products did not run in its format is ``emulated``: no speed claim about the
  format's arithmetic may rest on it (:func:`recipe_emulated`). A program of a quantized
  recipe with no value of the format at all (``fp8-auto`` where every layer stayed in BF16)
  emulated nothing: it ran its compute dtype, natively, and its lowering ("no-f8", "no-s8")
  says that it is no result of the format.
* **storage** (:func:`weight_storage`): do the kernels that compute the products read the
  1-byte (or 4-bit) arrays from memory themselves? Then a narrow format moves fewer bytes
  than BF16 whatever it computes in: a real bandwidth gain (decode is bound by reading the
  weights), labelled ``weight_storage: native`` even where the compute is emulated.
  ``widened``: another kernel widens the narrow arrays first (the product reads 2-byte
  values). ``none``: no narrow array.

Every reading of a compiled program lives here (:mod:`repro.studies.timing` only times):
the labels above and what a program says of itself, :func:`compiled_facts` and
:func:`compiled_gemm_info`, two functions of the measuring kit (their source is part of a
record's kit fingerprint, :mod:`repro.program`) that call :func:`fp8_lowering` by name. The
labels' own code is outside the kit, so that reading a program differently changes no
record's program or kit fingerprint. The GPU readings are those the records have always
carried (the same functions); the CPU keeps them too. ``fp8_gemm_calls`` (``compiled_facts``) counts cuBLASLt's FP8 GEMM calls: a
GPU's, 0 on every other platform whatever the lowering. Both HLO spellings of
an operand are read: ``dot(%a, %b)`` (types from the operands' definitions) and
``dot(s8[128,512]{1,0} %a, ...)`` (types inline), with TPU layouts such as
``{1,0:T(8,128)(4,1)}``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import jax

if TYPE_CHECKING:
    from repro.precision.recipes import Recipe

# FP8 lowerings that are FP8 arithmetic: cuBLASLt's FP8 GEMM and XLA's Triton GEMM with f8
# operands (GPU), an f8 x f8 dot or convolution (TPU, on a chip with FP8 matrix units).
NATIVE_FP8 = ("cublaslt-f8", "fused-f8-dot", "f8-dot")

NARROW = ("s8", "u8", "s4", "u4", "f8e4m3fn", "f8e5m2", "f8e4m3", "f8e4m3fnuz", "f8e5m2fnuz",
          "f4e2m1fn", "f8e8m0fnu")

# Pallas kernels' calls (Triton on a GPU, Mosaic on a TPU): the repository's weight-only
# kernels (repro.precision.dequant_gemm)
_PALLAS_CALLS = ("__gpu$xla.gpu.triton", "tpu_custom_call")

_HEADER = re.compile(r"^(?:ENTRY )?%?([\w.\-]+) .*\{\s*$")
_INSTR = re.compile(r"^\s*(?:ROOT )?%?([\w.\-]+) = (.*?) ([a-z][\w\-]*)\(")
_OPERAND = re.compile(r"(?:([a-z][a-z0-9]*)\[[^\]]*\](?:\{[^}]*\})?\s+)?%([\w.\-]+)")


@dataclass(frozen=True)
class Instr:
    name: str
    dtype: str  # element type of the result (of its first element for a tuple)
    opcode: str
    operands: tuple[tuple[str | None, str], ...]  # (inline element type or None, name)
    line: str


def _operand_text(line: str, start: int) -> str:
    """The text between the parenthesis at ``start`` and the one closing it."""
    depth = 0
    for i in range(start, len(line)):
        depth += {"(": 1, ")": -1}.get(line[i], 0)
        if depth == 0:
            return line[start + 1:i]
    return line[start + 1:]


def computations(hlo_text: str) -> dict[str, list[Instr]]:
    """The instructions of each computation of an HLO module's text, by its name."""
    comps: dict[str, list[Instr]] = {}
    current: list[Instr] | None = None
    for line in hlo_text.splitlines():
        if current is None:
            if h := _HEADER.match(line):
                current = comps.setdefault(h.group(1), [])
            continue
        if line.startswith("}"):
            current = None
            continue
        m = _INSTR.match(line)
        if not m:
            continue
        name, rtype, opcode = m.groups()
        dtype = re.match(r"\(?([a-z][a-z0-9]*)", rtype)
        ops = _OPERAND.findall(_operand_text(line, m.end() - 1))
        current.append(Instr(name, dtype.group(1) if dtype else "", opcode,
                             tuple((t or None, n) for t, n in ops), line))
    return comps


def _types(comps: dict[str, list[Instr]]) -> dict[str, str]:
    return {i.name: i.dtype for c in comps.values() for i in c}


def _fused(comps: dict[str, list[Instr]]) -> set[str]:
    """Names of the computations that ``fusion`` instructions call: each one kernel."""
    return {m for c in comps.values() for i in c if i.opcode == "fusion"
            for m in re.findall(r"calls=%?([\w.\-]+)", i.line)}


def products(hlo_text: str) -> list[tuple[str, str, str, str]]:
    """``(opcode, result type, lhs type, rhs type)`` of every ``dot`` and ``convolution``."""
    comps = computations(hlo_text)
    types = _types(comps)
    out = []
    for c in comps.values():
        for i in c:
            if i.opcode in ("dot", "convolution") and len(i.operands) >= 2:
                a, b = ((t or types.get(n, "")) for t, n in i.operands[:2])
                out.append((i.opcode, i.dtype, a, b))
    return out


# ------------------------------------------------------------------------------ compute


def _tpu_has_fp8() -> bool:
    """Whether the TPU code paths are chosen for (:func:`repro.hardware.current`) has FP8
    arithmetic; a TPU's program read elsewhere (the CPU, without a target) is read as the
    registry's TPUs are: without it."""
    from repro import hardware

    info = hardware.current()
    return info.backend == "tpu" and info.has_fp8


def fp8_lowering_tpu(hlo_text: str, has_fp8: bool | None = None) -> str:
    """How a TPU program's f8 products run: "f8-dot" (a dot or convolution of two f8
    operands on a chip with FP8 arithmetic: its matrix units), "upcast" (f8 values converted
    to a wider type, before the product or, on a chip without FP8 arithmetic, inside it),
    "no-f8". ``has_fp8``: the chip's (None: :func:`_tpu_has_fp8`)."""
    if "f8e" not in hlo_text:
        return "no-f8"
    if any(a.startswith("f8") and b.startswith("f8") for _, _, a, b in products(hlo_text)):
        return "f8-dot" if (_tpu_has_fp8() if has_fp8 is None else has_fp8) else "upcast"
    return "upcast"


_WIDE_INTS = ("s16", "s32", "s64", "u16", "u32", "u64")


def int8_products(hlo_text: str) -> dict[str, int]:
    """How many products (``dot``, ``convolution``) multiply ``s8 x s8 -> s32`` ("s8": INT8
    matrix-unit arithmetic) and how many multiply wider integers ("widened": INT8 values the
    compiler converted first, as XLA:CPU does with a training step's weight gradients)."""
    native = widened = 0
    for _, out, a, b in products(hlo_text):
        if a == b == "s8" and out == "s32":
            native += 1
        elif a in _WIDE_INTS and b in _WIDE_INTS:
            widened += 1
    return {"s8": native, "widened": widened}


def _partial(label: str, hlo_text: str) -> str:
    """``label``, or "s8-partial" where an "s8-gemm" program also multiplies widened
    integers: some INT8 products ran natively, others did not."""
    if label == "s8-gemm" and int8_products(hlo_text)["widened"]:
        return "s8-partial"
    return label


def int8_lowering_tpu(hlo_text: str) -> str:
    """How a TPU program's INT8 products run: "s8-gemm" (every integer product a dot or
    convolution of two ``s8`` operands with an ``s32`` result: the MXU's INT8 mode),
    "s8-partial" (some, and others of wider integers: INT8 values converted first),
    "s8-other" (``s8`` values converted before every product, or another result type),
    "no-s8"."""
    if "s8[" not in hlo_text:
        return "no-s8"
    if any(a == b == "s8" and out == "s32" for _, out, a, b in products(hlo_text)):
        return _partial("s8-gemm", hlo_text)
    return "s8-other"


# ---------------------------------------------------------------------------- GPU


def _block_types(block: str) -> dict[str, str]:
    return dict(re.findall(r"%([\w.\-]+) = \(?([a-z0-9]+)\[", block))


def int8_lowering_gpu(hlo_text: str) -> str:
    """How a compiled program's INT8 products run: "s8-gemm" (a dot or GEMM call with two
    ``s8`` operands and an ``s32`` result: IMMA tensor cores on a GPU), "s8-partial" (such
    products, and dots of wider integers: INT8 values converted first), "s8-other" (``s8``
    operands with another result type, or converted before the product), "no-s8"."""
    if "s8[" not in hlo_text:
        return "no-s8"
    pat = r"= \(?([a-z0-9]+)\[[^\n]*? (?:dot|custom-call)\(%([\w.\-]+), %([\w.\-]+)"
    for block in re.split(r"\n\s*\n", hlo_text):
        types = _block_types(block)
        for out, a, b in re.findall(pat, block):
            if types.get(a) == types.get(b) == "s8" and out == "s32":
                return _partial("s8-gemm", hlo_text)
    return "s8-other"


_GPU_NARROW = ("s8", "f8e4m3fn", "f8e5m2", "f4e2m1fn", "s4", "u8")


PALLAS_TRITON_TARGET = "__gpu$xla.gpu.triton"  # a Pallas (Triton backend) kernel's call


def dequant_lowering_gpu(hlo_text: str) -> str:
    """Where a weight-only format's dequantization runs: "fused" (a computation holding a dot
    reads a 1-byte or 4-bit parameter: the GEMM kernel loads the narrow weights), "reduce" (no
    such dot, but a computation holding a reduce does: ``repro.precision.dequant_gemm``'s
    matrix-vector product as a reduction), "pallas" (a Pallas kernel's call reads a narrow
    array: ``dequant_gemm``'s kernel), "separate" (the weights are widened by another kernel
    before the GEMM), "none" (no narrow array)."""
    if not any(f"{t}[" in hlo_text for t in _GPU_NARROW):
        return "none"
    blocks = re.split(r"\n\s*\n", hlo_text)

    def reads_narrow(block):
        params = re.findall(r"= ([a-z0-9]+)\[[^\n]*? parameter\(", block)
        return any(t in _GPU_NARROW for t in params)

    for op, label in ((" dot(", "fused"), (" reduce(", "reduce")):
        if any(op in block and reads_narrow(block) for block in blocks):
            return label
    for block in blocks:
        types = _block_types(block)
        for line in block.splitlines():
            if PALLAS_TRITON_TARGET not in line:
                continue
            call = re.search(r" custom-call\(([^)]*)\)", line)
            operands = re.findall(r"%([\w.\-]+)", call.group(1)) if call else []
            if any(types.get(o) in _GPU_NARROW for o in operands):
                return "pallas"
    return "separate"


FP8_GEMM_TARGET = "__cublas$lt$matmul$f8"  # cuBLASLt's FP8 GEMM


def fp8_lowering_gpu(hlo_text: str) -> str:
    """How a GPU (or CPU) program's f8 products run. ``"cublaslt-f8"``: a call to cuBLASLt's
    FP8 GEMM. ``"fused-f8-dot"``: a ``dot`` whose two operands are f8 inside a fusion (XLA's
    Triton GEMM, which it prefers for small GEMMs: seen for 65536x256x256 and 2048x64x64 on
    an H200 with JAX 0.11.2): also FP8 tensor-core math. ``"upcast"``: the operands are
    converted to a wider type before the dot (CPU; or a GPU path that lost the FP8 GEMM).
    ``"no-f8"``: no f8 value anywhere (the other dtypes)."""
    if "f8e" not in hlo_text:
        return "no-f8"
    if FP8_GEMM_TARGET in hlo_text:
        return "cublaslt-f8"
    for block in re.split(r"\n\s*\n", hlo_text):  # one computation per block
        types = dict(re.findall(r"%([\w.\-]+) = ([a-z0-9]+)\[", block))
        for a, b in re.findall(r" dot\(%([\w.\-]+), %([\w.\-]+)\)", block):
            if types.get(a, "").startswith("f8") and types.get(b, "").startswith("f8"):
                return "fused-f8-dot"
    return "upcast"


def fp8_lowering(hlo_text: str, platform: str | None = None) -> str:
    """How a compiled program's f8 products run, read for ``platform`` (by default
    :func:`repro.hardware.platform`): :func:`fp8_lowering_tpu` on a TPU,
    :func:`fp8_lowering_gpu` on a GPU or CPU."""
    from repro import hardware

    if (platform or hardware.platform()) == "tpu":
        return fp8_lowering_tpu(hlo_text)
    return fp8_lowering_gpu(hlo_text)


def int8_lowering(hlo_text: str, platform: str | None = None) -> str:
    """:func:`int8_lowering_gpu` on a GPU or CPU, :func:`int8_lowering_tpu` on a TPU
    (``platform``: by default :func:`repro.hardware.platform`)."""
    from repro import hardware

    if (platform or hardware.platform()) == "tpu":
        return int8_lowering_tpu(hlo_text)
    return int8_lowering_gpu(hlo_text)


# ------------------------------------------------------------------------ record labels

NO_NARROW = ("no-f8", "no-s8")  # a program with no value of the recipe's narrow format


def narrow_lowering(recipe: Recipe, facts: dict) -> str:
    """The lowering of ``recipe``'s own narrow format among a program's ``facts``
    (``int8_lowering`` for an INT8 recipe, else ``fp8_lowering``)."""
    return facts["int8_lowering" if recipe.gemm == "int8" else "fp8_lowering"]


def int8_facts(recipe: Recipe, compiled) -> dict:
    """``{"int8_lowering", "int8_products"}`` of a compiled program (its ``as_text()``) of
    an INT8 ``recipe`` (:func:`int8_lowering`, :func:`int8_products`), ``{}`` for any other
    recipe: what a record adds to the measuring kit's ``compiled_facts``."""
    if recipe.gemm != "int8":
        return {}
    text = compiled.as_text() or ""
    return {"int8_lowering": int8_lowering(text), "int8_products": int8_products(text)}


def recipe_emulated(recipe: Recipe | str, lowering: str | dict, hardware=None) -> bool:
    """Whether a timing of ``recipe`` measures emulation rather than its format, from how its
    compiled program ran (``lowering``: the lowering of the recipe's narrow format, or the
    program's facts, from which :func:`narrow_lowering` takes it) on ``hardware`` (by default
    :func:`repro.hardware.detect`).

    A program with no value of the recipe's format (:data:`NO_NARROW`: a per-layer policy
    that kept every layer in its compute dtype) emulated nothing: False, and its lowering
    says it is no result of the format. Otherwise ``repro.precision.ops.is_emulated`` (no
    matrix-unit arithmetic for the format on the hardware), and also an FP8 recipe whose
    products ran as no FP8 GEMM (``lowering`` is none of :data:`NATIVE_FP8`) and an INT8
    recipe whose products ran as no ``s8 x s8 -> s32`` product."""
    from repro.hardware import detect
    from repro.precision import ops
    from repro.precision.recipes import resolve

    r = resolve(recipe)  # a name too: records' measuring kits pass their recipes' names
    low = narrow_lowering(r, lowering) if isinstance(lowering, dict) else lowering
    if r.gemm in ("fp8", "int8") and low in NO_NARROW:
        return False
    if ops.is_emulated(r, hardware or detect()):
        return True
    if r.gemm == "fp8":
        return low not in NATIVE_FP8
    if r.gemm == "int8":
        return low != "s8-gemm"
    return False


# ------------------------------------------------------------------------------ storage


def _narrow_reads(hlo_text: str) -> str:
    """Which kernel reads the narrow arrays first: "product" (a dot, convolution or GEMM call
    has a narrow operand), "fused" (a fused computation holding a dot or convolution reads
    a narrow parameter: the widening is part of the product's kernel), "reduce" (the same
    with a reduce: a matrix-vector product as a reduction), "pallas" (a Pallas kernel reads a
    narrow array), "separate" (other kernels widen them), "none" (no narrow array; a cuBLAS
    call's ``s8`` workspace, an element of its tuple result, is not one)."""
    comps = computations(hlo_text)
    types, fused = _types(comps), _fused(comps)
    if not any(i.dtype in NARROW for c in comps.values() for i in c):
        return "none"

    def narrow(operands):
        return any((t or types.get(n)) in NARROW for t, n in operands)

    for name, c in comps.items():
        for i in c:
            if i.opcode in ("dot", "convolution") and narrow(i.operands[:2]):
                return "product"
            if (i.opcode == "custom-call" and "__cublas$" in i.line
                    and narrow(i.operands[:2])):
                return "product"
    for op, label in ((("dot", "convolution"), "fused"), (("reduce",), "reduce")):
        for name, c in comps.items():
            if name in fused and any(i.opcode in op for i in c) and any(
                    i.opcode == "parameter" and i.dtype in NARROW for i in c):
                return label
    for c in comps.values():
        for i in c:
            if (i.opcode == "custom-call" and any(t in i.line for t in _PALLAS_CALLS)
                    and narrow(i.operands)):
                return "pallas"
    return "separate"


def dequant_lowering_tpu(hlo_text: str) -> str:
    """Where a TPU program's weight-only dequantization runs, in the labels of
    :func:`dequant_lowering_gpu`: "fused", "reduce", "pallas",
    "separate" or "none" (a product of narrow operands counts as "fused")."""
    how = _narrow_reads(hlo_text)
    return "fused" if how == "product" else how


def dequant_lowering(hlo_text: str, platform: str) -> str:
    """:func:`dequant_lowering_gpu` on a GPU or CPU,
    :func:`dequant_lowering_tpu` on a TPU."""
    return (dequant_lowering_tpu(hlo_text) if platform == "tpu"
            else dequant_lowering_gpu(hlo_text))


def weight_storage(hlo_text: str) -> str:
    """Whether the kernels computing the products read the narrow arrays from memory
    themselves (the same reading on every platform): "native" (a product of narrow operands,
    or the widening fused into the product's kernel, a reduction's or a Pallas kernel's),
    "widened" (other kernels widen them first), "none" (no narrow array)."""
    how = _narrow_reads(hlo_text)
    return {"none": "none", "separate": "widened"}.get(how, "native")


# ------------------------------------------------- what a compiled program says of itself

_NOT_KERNELS = frozenset({"parameter", "constant", "tuple", "get-tuple-element", "bitcast"})


def entry_ops(hlo_text: str) -> dict[str, int]:
    """Opcode counts of the ENTRY computation of an optimized HLO module, leaving out those
    that launch nothing (parameters, constants, tuples, bitcasts). On a GPU each remaining op
    (``fusion``, ``custom-call`` to cuBLAS, ``copy``...) is about one kernel; loops (``while``)
    count once, whatever their bodies launch."""
    start = hlo_text.find("ENTRY")
    if start < 0:
        return {}
    end = hlo_text.find("\n}", start)
    body = hlo_text[start:end if end > 0 else None]
    counts: dict[str, int] = {}
    for op in re.findall(r"^\s*(?:ROOT )?%?[\w.\-]+ = .*?[\]})] ([a-z][\w\-]*)\(", body,
                         re.M):
        if op not in _NOT_KERNELS:
            counts[op] = counts.get(op, 0) + 1
    return counts


def compiled_facts(compiled) -> dict[str, Any]:
    """What a compiled program says about itself: how many cuBLASLt FP8 GEMM calls it makes,
    how its f8 products lower (:func:`fp8_lowering`), its buffer bytes (arguments + outputs
    + temporaries - aliased, from XLA's ``memory_analysis``), and XLA's own static cost
    estimate: ``hlo_bytes_accessed`` and ``hlo_flops`` (``cost_analysis``) and ``hlo_kernels``
    (launching ops of the ENTRY computation, :func:`entry_ops`). None where not implemented.
    The step-time model (``repro.perfmodel``) can read a program's traffic and kernel count
    from these instead of assuming them."""
    text = compiled.as_text() or ""
    ops = entry_ops(text)
    facts: dict[str, Any] = {"fp8_gemm_calls": text.count(FP8_GEMM_TARGET),
                             "fp8_lowering": fp8_lowering(text), "memory_bytes": None,
                             "hlo_kernels": sum(ops.values()) if ops else None,
                             "hlo_bytes_accessed": None, "hlo_flops": None}
    try:
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, (list, tuple)) else cost
        facts["hlo_bytes_accessed"] = float(cost["bytes accessed"])
        facts["hlo_flops"] = float(cost["flops"])
    except Exception:  # not every backend implements it
        pass
    try:
        m = compiled.memory_analysis()
        facts["memory_bytes"] = int(m.argument_size_in_bytes + m.output_size_in_bytes
                                    + m.temp_size_in_bytes - m.alias_size_in_bytes)
    except Exception:  # not every backend implements it
        pass
    return facts


def compiled_gemm_info(fn: Callable, *args) -> dict[str, Any]:
    """What the compiled GEMM is: ``hlo_fp8_gemm`` (the HLO calls ``__cublas$lt$matmul$f8``),
    ``fp8_lowering`` (see :func:`fp8_lowering`) and the custom-call targets it names."""
    text = jax.jit(fn).lower(*args).compile().as_text()
    targets = sorted(set(re.findall(r'custom_call_target="([^"]+)"', text)))
    return {"hlo_fp8_gemm": FP8_GEMM_TARGET in text, "fp8_lowering": fp8_lowering(text),
            "custom_calls": targets}
