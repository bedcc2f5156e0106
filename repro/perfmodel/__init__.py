"""A calibrated step-time model: what a training step costs, GEMM by GEMM and pass by pass.

Claim B2 ("MaxText LLM training up to 1.6x faster with NVFP4 on Blackwell") cannot be measured
on a Hopper GPU (no FP4 tensor cores). This module turns what CAN be measured there into a
labelled projection:

1. A step is a list of GEMMs (:class:`Gemm`: ``m x k x n``, how many launches, which format)
   plus memory traffic (:class:`Traffic`: bytes of one kind of elementwise / quantization pass).
   :func:`mlp_step_gemms` and :func:`lm_step_gemms` build the steps of the ReLU MLP of
   ``repro.studies.mlp_step`` and of a Llama-style decoder.
2. Time of a step (:func:`predict`)::

       t_step = sum_g t_gemm(g) + sum_p bytes_p / (bandwidth * bw_eff) + gap * n_launches

   ``t_gemm``: the MEASURED rate where the ``gemm`` sweep has this shape (minus the sweep's
   per-call overhead, never below the roofline), else the measured rate interpolated in
   log(flops) and multiplied by ``offsweep_gemm_eff``; for a format or chip without
   measurements, the datasheet peak times the efficiency the measured chip reaches on the
   same shape. ``gap``: idle device time per GEMM launch (``gap_per="gemm"``, the default:
   the kernel traces show idle time at the GEMMs, while the many small elementwise kernels of
   an FP8 step run back to back), or per launch of any kernel (``gap_per="kernel"``, the
   model before the traces; notebook 06 compares the two).
3. :func:`calibrate` fits the free parameters (``offsweep_gemm_eff``, ``bw_eff``, ``gap_us``
   unless kernel traces measure it, ``step_floor_us``) on MEASURED BF16 step times only: of
   ``mlp_step`` (the MLP) and, where recorded, ``lm_step`` (this repository's decoder LM,
   ``repro.studies.lm_step``, whose step is :func:`lm_step_gemms` of its preset); :func:`validate`
   then predicts the FP8 step times of both and compares the FP8/BF16 speedup with the
   measured one, shape by shape (emulated records never count). The FP8 numbers are never
   used in the fit. Where step records carry the compiled program's facts (XLA's bytes
   accessed and launching ops, ``repro.studies.gemm.compiled_facts``), :func:`program_step` takes
   each program's elementwise traffic and kernel count from them instead of the assumed
   passes of :func:`_quant_traffic` (static facts of the program, not timings, so the FP8
   side still predicts without any FP8 timing).
4. :func:`project` applies the calibrated efficiencies to another chip's datasheet peaks
   (B200, GB200, GB300): an ASSUMPTION, recorded as such. Projection records are written under
   the chip that calibrated the model (``sizes.target`` names the projected chip), carry
   ``extra.kind = "projection"`` and metric names starting with ``projected_``, so nothing
   poses as a Blackwell measurement.

    python -c "from repro import perfmodel; perfmodel.record('full')"  # after gemm, *_step
    repro notebook 06_perfmodel --profile full                         # the same, plus figures
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from repro import hardware as hw
from repro import results
from repro.precision.recipes import resolve

EXPERIMENT = "perfmodel"
CLAIMS = ("B2",)

FORMATS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4")
# Bytes per stored element. NVFP4: 4-bit values plus one E4M3 scale per 16 elements.
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0,
                 "fp4": 0.5 + 1.0 / 16}
# Where a format has no measured rate, the efficiency of this measured format stands in
# (Hopper has no FP4 tensor cores: FP4 borrows FP8's efficiency, an assumption).
FORMAT_PROXY = {"fp4": "fp8", "fp8": "fp8", "bf16": "bf16", "fp16": "bf16", "tf32": "tf32",
                "fp32": "fp32"}
FALLBACK_PROXY = {"fp16": "bf16", "tf32": "bf16", "fp32": "tf32", "fp4": "bf16", "fp8": "bf16"}

# The FP8 recipes the step model validates against measured steps (registry names).
FP8_RECIPES = ("fp8-current", "fp8-delayed", "flax-fp8")
NVFP4_POLICIES = ("paper", "mlp", "all")  # as repro.models.lm.NVFP4_SCOPES
TARGETS = ("b200", "gb200", "gb300")
GAP_PER = ("gemm", "kernel")  # what the idle-gap term counts (ModelParams.gap_per)
AMAX_HISTORY_LEN = 1024


def _check_gap_per(per: str) -> str:
    if per not in GAP_PER:
        raise ValueError(f"gap_per must be one of {GAP_PER}, not {per!r}")
    return per


# ------------------------------------------------------------------------ step description


@dataclass(frozen=True)
class Gemm:
    """``count`` launches of ``C[m, n] = A[m, k] B[k, n]`` in ``fmt``.

    ``batch``: independent products in ONE launch (attention heads x sequences), so the rate
    is looked up at the launch's total flops. ``work``: fraction of the tiles computed (causal
    attention skips half). ``role``: what it is (``fwd``, ``dgrad``, ``wgrad``, ``attn``...).
    ``hbm_bytes``: device-memory bytes of one product where they are not its operands and
    output (fused flash attention keeps the [s, s] scores on chip); None: operands + output.
    """

    m: int
    k: int
    n: int
    count: int = 1
    fmt: str = "bf16"
    role: str = ""
    batch: int = 1
    work: float = 1.0
    out_bytes: float = 2.0
    hbm_bytes: float | None = None

    def __post_init__(self):
        if self.fmt not in FORMATS:
            raise ValueError(f"Gemm: unknown format {self.fmt!r}; formats: {', '.join(FORMATS)}")
        if min(self.m, self.k, self.n) <= 0 or self.count < 0 or self.batch < 1:
            raise ValueError(f"Gemm: bad sizes {self}")

    @property
    def launch_flops(self) -> float:
        """Flops of one launch."""
        return 2.0 * self.m * self.k * self.n * self.batch * self.work

    @property
    def flops(self) -> float:
        """Flops of all ``count`` launches."""
        return self.launch_flops * self.count

    @property
    def launch_bytes(self) -> float:
        """Operand reads and output write of one launch (each operand read once), or
        ``batch * hbm_bytes`` where that is given."""
        if self.hbm_bytes is not None:
            return self.batch * self.hbm_bytes
        b = ELEMENT_BYTES[self.fmt]
        return self.batch * ((self.m * self.k + self.k * self.n) * b
                             + self.m * self.n * self.work * self.out_bytes)


@dataclass(frozen=True)
class Traffic:
    """``bytes`` of memory traffic (reads + writes) in ``passes`` kernel launches."""

    bytes: float
    kind: str
    passes: int = 1


@dataclass
class Step:
    """One training step: GEMMs plus elementwise / quantization traffic."""

    gemms: list[Gemm] = field(default_factory=list)
    traffic: list[Traffic] = field(default_factory=list)
    name: str = ""

    @property
    def flops(self) -> float:
        return sum(g.flops for g in self.gemms)

    def flops_by_format(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for g in self.gemms:
            out[g.fmt] = out.get(g.fmt, 0.0) + g.flops
        return out

    def traffic_bytes(self, kinds: Iterable[str] | None = None) -> float:
        kinds = None if kinds is None else set(kinds)
        return sum(t.bytes for t in self.traffic if kinds is None or t.kind in kinds)

    @property
    def gemm_launches(self) -> int:
        return sum(g.count for g in self.gemms)

    @property
    def kernels(self) -> int:
        return self.gemm_launches + sum(t.passes for t in self.traffic)

    def launches(self, per: str) -> int:
        """The launches an idle gap is charged to: GEMMs (``per="gemm"``) or every kernel
        (``per="kernel"``)."""
        return self.gemm_launches if _check_gap_per(per) == "gemm" else self.kernels


def _linear(step: Step, m: int, k: int, n: int, fmt: str, count: int = 1, *, dgrad=True,
            prefix: str = "", wgrad_out_bytes: float = 2.0):
    """Forward, data-gradient and weight-gradient GEMMs of ``y[m,n] = x[m,k] w[k,n]``."""
    step.gemms.append(Gemm(m, k, n, count, fmt, prefix + "fwd"))
    if dgrad:
        step.gemms.append(Gemm(m, n, k, count, fmt, prefix + "dgrad"))
    step.gemms.append(Gemm(k, m, n, count, fmt, prefix + "wgrad", out_bytes=wgrad_out_bytes))


def _quant_traffic(step: Step, scaling: str, x_elems: float, w_elems: float, g_elems: float,
                   count: int = 1, act_bytes: float = 2.0, master_bytes: float = 4.0,
                   x_fused: bool = True):
    """The quantization cost of ``count`` quantized linear layers, as the CHANGE against the
    same layers in BF16 (whose elementwise passes, counted by the builders, write the input
    ``x`` and the output gradient ``g`` in BF16, and whose FP32 master weight is cast once).

    ``x`` and ``g`` are produced by an elementwise pass (bias/ReLU, norm, SwiGLU, ReLU
    backward...): XLA fuses the quantization into that pass (Transformer Engine's fused
    kernels do the same), and it writes the two layouts the two GEMMs need (row-wise and
    column-wise: FP8 tensor cores take K-major operands) in place of the BF16 copy. Per
    element of ``x`` and ``g``:

    - FP8 current scaling: one extra read (the amax must be complete before the quantizing
      pass starts) in an amax kernel, plus a scalar kernel for the scale; 2 x 1 byte written
      instead of 2 bytes.
    - FP8 delayed scaling: the amax for the history is fused into the quantizing pass (no
      extra bytes); two tiny kernels per operand roll the history and recompute the scale.
    - FP8 without scaling: a cast, nothing extra.
    - MXFP8: 2 x (1 + 1/32) bytes written (E8M0 scale per 32), no amax pass.
    - NVFP4: a global-amax pass (one extra read), 2 x 0.5625 bytes written; ``x`` and ``g``
      (the weight-gradient inputs) also get the random Hadamard transform on their column
      copy, whose amax needs another read.

    The weight (FP32 master, ``w_elems``) replaces the BF16 cast by a quantizing pass: read 4
    bytes, write both layouts (plus an amax read for current scaling and NVFP4).
    ``x_fused=False``: the input has no producing pass (the network input): quantizing it is
    a pass of its own (read + write).
    """
    c, b = count, act_bytes
    q = {"current": 1.0, "delayed": 1.0, "none": 1.0, "mxfp8": 1.0 + 1.0 / 32,
         "nvfp4": ELEMENT_BYTES["fp4"]}.get(scaling)
    if q is None:
        raise ValueError(f"unknown scaling {scaling!r}")
    amax = scaling in ("current", "nvfp4")
    scale_kernels = {"current": 1, "delayed": 2, "none": 0, "mxfp8": 0, "nvfp4": 1}[scaling]
    for name, n in (("x", x_elems), ("g", g_elems)):
        if amax:
            step.traffic.append(Traffic(c * n * b, "amax", c))
        if name == "x" and not x_fused:
            step.traffic.append(Traffic(c * n * (b + 2 * q), "quantize", c))
        elif 2 * q > b:
            step.traffic.append(Traffic(c * n * (2 * q - b), "quantize", 0))
        if scaling == "nvfp4":
            step.traffic.append(Traffic(c * n * b, "rht_amax", c))
    step.traffic.append(Traffic(c * w_elems * (master_bytes * (1 + amax) + 2 * q),
                                "weight_quantize", c * (1 + amax)))
    if scale_kernels:
        hist = AMAX_HISTORY_LEN * 4 * 3 if scaling == "delayed" else 0
        step.traffic.append(Traffic(c * hist, "scale_update", 3 * c * scale_kernels))


def _recipe_format(recipe: str) -> str:
    """The GEMM format of a registry recipe (``Recipe.number_format``)."""
    return resolve(recipe).number_format


def _quantizer(recipe: str) -> str | None:
    """What quantizes the GEMM operands of a recipe (``Recipe.quantizer``): None for dense."""
    return resolve(recipe).quantizer


def mlp_step_gemms(batch: int, width: int, depth: int, recipe: str = "bf16", *,
                   input_grad: bool = True, bias: bool = True) -> Step:
    """The training step of ``repro.studies.mlp_step.MLP`` (ReLU, biases, MSE loss, Adam on FP32
    master weights).

    Per layer: forward ``(B, W, W)``, data-gradient ``(B, W, W)`` and weight-gradient
    ``(W, B, W)`` GEMMs, all three in FP8 for FP8 recipes, plus the quantization cost of
    :func:`_quant_traffic`. ``input_grad=False`` drops the first layer's data gradient: XLA
    removes it, since nothing asks for the gradient of the input (FLOP counts keep the
    customary ``6 B W^2 D`` of ``mlpbench.step_flops``).

    Elementwise traffic per layer: bias (+ ReLU) after the forward GEMM (read, write), ReLU
    backward (read gradient and activation, write), bias gradient (read), the FP32 ->
    compute-dtype weight cast (unquantized recipes), Adam (read p, m, v, g; write p, m, v:
    28 bytes per FP32 parameter); and the loss once.
    """
    fmt = _recipe_format(recipe)
    act = ELEMENT_BYTES["fp32" if fmt in ("fp32", "tf32") else "bf16"]
    scaling = _quantizer(recipe)
    e, p = float(batch) * width, float(width) * width
    step = Step(name=f"mlp b{batch} w{width} d{depth} {recipe}")
    for i in range(depth):
        _linear(step, batch, width, width, fmt, dgrad=input_grad or i > 0, prefix=f"l{i}.",
                wgrad_out_bytes=4.0 if scaling else act)
        if scaling:
            _quant_traffic(step, scaling, e, p, e, act_bytes=act, x_fused=i > 0)
        else:
            step.traffic.append(Traffic(p * (4 + act), "cast"))
        step.traffic.append(Traffic(e * 2 * act, "activation"))          # bias (+ ReLU)
        if i < depth - 1:
            step.traffic.append(Traffic(e * 3 * act, "activation"))      # ReLU backward
        if bias:
            step.traffic.append(Traffic(e * act, "bias_grad"))
        n_params = p + (width if bias else 0)
        step.traffic.append(Traffic(n_params * 28, "optimizer", 2 if bias else 1))
    step.traffic.append(Traffic(e * (2 * act + 4), "loss"))
    return step


# --------------------------------------------------------------------------- decoder shapes


@dataclass(frozen=True)
class DecoderShape:
    """The sizes of a Llama-style decoder that the step model needs."""

    name: str
    hidden: int
    n_layers: int
    ffn: int
    n_heads: int
    n_kv_heads: int
    vocab: int
    seq_len: int
    n_bf16_last_blocks: int = 0

    @property
    def head_dim(self) -> int:
        return self.hidden // self.n_heads

    @property
    def params(self) -> int:
        d, f, hd = self.hidden, self.ffn, self.head_dim
        block = d * (self.n_heads + 2 * self.n_kv_heads) * hd + self.n_heads * hd * d + 3 * d * f
        return self.n_layers * (block + 2 * d) + 2 * self.vocab * d + d


def llama3_8b_config(seq_len: int = 8192, n_bf16_last_blocks: int = 4) -> DecoderShape:
    """Llama 3 8B. NVIDIA's NeMo NVFP4 run kept the last 4 of 32 blocks in BF16."""
    return DecoderShape("llama3-8b", 4096, 32, 14336, 32, 8, 128256, seq_len, n_bf16_last_blocks)


def llama3_405b_config(seq_len: int = 8192, n_bf16_last_blocks: int = 0) -> DecoderShape:
    """Llama 3.1 405B (MaxText's NVFP4 post: NVFP4 on the MLP GEMMs of every block)."""
    return DecoderShape("llama3-405b", 16384, 126, 53248, 128, 8, 128256, seq_len,
                        n_bf16_last_blocks)


_LM_FALLBACK = {
    "20m": DecoderShape("lm-20m", 512, 6, 1408, 8, 8, 256, 512, 1),
    "120m": DecoderShape("lm-120m", 768, 17, 2048, 12, 12, 256, 1024, 1),
}


def lm_shape(size: str, seq_len: int | None = None) -> DecoderShape | None:
    """The decoder shape of one LM preset of ``repro.models.lm.PRESETS`` (``tiny``, ``20m``,
    ``120m``), named ``lm-<size>``, optionally at another ``seq_len``; None for an unknown
    size. Without ``repro.models.lm``, the 20m and 120m sizes written out here."""
    try:
        from repro.models.lm import PRESETS
    except ImportError:
        shape = _LM_FALLBACK.get(size)
    else:
        c = PRESETS.get(size)
        shape = None if c is None else DecoderShape(
            f"lm-{size}", c.d_model, c.n_layers, c.d_ff, c.n_heads,
            getattr(c, "n_kv_heads", c.n_heads), c.vocab_size, c.seq_len,
            getattr(c, "n_bf16_last_blocks", 0))
    if shape is not None and seq_len:
        shape = dataclasses.replace(shape, seq_len=int(seq_len))
    return shape


def lm_shapes() -> dict[str, DecoderShape]:
    """This repository's LM presets (``repro.models.lm.PRESETS``: 20m, 120m) as decoder shapes;
    the same sizes are written out here for a checkout without ``repro.models.lm``."""
    out = {}
    for key in ("20m", "120m"):
        shape = lm_shape(key)
        if shape is not None:
            out[shape.name] = shape
    return out


def lm_step_gemms(cfg: DecoderShape, batch_tokens: int, recipe: str = "bf16",
                  policy: str = "paper", *, other_recipe: str | None = None,
                  fsdp: int = 1) -> Step:
    """One training step of a Llama-style decoder on ``batch_tokens`` tokens (per GPU).

    Per block: QKV ``(T, d, (h + 2 kv) hd)``, attention output ``(T, h hd, d)``, SwiGLU gate+up
    as one ``(T, d, 2 f)`` GEMM and down ``(T, f, d)``, each with its data- and weight-
    gradient GEMMs; attention itself (QK^T and PV, causal, flash-attention style: backward
    recomputes QK^T, so 2 forward + 5 backward batched products at half work) in BF16; the
    output head ``(T, d, V)`` in BF16. Embedding lookup, norms, RoPE, residuals, SwiGLU, the
    cross-entropy and Adam (28 bytes per FP32 parameter, sharded over ``fsdp`` GPUs) are
    memory traffic. Communication is not modelled.

    ``policy`` for a block-scaled recipe (nvfp4, mxfp8), as ``repro.models.lm.NVFP4_SCOPES``:
    ``paper`` (NVIDIA's recipe: every block linear layer, the last ``cfg.n_bf16_last_blocks``
    blocks excepted), ``mlp`` (MaxText's NVFP4 post: MLP GEMMs only) or ``all`` (every block).
    Block linear layers outside the policy run ``other_recipe``: BF16 by default; MaxText's
    NVFP4 runs keep them in FP8 (``other_recipe="fp8-current"``). FP8 recipes quantize every
    block linear layer. Embeddings and the head stay BF16 in every recipe.
    """
    if policy not in NVFP4_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(NVFP4_POLICIES)}")
    fmt = _recipe_format(recipe)
    other = other_recipe or ("bf16" if fmt == "fp4" or recipe == "mxfp8" else recipe)
    _recipe_format(other)
    T, d, f, L = batch_tokens, cfg.hidden, cfg.ffn, cfg.n_layers
    h, kv, hd, s = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, min(cfg.seq_len, batch_tokens)
    block_scaled = resolve(recipe).scaling == "block"
    n_plain = cfg.n_bf16_last_blocks if (block_scaled and policy == "paper") else 0
    step = Step(name=f"{cfg.name} T{T} {recipe}/{policy}")

    def linear(k, n, rec, count, name):
        if count == 0:
            return
        fm = _recipe_format(rec)
        sc = _quantizer(rec)
        _linear(step, T, k, n, fm, count, prefix=name + ".", wgrad_out_bytes=4.0 if sc else 2.0)
        if sc:
            _quant_traffic(step, sc, T * k, k * n, T * n, count)
        else:
            step.traffic.append(Traffic(count * k * n * 6.0, "cast", count))

    qkv_n = (h + 2 * kv) * hd
    mats = {"attn_qkv": (d, qkv_n), "attn_out": (h * hd, d), "mlp_in": (d, 2 * f),
            "mlp_out": (f, d)}
    for name, (k, n) in mats.items():
        if block_scaled:
            in_policy = policy != "mlp" or name.startswith("mlp")
            main = recipe if in_policy else other
            linear(k, n, main, L - n_plain, name)
            linear(k, n, "bf16", n_plain, name)
        else:
            linear(k, n, recipe, L, name)

    # Attention core, BF16, flash-attention style: per launch all heads of all sequences. The
    # scores and probabilities stay on chip (cuDNN's fused attention, repro.models.lm): each
    # product moves about two [s, hd] BF16 tiles per (sequence, head) through device memory
    # (forward: Q, K, V in, O out; backward: Q, K, V, O, dO in, dQ, dK, dV out). Counting the
    # [s, s] scores instead made the GEMMs' bytes exceed the whole compiled program's, which
    # left no room for the FP8 quantization traffic in program_step.
    n_seq = max(T // s, 1)
    score = dict(batch=n_seq * h, work=0.5, fmt="bf16", hbm_bytes=2 * s * hd * 2.0)
    step.gemms += [Gemm(s, hd, s, L, role="attn.qk", **score),
                   Gemm(s, s, hd, L, role="attn.pv", **score),
                   Gemm(s, hd, s, L, role="attn.qk_recompute", **score),
                   Gemm(s, s, hd, L, role="attn.dv", **score),
                   Gemm(s, hd, s, L, role="attn.dp", **score),
                   Gemm(s, s, hd, L, role="attn.dq", **score),
                   Gemm(s, s, hd, L, role="attn.dk", **score)]
    # Output head (BF16), its gradients, and the cross-entropy over FP32 logits.
    _linear(step, T, d, cfg.vocab, "bf16", prefix="head.")
    step.traffic.append(Traffic(T * cfg.vocab * 4.0 * 3, "loss", 2))
    step.traffic.append(Traffic(T * d * 2.0 * 3, "embedding", 2))
    # Elementwise per block, forward (backward ~2x): 2 RMSNorms (r+w), 2 residual adds (2r+w),
    # RoPE on q and k (r+w), SwiGLU (2r+w of the f-wide activations).
    fwd = 2 * (2 * T * d) + 2 * (3 * T * d) + 2 * (T * (h + kv) * hd) + 3 * T * f
    step.traffic.append(Traffic(L * fwd * 2.0 * 3, "activation", L * 18))
    step.traffic.append(Traffic(cfg.params * 28.0 / fsdp, "optimizer", L * 9 + 4))
    return step


# ---------------------------------------------------------------------- measured GEMM rates


def _norm_sizes(sizes: dict) -> tuple[int, int, int] | None:
    low = {str(k).lower(): v for k, v in (sizes or {}).items()}
    try:
        return int(low["m"]), int(low["k"]), int(low["n"])
    except (KeyError, TypeError, ValueError):
        return None


def _pool_16bit(points: dict[str, np.ndarray]) -> None:
    """BF16 and FP16 run the same tensor-core instructions at the same datasheet peak, so a
    shape measured in both gets the faster of the two times in both tables (in place). On the
    H200 the sweep's BF16 sample at 65536x2048x2048 ran well below both its FP16 sample and the
    BF16 train step at that width (the gemm and mlp_step records): the slower sample is the
    outlier."""
    a, b = points.get("bf16"), points.get("fp16")
    if a is None or b is None:
        return
    for row in a:
        hit = (b[:, :3] == row[:3]).all(1)
        if hit.any():
            row[3] = b[hit, 3] = min(row[3], float(b[hit][0, 3]))


def _roofline_s(g: Gemm, info: hw.HardwareInfo, fmt: str | None = None) -> float:
    """One launch at the datasheet peak, or its bytes at the datasheet bandwidth."""
    peak = (info.peak_tflops or {}).get(fmt or g.fmt)
    t = g.launch_flops / (peak * 1e12) if peak else 0.0
    if info.memory_bandwidth_tbs:
        t = max(t, g.launch_bytes / (info.memory_bandwidth_tbs * 1e12))
    return t


KERNEL_TIMES = "kernel_times"  # repro.studies.kernel_times's experiment


def _traced_gemms(records: pd.DataFrame | None, slug: str
                  ) -> dict[str, dict[tuple[int, int, int], float]]:
    """Median traced GEMM-kernel seconds per call, by format and (m, k, n): ``kernel_times``
    records of the ``gemm`` workload (``repro.studies.kernel_times gemm``), never emulated."""
    out: dict[str, dict[tuple[int, int, int], list]] = {}
    if records is None or not len(records) or "experiment" not in records:
        return {}
    df = records[(records["experiment"] == KERNEL_TIMES)
                 & (records["metric"] == "gemm_ms_per_step") & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    for rec in df.to_dict("records"):
        sizes = rec["sizes"] or {}
        mkn = _norm_sizes(sizes)
        if sizes.get("workload") != "gemm" or mkn is None or rec["recipe"] not in FORMATS:
            continue
        if rec["value"] > 0:
            out.setdefault(rec["recipe"], {}).setdefault(mkn, []).append(rec["value"] * 1e-3)
    return {f: {k: float(np.median(v)) for k, v in d.items()} for f, d in out.items()}


@dataclass
class RateTable:
    """Measured GEMM times of one chip, by format: rows (m, k, n, seconds per call).

    ``overhead_s``: the sweep's per-call overhead per format (host dispatch and
    synchronisation that a GEMM inside a jitted step does not pay), estimated as the smallest
    excess of a measured time over the datasheet roofline of its shape. ``traced``: device
    times of sweep shapes from ``repro.studies.kernel_times gemm`` (``kernel_times`` records, GEMM
    kernels only), by format and shape; where one exists it replaces the sweep's time less
    the overhead (an estimate that a small GEMM's ~60 us call overhead on the H200 swamps).
    """

    hardware: str
    points: dict[str, np.ndarray]
    overhead_s: dict[str, float]
    traced: dict[str, dict[tuple[int, int, int], float]] = field(default_factory=dict)
    _cache: dict = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def from_records(cls, records: pd.DataFrame, info: hw.HardwareInfo) -> "RateTable":
        pts: dict[str, list] = {}
        if records is not None and len(records):
            df = records[(records["experiment"] == "gemm") & (records["metric"] == "tflops")
                         & (records["hardware"] == info.slug) & (~records["emulated"].astype(bool))]
            for rec in df.to_dict("records"):
                mkn = _norm_sizes(rec["sizes"])
                if mkn is None or rec["recipe"] not in FORMATS or not rec["value"] > 0:
                    continue
                t = 2.0 * math.prod(mkn) / (rec["value"] * 1e12)
                pts.setdefault(rec["recipe"], []).append((*mkn, t))
        points, overhead = {}, {}
        for fmt, rows in pts.items():
            a = np.asarray(rows, float)
            # The same shape measured several times: the median time.
            keys = {tuple(r[:3]) for r in a}
            points[fmt] = np.asarray([(*key, np.median(a[(a[:, :3] == key).all(1), 3]))
                                      for key in sorted(keys)])
        _pool_16bit(points)
        for fmt, a in points.items():
            excess = [t - _roofline_s(Gemm(int(m), int(k), int(n), fmt=fmt), info)
                      for m, k, n, t in a]
            overhead[fmt] = max(0.0, float(min(excess)))
        return cls(info.slug, points, overhead, _traced_gemms(records, info.slug))

    def formats(self) -> list[str]:
        return sorted(self.points)

    def adjusted(self, fmt: str, info: hw.HardwareInfo) -> tuple[np.ndarray, np.ndarray]:
        """(flops, seconds) of each measured shape, overhead removed, never below roofline."""
        key = ("adjusted", fmt, info.slug)
        if key not in self._cache:
            a = self.points[fmt]
            flops = 2.0 * a[:, 0] * a[:, 1] * a[:, 2]
            roof = np.array([_roofline_s(Gemm(int(m), int(k), int(n), fmt=fmt), info)
                             for m, k, n in a[:, :3]])
            t = a[:, 3] - self.overhead_s[fmt]
            traced = self.traced.get(fmt, {})
            t = np.array([traced.get((int(m), int(k), int(n)), ti)
                          for (m, k, n), ti in zip(a[:, :3], t)])
            t = np.maximum(t, roof)
            # log-rate against log-flops, shapes of equal flops averaged (for interpolation)
            lf, lr = np.log(flops), np.log(flops / t)
            ulf = np.unique(lf)
            ulr = np.array([lr[lf == x].mean() for x in ulf])
            self._cache[key] = (flops, t, ulf, ulr)
        return self._cache[key][:2]

    def measured_time(self, g: Gemm, info: hw.HardwareInfo, fmt: str | None = None,
                      offsweep_eff: float = 1.0) -> tuple[float, bool]:
        """Seconds of one launch of ``g`` (in ``fmt``, default ``g.fmt``) and whether the shape
        was measured exactly. Off-sweep shapes: rate interpolated in log(flops) (clamped at
        the ends) times ``offsweep_eff``; never below the roofline."""
        fmt = fmt or g.fmt
        a = self.points[fmt]
        flops, t_adj = self.adjusted(fmt, info)
        if g.batch == 1 and g.work == 1.0:
            hit = (a[:, 0] == g.m) & (a[:, 1] == g.k) & (a[:, 2] == g.n)
            if hit.any():
                return float(t_adj[hit][0]), True
        ulf, ulr = self._cache[("adjusted", fmt, info.slug)][2:]
        rate = float(np.exp(np.interp(math.log(g.launch_flops), ulf, ulr)))
        t = g.launch_flops / (rate * offsweep_eff)
        return max(t, _roofline_s(g, info, fmt)), False

    def measured_rate(self, m: int, k: int, n: int, fmt: str, info: hw.HardwareInfo) -> float:
        """TFLOP/s of the sweep (overhead included) at a measured shape, else interpolated."""
        a = self.points[fmt]
        hit = (a[:, 0] == m) & (a[:, 1] == k) & (a[:, 2] == n)
        if hit.any():
            return 2.0 * m * k * n / a[hit][0, 3] / 1e12
        t, _ = self.measured_time(Gemm(m, k, n, fmt=fmt), info)
        return 2.0 * m * k * n / (t + self.overhead_s[fmt]) / 1e12


# ------------------------------------------------------------------------------ the model


@dataclass(frozen=True)
class ModelParams:
    """The free parameters. ``datasheet_gemm_eff`` is used only where no rate is measured
    (fixed, not fitted, unless there are no GEMM records at all). ``gap_us``: idle device
    time per launch of what ``gap_per`` names (:data:`GAP_PER`: a modelling choice, never
    fitted)."""

    offsweep_gemm_eff: float = 1.0
    bw_eff: float = 0.85
    gap_us: float = 10.0
    step_floor_us: float = 100.0
    datasheet_gemm_eff: float = 0.7
    gap_per: str = "gemm"

    FITTED = ("offsweep_gemm_eff", "bw_eff", "gap_us", "step_floor_us")
    BOUNDS = {"offsweep_gemm_eff": (0.5, 1.5), "bw_eff": (0.05, 1.0),
              "gap_us": (0.0, 200.0), "step_floor_us": (0.0, 5000.0),
              "datasheet_gemm_eff": (0.05, 1.0)}


@dataclass
class Calibration:
    """A model for one chip: its registry entry, fitted parameters and measured GEMM rates."""

    hardware: hw.HardwareInfo
    params: ModelParams
    rates: RateTable | None = None
    calibrated: bool = False
    fit: pd.DataFrame | None = None
    fitted: tuple[str, ...] = ()
    traced: pd.DataFrame | None = None  # traced_gaps rows behind gap_us

    def to_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware.slug, "calibrated": self.calibrated,
                "params": dataclasses.asdict(self.params), "fitted": list(self.fitted),
                "gemm_formats": self.rates.formats() if self.rates else [],
                "sweep_overhead_us": ({k: v * 1e6 for k, v in self.rates.overhead_s.items()}
                                      if self.rates else {}),
                "n_fit": 0 if self.fit is None else int(len(self.fit)),
                "gap_traced_shapes": 0 if self.traced is None else len(self.traced)}


def datasheet_calibration(info: hw.HardwareInfo | str,
                          params: ModelParams | None = None) -> Calibration:
    """No measurements: datasheet peaks times ``datasheet_gemm_eff``; ``calibrated=False``."""
    info = hw.lookup(info) if isinstance(info, str) else info
    return Calibration(info, params or ModelParams(), None, False)


def _efficiency(g: Gemm, cal: Calibration) -> float:
    """Fraction of ``cal``'s chip's datasheet peak that ``g`` reaches there (its proxy format
    where ``g.fmt`` is not measured)."""
    src, p, rates = cal.hardware, cal.params, cal.rates
    if rates is not None and rates.points:
        fmt = FORMAT_PROXY.get(g.fmt, g.fmt)
        if fmt not in rates.points:
            fmt = FALLBACK_PROXY.get(g.fmt, "bf16")
        peak = (src.peak_tflops or {}).get(fmt)
        if fmt in rates.points and peak:
            t, _ = rates.measured_time(g, src, fmt, p.offsweep_gemm_eff)
            return min(1.0, g.launch_flops / (t * peak * 1e12))
    return p.datasheet_gemm_eff


def gemm_time(g: Gemm, cal: Calibration, target: hw.HardwareInfo | None = None) -> float:
    """Seconds of all ``g.count`` launches of ``g`` (idle gaps not included).

    On the calibrating chip: the measured rate where there is one (see
    :meth:`RateTable.measured_time`). Elsewhere (another chip, or a format the chip was not
    measured in): the target's datasheet peak for ``g.fmt`` times the efficiency the
    calibrating chip reaches on the same shape; never below the target's roofline.
    """
    tgt = target or cal.hardware
    if g.count == 0:
        return 0.0
    rates = cal.rates
    if tgt.slug == cal.hardware.slug and rates is not None and g.fmt in rates.points:
        t, _ = rates.measured_time(g, tgt, g.fmt, cal.params.offsweep_gemm_eff)
        return t * g.count
    peak = (tgt.peak_tflops or {}).get(g.fmt)
    if not peak:
        raise ValueError(f"{tgt.slug} has no {g.fmt} tensor-core rate in the registry")
    t = g.launch_flops / (peak * 1e12 * _efficiency(g, cal))
    return max(t, _roofline_s(g, tgt)) * g.count


def predict(step: Step, cal: Calibration, target: hw.HardwareInfo | str | None = None
            ) -> dict[str, float]:
    """Predicted step time (seconds) on ``target`` (default: the calibrating chip), split
    into GEMM, memory-traffic and idle-gap parts (``gap_s``: ``gap_us`` per launch of what
    ``gap_per`` counts).

    ``total_s = max(device_s, step_floor)``: steps are dispatched asynchronously, so the
    host's per-step dispatch cost hides behind device work unless the device finishes first.
    """
    tgt = hw.lookup(target) if isinstance(target, str) else (target or cal.hardware)
    p = cal.params
    if not tgt.memory_bandwidth_tbs:
        raise ValueError(f"{tgt.slug} has no memory bandwidth in the registry")
    t_gemm = sum(gemm_time(g, cal, tgt) for g in step.gemms)
    t_mem = step.traffic_bytes() / (tgt.memory_bandwidth_tbs * 1e12 * p.bw_eff)
    t_gap = step.launches(p.gap_per) * p.gap_us * 1e-6
    device = t_gemm + t_mem + t_gap
    return {"total_s": max(device, p.step_floor_us * 1e-6), "device_s": device,
            "gemm_s": t_gemm, "traffic_s": t_mem, "gap_s": t_gap, "flops": step.flops}


# ----------------------------------------------------------------------------- calibration


def program_step(step: Step, hlo_bytes: float | None, hlo_kernels: float | None) -> Step:
    """``step`` with its assumed elementwise traffic replaced by what the compiled program says
    (``repro.studies.gemm.compiled_facts``): XLA's bytes accessed minus the GEMMs' own operand and
    output bytes, in the program's launching ops minus the GEMM launches. The GEMMs stay.
    Without both facts (records made before they were recorded), ``step`` unchanged."""
    if hlo_bytes is None or hlo_kernels is None or not (
            math.isfinite(hlo_bytes) and math.isfinite(hlo_kernels)):
        return step
    gemm_bytes = sum(g.launch_bytes * g.count for g in step.gemms)
    gemm_launches = sum(g.count for g in step.gemms)
    other = Traffic(max(0.0, hlo_bytes - gemm_bytes), "compiled_program",
                    max(0, int(hlo_kernels) - gemm_launches))
    return Step(list(step.gemms), [other], step.name + " (compiled traffic)")


def _fact(extra: Any, key: str) -> float:
    v = (extra or {}).get(key) if isinstance(extra, dict) else None
    return float(v) if v is not None else math.nan


WORKLOADS = {"mlp_step": "mlp", "lm_step": "lm"}  # experiment -> workload of a step record
STEP_KEY = ["workload", "model", "batch", "seq_len", "width", "depth"]


def _step_records(records: pd.DataFrame, slug: str, recipes: Sequence[str] | None = None
                  ) -> pd.DataFrame:
    """Median measured step time (ms) per (shape, recipe) of ``mlp_step`` and ``lm_step``, with
    the compiled program's ``hlo_bytes`` and ``hlo_kernels`` where the records carry them
    (NaN otherwise). Emulated records are left out.

    A shape is :data:`STEP_KEY`: ``workload`` ("mlp" or "lm"), ``model`` (the LM preset, ""
    for the MLP), ``batch`` (rows of the MLP, sequences of the LM), ``seq_len`` (0 for the
    MLP), ``width`` and ``depth`` (the MLP's; the LM's d_model and layers, for reading only:
    the LM step is rebuilt from its preset, :func:`lm_shape`).
    """
    cols = [*STEP_KEY, "recipe", "measured_ms", "hlo_bytes", "hlo_kernels"]
    if records is None or not len(records):
        return pd.DataFrame(columns=cols)
    df = records[records["experiment"].isin(list(WORKLOADS))
                 & (records["metric"] == "step_time_ms") & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    if recipes is not None:
        df = df[df["recipe"].isin(list(recipes))]
    rows = []
    for rec in df.to_dict("records"):
        s = rec["sizes"] or {}
        facts = (_fact(rec.get("extra"), "hlo_bytes_accessed"),
                 _fact(rec.get("extra"), "hlo_kernels"))
        try:
            if rec["experiment"] == "lm_step":
                shape = lm_shape(str(s["model"]), int(s["seq_len"]))
                if shape is None:
                    continue  # a preset this checkout does not know
                key = ("lm", str(s["model"]), int(s["batch"]), shape.seq_len, shape.hidden,
                       shape.n_layers)
            else:
                key = ("mlp", "", int(s["batch"]), 0, int(s["width"]), int(s["depth"]))
            rows.append((*key, rec["recipe"], float(rec["value"]), *facts))
        except (KeyError, TypeError, ValueError):
            continue
    out = pd.DataFrame(rows, columns=cols)
    return out.groupby([*STEP_KEY, "recipe"], as_index=False).agg(
        measured_ms=("measured_ms", "median"), hlo_bytes=("hlo_bytes", "median"),
        hlo_kernels=("hlo_kernels", "median"))


def _mlp_step(batch, width, depth, recipe, hlo_bytes=None, hlo_kernels=None) -> Step:
    # The timed step: XLA drops the first layer's data gradient (nothing consumes it). With
    # the compiled program's facts, its traffic is the program's (``program_step``).
    step = mlp_step_gemms(batch, width, depth, recipe, input_grad=False)
    return program_step(step, hlo_bytes, hlo_kernels)


def _lm_step(model, batch, seq_len, recipe, hlo_bytes=None, hlo_kernels=None) -> Step:
    # ``repro.studies.lm_step``'s step of an LM preset (``batch`` sequences of ``seq_len`` tokens);
    # traffic from the compiled program where the record carries its facts, as the MLP's.
    shape = lm_shape(model, seq_len)
    if shape is None:
        raise ValueError(f"unknown LM preset {model!r}")
    step = lm_step_gemms(shape, int(batch) * int(seq_len), recipe)
    return program_step(step, hlo_bytes, hlo_kernels)


def measured_step(row, recipe: str | None = None, hlo_bytes=None, hlo_kernels=None) -> Step:
    """The model's step for one row of :func:`_step_records` (any object with the
    :data:`STEP_KEY` attributes), under ``recipe`` (default: the row's) and the given
    compiled-program facts."""
    recipe = recipe or row.recipe
    if row.workload == "lm":
        return _lm_step(row.model, row.batch, row.seq_len, recipe, hlo_bytes, hlo_kernels)
    return _mlp_step(row.batch, row.width, row.depth, recipe, hlo_bytes, hlo_kernels)


def shape_label(workload: str, model: str, batch: int, width: int, depth: int) -> str:
    """How a measured shape is named in tables: ``65536x4096x3`` (MLP batch x width x depth)
    or ``lm-120m b32`` (LM preset, sequences per step)."""
    if workload == "lm":
        return f"lm-{model} b{int(batch)}"
    return f"{int(batch)}x{int(width)}x{int(depth)}"


def fit_params(steps: Sequence[Step], measured_s: Sequence[float], cal: Calibration,
               names: Sequence[str] = ModelParams.FITTED, prior_weight: float = 0.02
               ) -> ModelParams:
    """Least squares in log(step time) over ``names`` (a weak pull towards the defaults keeps
    an under-determined fit finite)."""
    from scipy.optimize import least_squares

    names = list(names)
    base = cal.params
    default = ModelParams()
    lo = [ModelParams.BOUNDS[n][0] for n in names]
    hi = [ModelParams.BOUNDS[n][1] for n in names]
    scale = np.array([max(abs(getattr(default, n)), 1.0) for n in names])
    y = np.log(np.asarray(measured_s, float))

    def params_of(x):
        return dataclasses.replace(base, **dict(zip(names, map(float, x))))

    def resid(x):
        c = dataclasses.replace(cal, params=params_of(x))
        pred = np.array([predict(s, c)["total_s"] for s in steps])
        prior = prior_weight * (x - np.array([getattr(default, n) for n in names])) / scale
        return np.concatenate([np.log(pred) - y, prior])

    best = None
    for start in (np.array([getattr(base, n) for n in names]), np.array(lo) * 0.5 + np.array(hi) * 0.5):
        x0 = np.clip(start, lo, hi)
        sol = least_squares(resid, x0, bounds=(lo, hi), x_scale=scale, method="trf")
        if best is None or sol.cost < best.cost:
            best = sol
    return params_of(best.x)


def _traced_steps(records: pd.DataFrame | None, slug: str) -> dict[tuple, dict[str, dict]]:
    """``repro.studies.kernel_times`` traces of whole steps on ``slug`` (never emulated): {shape key:
    {recipe: {metric: value}}}, the key ``("lm", model, batch)`` or ``("mlp", batch, width,
    depth)``. Single-GEMM traces (``kernelprof gemm``) are :func:`_traced_gemms`'."""
    if records is None or not len(records) or "experiment" not in records:
        return {}
    kt = records[(records["experiment"] == KERNEL_TIMES) & (records["hardware"] == slug)
                 & (~records["emulated"].astype(bool))]
    by: dict[tuple, dict[str, dict]] = {}
    for rec in kt.to_dict("records"):
        s = rec["sizes"] or {}
        if s.get("workload") == "lm":
            key = ("lm", str(s.get("model")), int(s.get("batch", 0)))
        elif s.get("workload") == "mlp":
            key = ("mlp", int(s.get("batch", 0)), int(s.get("width", 0)), int(s.get("depth", 0)))
        else:
            continue
        by.setdefault(key, {}).setdefault(rec["recipe"], {})[rec["metric"]] = float(rec["value"])
    return by


def _trace_key(r) -> tuple:
    return (("lm", r.model, int(r.batch)) if r.workload == "lm"
            else ("mlp", int(r.batch), int(r.width), int(r.depth)))


def traced_gaps(records: pd.DataFrame | None, slug: str, per: str = "gemm") -> pd.DataFrame:
    """Idle device time per launch, measured on BF16 steps: (untraced step time - device busy
    time) / launches, per shape that has both a ``kernel_times`` record (``repro.studies.kernel_times``:
    busy time and kernels of the traced step) and an ``mlp_step`` / ``lm_step`` BF16 time.
    ``per="gemm"``: the launches are the step's GEMMs (as the model counts them, attention's
    products included); ``per="kernel"``: every traced kernel.

    The gaps between kernels that step times alone cannot separate from GEMM and memory time
    (the BF16-only fit put them at 0). BF16 only, never emulated: the FP8 steps are the
    validation data. Columns: the shape (:data:`STEP_KEY`), ``step_ms``, ``busy_ms``,
    ``kernels`` (traced), ``launches`` (what the gap is divided by), ``gap_us`` (gaps below 0,
    streams overlapping, count as 0).
    """
    _check_gap_per(per)
    cols = [*STEP_KEY, "step_ms", "busy_ms", "kernels", "launches", "gap_us"]
    by = _traced_steps(records, slug)
    rows = []
    for r in (_step_records(records, slug, ["bf16"]).itertuples() if by else []):
        m = by.get(_trace_key(r), {}).get("bf16", {})
        busy, n = m.get("kernel_ms_per_step"), m.get("kernels_per_step")
        if busy is None or not n:
            continue
        launches = n if per == "kernel" else measured_step(r, "bf16").gemm_launches
        gap = max(0.0, r.measured_ms - busy) / launches * 1e3
        rows.append((*(getattr(r, k) for k in STEP_KEY), r.measured_ms, busy, n, launches, gap))
    return pd.DataFrame(rows, columns=cols)


def component_table(records: pd.DataFrame | None, cal: Calibration,
                    recipes: Sequence[str] = ("bf16", *FP8_RECIPES)) -> pd.DataFrame:
    """Where a step's time goes, predicted (:func:`predict` under ``cal``) against traced
    (``repro.studies.kernel_times``), per measured shape and recipe that has both a step time and a trace
    on ``cal``'s chip. A diagnosis of the model, not an input to it: FP8 rows are shown too.

    Columns (ms per step): ``gemm`` (GEMM and attention kernels; the model counts attention's
    products as GEMMs), ``other`` (every other kernel: elementwise, reductions, copies;
    the model's traffic term) and ``gaps`` (device idle between kernels: the untraced step time
    minus the traced busy time; the model's ``gap_us`` x launches), each ``_pred`` and
    ``_traced``; ``kernels_pred`` (the program's launches the model counts) and
    ``kernels_traced``.
    """
    cols = ["workload", "shape", "recipe", "measured_ms", "busy_ms", "gemm_pred", "gemm_traced",
            "other_pred", "other_traced", "gaps_pred", "gaps_traced", "kernels_pred",
            "kernels_traced"]
    slug = cal.hardware.slug
    by = _traced_steps(records, slug)
    rows = []
    for r in (_step_records(records, slug, list(recipes)).itertuples() if by else []):
        m = by.get(_trace_key(r), {}).get(r.recipe)
        if not m or "kernel_ms_per_step" not in m:
            continue
        step = measured_step(r, r.recipe, r.hlo_bytes, r.hlo_kernels)
        p = predict(step, cal)
        busy = m["kernel_ms_per_step"]
        gemm = m.get("gemm_ms_per_step", 0.0) + m.get("attention_ms_per_step", 0.0)
        rows.append((r.workload, shape_label(r.workload, r.model, r.batch, r.width, r.depth),
                     r.recipe, r.measured_ms, busy, p["gemm_s"] * 1e3, gemm,
                     p["traffic_s"] * 1e3, busy - gemm, p["gap_s"] * 1e3,
                     r.measured_ms - busy, step.kernels, m.get("kernels_per_step", np.nan)))
    return pd.DataFrame(rows, columns=cols)


def measured_records() -> pd.DataFrame:
    """The records the model reads, from ``results/`` and ``build/results/``: ``gemm``, the
    step times (``mlp_step``, ``lm_step``) and the kernel traces (``kernel_times``)."""
    frames = [results.load_records(e) for e in ("gemm", *WORKLOADS, KERNEL_TIMES)]
    frames = [f for f in frames if len(f)]
    with warnings.catch_warnings():  # columns all-NA in one experiment (e.g. spread) stay
        warnings.simplefilter("ignore", FutureWarning)
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def calibrate(measured_records: pd.DataFrame | None, hardware: hw.HardwareInfo | str,
              gap_per: str = "gemm") -> Calibration:
    """Fit the model of ``hardware`` on its MEASURED BF16 step times (``mlp_step`` and, where
    recorded, ``lm_step``).

    ``measured_records``: records of the ``gemm``, ``mlp_step`` and ``lm_step`` experiments
    (other rows are ignored; only this chip's non-emulated rows are used). GEMM rates come from
    the ``gemm`` records; the fit sees only ``recipe == "bf16"`` step times, never an FP8 one.
    Without BF16 step times the defaults stay (``calibrated=False``). Where ``kernel_times``
    records exist (:func:`traced_gaps`), ``gap_us`` is their median and is not fitted.
    ``gap_per``: what the gap is charged to (:data:`GAP_PER`).
    """
    info = hw.lookup(hardware) if isinstance(hardware, str) else hardware
    df = measured_records if measured_records is not None else pd.DataFrame()
    rates = RateTable.from_records(df, info) if len(df) else None
    if rates is not None and not rates.points:
        rates = None
    cal = Calibration(info, ModelParams(gap_per=_check_gap_per(gap_per)), rates, False)
    bf16 = _step_records(df, info.slug, ["bf16"])
    if not len(bf16):
        return cal
    if rates is not None and "bf16" not in rates.points:
        rates = None
        cal.rates = None
    names = list(ModelParams.FITTED) if rates is not None else [
        "datasheet_gemm_eff", "bw_eff", "gap_us", "step_floor_us"]
    traced = traced_gaps(df, info.slug, gap_per)
    if len(traced):
        names.remove("gap_us")
        cal.params = dataclasses.replace(cal.params, gap_us=float(traced["gap_us"].median()))
    # With fewer points than parameters, fit the most important ones only.
    names = names[:max(1, min(len(names), len(bf16)))]
    steps = [measured_step(r, "bf16", r.hlo_bytes, r.hlo_kernels) for r in bf16.itertuples()]
    params = fit_params(steps, bf16["measured_ms"].to_numpy() * 1e-3, cal, names)
    cal = Calibration(info, params, rates, True, fitted=tuple(names),
                      traced=traced if len(traced) else None)
    bf16 = bf16.copy()
    bf16["predicted_ms"] = [predict(s, cal)["total_s"] * 1e3 for s in steps]
    cal.fit = bf16
    return cal


def validate(measured_records: pd.DataFrame, cal: Calibration,
             recipes: Sequence[str] = FP8_RECIPES) -> pd.DataFrame:
    """Predicted vs measured FP8/BF16 step-time speedup at every measured shape, MLP
    (``mlp_step``) and LM (``lm_step``) alike.

    One row per (shape, FP8 recipe) that has a BF16 step time of the same shape on the same
    chip (emulated records never count); ``workload`` says "mlp" or "lm", ``model`` the LM
    preset; ``error`` = predicted / measured speedup - 1; ``compiled_traffic``: both programs'
    traffic came from their compiled HLO (:func:`program_step`), not from the assumed passes.
    """
    df = _step_records(measured_records, cal.hardware.slug, ["bf16", *recipes])
    cols = [*STEP_KEY, "recipe", "measured_ms", "predicted_ms", "bf16_measured_ms",
            "bf16_predicted_ms", "measured_speedup", "predicted_speedup", "error",
            "compiled_traffic"]
    if not len(df):
        return pd.DataFrame(columns=cols)
    b16 = df[df["recipe"] == "bf16"].set_index(STEP_KEY)
    rows = []
    for r in df[df["recipe"] != "bf16"].itertuples():
        key = tuple(getattr(r, k) for k in STEP_KEY)
        if key not in b16.index:
            continue
        b = b16.loc[key]
        pb = predict(measured_step(r, "bf16", b.hlo_bytes, b.hlo_kernels), cal)["total_s"] * 1e3
        pq = predict(measured_step(r, r.recipe, r.hlo_bytes, r.hlo_kernels),
                     cal)["total_s"] * 1e3
        ms, ps = b.measured_ms / r.measured_ms, pb / pq
        rows.append((*key, r.recipe, r.measured_ms, pq, b.measured_ms, pb, ms, ps, ps / ms - 1,
                     bool(math.isfinite(r.hlo_bytes) and math.isfinite(b.hlo_bytes))))
    return pd.DataFrame(rows, columns=cols)


def sizes_label(sizes: dict) -> str:
    """:func:`shape_label` of a fit or validation record's ``sizes`` (records written before
    ``lm_step`` existed have no ``workload``: they are MLP shapes)."""
    s = sizes or {}
    return s.get("shape") or shape_label(s.get("workload", "mlp"), s.get("model", ""),
                                         s.get("batch", 0), s.get("width", 0), s.get("depth", 0))


def validation_table(perf: pd.DataFrame) -> pd.DataFrame:
    """The validation rows of perfmodel records (``predicted_speedup`` / ``measured_speedup``),
    one row per (chip, workload, shape, FP8 recipe): predicted and measured speedup, error,
    and what FP8 adds to the BF16 step in ms, measured and predicted. Records written before
    ``lm_step`` existed are MLP rows."""
    cols = ["hardware", "workload", "shape", "recipe", "predicted", "measured", "error",
            "fp8_minus_bf16_measured_ms", "fp8_minus_bf16_predicted_ms", "traffic_from"]
    if perf is None or not len(perf):
        return pd.DataFrame(columns=cols)
    rows = {}
    for rec in perf[perf["metric"].isin(["predicted_speedup", "measured_speedup"])
                    ].to_dict("records"):
        s, e = rec["sizes"] or {}, rec["extra"] or {}
        key = (rec["hardware"], s.get("workload", "mlp"), sizes_label(s), rec["recipe"])
        row = rows.setdefault(key, {
            "fp8_minus_bf16_measured_ms": e.get("measured_ms", np.nan)
            - e.get("bf16_measured_ms", np.nan),
            "fp8_minus_bf16_predicted_ms": e.get("predicted_ms", np.nan)
            - e.get("bf16_predicted_ms", np.nan),
            "traffic_from": "compiled" if e.get("compiled_traffic") else "assumed"})
        row["predicted" if rec["metric"] == "predicted_speedup" else "measured"] = rec["value"]
    out = pd.DataFrame([{**dict(zip(cols[:4], k)), **v} for k, v in rows.items()])
    out = out.reindex(columns=cols)
    out["error"] = out["predicted"] / out["measured"] - 1
    return out.sort_values(["hardware", "workload", "recipe", "shape"]).reset_index(drop=True)


# ------------------------------------------------------------------------------ projection

# Published NVFP4 speedups (claims to compare with, not measurements).
PUBLISHED = [
    {"model": "llama3-8b", "baseline": "bf16", "policy": "paper", "targets": ["b200", "gb200"],
     "speedup": 1.59, "label": "NeMo 1.59x vs BF16",
     "source": "NVIDIA blog, Feb 2026 (NeMo Megatron Bridge; 1,850 vs 1,165 TFLOP/s per GPU; "
               "last 4 blocks BF16; micro-batch 2 -> 4). Secondary reports disagree on the "
               "chip (B200 or GB200 NVL72)."},
    {"model": "llama3-8b", "baseline": "fp8", "policy": "mlp", "targets": ["gb200"],
     "speedup": 1.35, "label": "MaxText 1.35x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-405b", "baseline": "fp8", "policy": "mlp", "targets": ["gb200"],
     "speedup": 1.44, "label": "MaxText 1.44x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-8b", "baseline": "fp8", "policy": "mlp", "targets": ["gb300"],
     "speedup": 1.31, "label": "MaxText 1.31x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
    {"model": "llama3-405b", "baseline": "fp8", "policy": "mlp", "targets": ["gb300"],
     "speedup": 1.73, "label": "MaxText 1.73x vs FP8",
     "source": "NVIDIA blog, June 2026 (JAX/MaxText, NVFP4 on MLP GEMMs, FP8 baseline)"},
]

# (name, subject recipe, subject policy, other recipe, baseline recipe, baseline label)
COMPARISONS = [
    ("nvfp4_vs_bf16", "nvfp4", "paper", "bf16", "bf16", "bf16"),
    ("nvfp4_mlp_vs_fp8", "nvfp4", "mlp", "fp8-current", "fp8-current", "fp8"),
    ("fp8_vs_bf16", "fp8-current", "paper", None, "bf16", "bf16"),
]

ASSUMPTIONS = [
    "target chip = its datasheet dense peaks and bandwidth (repro/data/hardware.yaml) times the "
    "efficiency the calibrating chip reaches on the same GEMM shape",
    "FP4 GEMMs reach the efficiency measured for FP8 GEMMs of the same shape",
    "bandwidth efficiency and idle gap per GEMM launch as calibrated on the measuring chip",
    "one GPU's share of the step; communication (FSDP/TP collectives) not modelled",
    "flash attention and the output head stay BF16 in every recipe",
]


def default_projection_setup() -> dict[str, dict[str, Any]]:
    """Models and per-GPU tokens projected (params.yaml ``perfmodel`` may override)."""
    out = {"llama3-8b": {"shape": llama3_8b_config(), "batch_tokens": 16384, "fsdp": 8},
           "llama3-405b": {"shape": llama3_405b_config(), "batch_tokens": 8192, "fsdp": 64}}
    for name, shape in lm_shapes().items():
        # params.yaml's lm full profile trains with 64 sequences a step
        out[name] = {"shape": shape, "batch_tokens": 64 * shape.seq_len, "fsdp": 1}
    return out


def project(cal: Calibration, targets: Sequence[str] = TARGETS,
            setup: dict[str, dict[str, Any]] | None = None,
            comparisons=COMPARISONS, include_self: bool = True) -> pd.DataFrame:
    """Projected speedups on ``targets`` (and on the calibrating chip itself, for the formats
    it has, when ``include_self``)."""
    setup = setup or default_projection_setup()
    rows = []
    chips = list(dict.fromkeys([cal.hardware.slug] * include_self + list(targets)))
    for slug in chips:
        tgt = cal.hardware if slug == cal.hardware.slug else hw.lookup(slug)
        if not tgt.memory_bandwidth_tbs:
            continue
        for model, s in setup.items():
            shape, T, fsdp = s["shape"], int(s["batch_tokens"]), int(s.get("fsdp", 1))
            for name, rec, pol, other, base, base_label in comparisons:
                fmts = {_recipe_format(rec), _recipe_format(base)}
                if any(not (tgt.peak_tflops or {}).get(f) for f in fmts):
                    continue  # e.g. NVFP4 on Hopper: nothing to project
                subj = lm_step_gemms(shape, T, rec, pol, other_recipe=other, fsdp=fsdp)
                ref = lm_step_gemms(shape, T, base, "paper", fsdp=fsdp)
                ps, pr = predict(subj, cal, tgt), predict(ref, cal, tgt)
                rows.append({"target": slug, "model": model, "comparison": name,
                             "recipe": rec, "policy": pol, "other_recipe": other,
                             "baseline": base_label, "baseline_recipe": base,
                             "batch_tokens": T, "fsdp": fsdp,
                             "speedup": pr["total_s"] / ps["total_s"],
                             "step_ms": ps["total_s"] * 1e3, "baseline_step_ms": pr["total_s"] * 1e3,
                             "tflops": ref.flops / ps["total_s"] / 1e12,
                             "baseline_tflops": ref.flops / pr["total_s"] / 1e12,
                             "breakdown_ms": {k: v * 1e3 for k, v in ps.items() if k != "flops"},
                             "baseline_breakdown_ms": {k: v * 1e3 for k, v in pr.items()
                                                       if k != "flops"}})
    return pd.DataFrame(rows)


def published_for(model: str, target: str, baseline: str, policy: str) -> dict | None:
    for p in PUBLISHED:
        if (p["model"] == model and target in p["targets"] and p["baseline"] == baseline
                and p["policy"] == policy):
            return p
    return None


# --------------------------------------------------------------------------------- records


def _shape_sizes(r) -> dict[str, Any]:
    """``sizes`` of a fit or validation record for one measured shape (a row of
    :func:`_step_records`): the MLP's batch, width, depth, or the LM's preset, sequences and
    sequence length; with ``workload`` and the table label ``shape``."""
    label = shape_label(r.workload, r.model, r.batch, r.width, r.depth)
    if r.workload == "lm":
        return {"workload": "lm", "model": r.model, "batch": int(r.batch),
                "seq_len": int(r.seq_len), "batch_tokens": int(r.batch) * int(r.seq_len),
                "shape": label}
    return {"workload": "mlp", "batch": int(r.batch), "width": int(r.width),
            "depth": int(r.depth), "shape": label}


def _records_for(cal: Calibration, val: pd.DataFrame, proj: pd.DataFrame, profile: str,
                 digest: str, info: hw.HardwareInfo | None = None) -> list[dict[str, Any]]:
    """Records of one cell, written under ``info`` (default: the calibrating chip)."""
    info, calib = info or cal.hardware, cal.to_dict()
    common = dict(claims=CLAIMS, profile=profile, hardware=info, emulated=False)
    recs = []
    for name, value in dataclasses.asdict(cal.params).items():
        if not isinstance(value, (int, float)):
            continue  # gap_per: a choice, in every record's extra (``params``)
        source = ("fit" if name in cal.fitted else
                  f"kernel traces ({len(cal.traced)} BF16 shapes, per {cal.params.gap_per})"
                  if name == "gap_us" and cal.traced is not None else "default")
        recs.append(results.make_record(
            EXPERIMENT, "model_parameter", value, "us" if name.endswith("_us") else "1",
            sizes={"parameter": name},
            extra={"kind": "calibration", "calibrated": cal.calibrated,
                   "fitted": name in cal.fitted, "source": source, "input_digest": digest,
                   **calib}, **common))
    if cal.fit is not None:
        for r in cal.fit.itertuples():
            sizes = _shape_sizes(r)
            extra = {"kind": "fit", "calibrated": True, "measured_ms": r.measured_ms,
                     "error": r.predicted_ms / r.measured_ms - 1, "input_digest": digest}
            recs.append(results.make_record(EXPERIMENT, "predicted_step_time_ms",
                                            r.predicted_ms, "ms", recipe="bf16", sizes=sizes,
                                            extra=extra, **common))
    for r in val.itertuples():
        sizes = {**_shape_sizes(r), "baseline": "bf16"}
        extra = {"kind": "validation", "calibrated": cal.calibrated, "error": r.error,
                 "measured_ms": r.measured_ms, "predicted_ms": r.predicted_ms,
                 "bf16_measured_ms": r.bf16_measured_ms, "bf16_predicted_ms": r.bf16_predicted_ms,
                 "compiled_traffic": bool(r.compiled_traffic), "input_digest": digest}
        for metric, value in (("predicted_speedup", r.predicted_speedup),
                              ("measured_speedup", r.measured_speedup)):
            recs.append(results.make_record(EXPERIMENT, metric, value, "x", recipe=r.recipe,
                                            sizes=sizes, extra=extra, **common))
    for r in proj.to_dict("records"):
        pub = published_for(r["model"], r["target"], r["baseline"], r["policy"])
        sizes = {"target": r["target"], "model": r["model"], "comparison": r["comparison"],
                 "baseline": r["baseline"], "policy": r["policy"],
                 "batch_tokens": r["batch_tokens"]}
        extra = {"kind": "projection", "calibrated": cal.calibrated,
                 "calibration_hardware": info.slug, "assumptions": ASSUMPTIONS,
                 "other_recipe": r["other_recipe"], "baseline_recipe": r["baseline_recipe"],
                 "fsdp": r["fsdp"], "breakdown_ms": r["breakdown_ms"],
                 "baseline_breakdown_ms": r["baseline_breakdown_ms"],
                 "published_speedup": pub["speedup"] if pub else None,
                 "published_source": pub["source"] if pub else None,
                 "params": dataclasses.asdict(cal.params), "input_digest": digest}
        for metric, value, unit in (("projected_speedup", r["speedup"], "x"),
                                    ("projected_step_time_ms", r["step_ms"], "ms"),
                                    ("projected_baseline_step_time_ms", r["baseline_step_ms"], "ms"),
                                    ("projected_tflops", r["tflops"], "TFLOP/s")):
            recs.append(results.make_record(EXPERIMENT, metric, value, unit, recipe=r["recipe"],
                                            sizes=sizes, extra=extra, **common))
    return recs


def calibrating_hardware(records: pd.DataFrame, need_steps: bool = True) -> list[str]:
    """GPU chips in the registry with non-emulated ``gemm`` rates (and, with ``need_steps``,
    BF16 ``mlp_step`` or ``lm_step`` times)."""
    if records is None or not len(records):
        return []
    ok = records[~records["emulated"].astype(bool)]
    gemm = set(ok[(ok["experiment"] == "gemm") & (ok["metric"] == "tflops")]["hardware"])
    step = set(ok[ok["experiment"].isin(list(WORKLOADS)) & (ok["metric"] == "step_time_ms")
                  & (ok["recipe"] == "bf16")]["hardware"])
    reg = hw.registry()
    chips = gemm & step if need_steps else gemm
    return sorted(s for s in chips if s in reg and s != "cpu")


def _setup_from_params(p: dict[str, Any]) -> tuple[dict, list[str]]:
    setup = default_projection_setup()
    for model, over in (p.get("models") or {}).items():
        if model in setup and isinstance(over, dict):
            setup[model] = {**setup[model], **{k: v for k, v in over.items() if k != "shape"}}
    models = p.get("model_names")
    if models:
        setup = {k: v for k, v in setup.items() if k in models}
    return setup, list(p.get("targets", TARGETS))


def _digest(df: pd.DataFrame, slug: str, extra: Any) -> str:
    if df is None or not len(df):
        body = []
    else:
        sub = df[df["hardware"] == slug]
        body = sorted(json.dumps([r["experiment"], r["recipe"], r["sizes"], r["metric"],
                                  r["value"]], sort_keys=True, default=str)
                      for r in sub.to_dict("records"))
    h = hashlib.sha256(json.dumps([body, extra, ASSUMPTIONS], default=str).encode())
    return h.hexdigest()[:16]


def _cell_digest(path: Path) -> str | None:
    try:
        data = json.loads(path.read_text())
        return data[0]["extra"].get("input_digest")
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def record(profile: str, root: Path | None = None, force: bool = False,
           measured: pd.DataFrame | None = None) -> list[Path]:
    """Calibrate on every chip with ``gemm`` + ``mlp_step`` (and/or ``lm_step``) records,
    validate against its FP8 step times, project NVFP4 onto Blackwell; one cell per
    calibrating chip.

    Without GPU records, one cell of datasheet-only projections (``extra.calibrated=False``)
    under the current hardware. A cell is rewritten only when its inputs changed (or
    ``force``). ``measured``: the records to use (default: ``load_records`` of ``gemm``,
    ``mlp_step`` and ``lm_step`` from ``results/`` and ``build/results/``).
    """
    from repro.config import ConfigError, stage_params

    try:
        p = stage_params(EXPERIMENT, profile)
    except ConfigError:
        p = {"profile": profile if profile != "auto" else "smoke"}
    profile = p["profile"]
    root = Path(root) if root is not None else results.record_root(profile)
    if measured is None:
        measured = measured_records()
    setup, targets = _setup_from_params(p)
    setup_key = {k: {kk: (dataclasses.asdict(vv) if dataclasses.is_dataclass(vv) else vv)
                     for kk, vv in v.items()} for k, v in setup.items()}
    full = calibrating_hardware(measured)
    jobs = [(slug, "calibrated" if slug in full else "rates_only")
            for slug in calibrating_hardware(measured, need_steps=False)]
    if not jobs:
        jobs = [(hw.detect().slug, "datasheet")]
    written = []
    for slug, cell in jobs:
        digest = _digest(measured, slug, [setup_key, targets, cell])
        path = results.cell_path(EXPERIMENT, cell, slug, root)
        if not force and path.exists() and _cell_digest(path) == digest:
            continue
        if cell in ("calibrated", "rates_only"):
            # rates_only: measured GEMM rates, but no step times to fit (calibrated=False)
            cal = calibrate(measured, slug)
            val = validate(measured, cal)
            proj = project(cal, targets, setup)
            recs = _records_for(cal, val, proj, profile, digest)
        else:
            # Nothing measured: datasheet peaks times the default efficiencies, projected onto
            # the targets only, written under this machine (whatever it is).
            info = hw.detect()
            cal = datasheet_calibration(info if info.memory_bandwidth_tbs else TARGETS[0])
            proj = project(cal, targets, setup, include_self=False)
            recs = _records_for(cal, validate(pd.DataFrame(), cal), proj, profile, digest,
                                info=info)
        for r in recs:
            r["extra"]["mode"] = cell
        written.append(results.write_records(recs, EXPERIMENT, cell, root=root))
    return written


MODES = ("calibrated", "rates_only", "datasheet")


def select_cells(perf: pd.DataFrame) -> pd.DataFrame:
    """The perfmodel records to report: those of the best mode present (``calibrated`` >
    ``rates_only`` > ``datasheet``), so a cell left over from before the GPU records came is
    dropped."""
    if perf is None or not len(perf):
        return pd.DataFrame(columns=results.RECORD_FIELDS + ["source"])
    mode = perf["extra"].map(lambda e: (e or {}).get("mode", "datasheet"))
    best = min(mode, key=lambda m: MODES.index(m) if m in MODES else len(MODES))
    return perf[mode == best].reset_index(drop=True)


# --------------------------------------------------------------------------------- verdict


def measured_fp4_speedups(records: pd.DataFrame) -> pd.DataFrame:
    """Measured NVFP4 speedups on chips with FP4 tensor cores: ``lm`` records
    (``tokens_per_s`` of each recipe, median over seeds, per model size), or any
    ``step_time_ms`` records with an ``nvfp4`` recipe. Empty while there are none."""
    cols = ["hardware", "model", "baseline", "speedup"]
    if records is None or not len(records):
        return pd.DataFrame(columns=cols)
    fp4_chips = {s for s in records["hardware"].unique()
                 if s in hw.registry() and hw.lookup(s).has_fp4}
    df = records[records["hardware"].isin(fp4_chips)
                 & records["metric"].isin(["tokens_per_s", "step_time_ms"])
                 & (~records["emulated"].astype(bool))].copy()
    if not len(df):
        return pd.DataFrame(columns=cols)
    df["model"] = df["sizes"].map(lambda s: str((s or {}).get("model") or json.dumps(
        {k: v for k, v in (s or {}).items() if k not in ("seed", "steps", "tokens")},
        sort_keys=True)))
    rows = []
    for (slug, model, metric), g in df.groupby(["hardware", "model", "metric"]):
        v = g.groupby("recipe")["value"].median()
        if "nvfp4" not in v:
            continue
        for base in ("bf16", "fp8-current", "fp8-delayed"):
            if base in v:
                ratio = (v["nvfp4"] / v[base] if metric == "tokens_per_s"
                         else v[base] / v["nvfp4"])
                rows.append((slug, model, base, float(ratio)))
    return pd.DataFrame(rows, columns=cols)


def b2_verdict(perf: pd.DataFrame, measured_fp4: pd.DataFrame | None = None) -> dict[str, Any]:
    """The B2 verdict: measured where a chip with FP4 tensor cores has recorded NVFP4 steps;
    otherwise ``projected`` from the perfmodel records ``perf``."""
    if measured_fp4 is not None and len(measured_fp4):
        best = measured_fp4.loc[measured_fp4["speedup"].idxmax()]
        bf = measured_fp4[measured_fp4["baseline"] == "bf16"]
        top = float(bf["speedup"].max()) if len(bf) else float("nan")
        verdict = ("reproduced" if top >= 1.5 else "partly" if top > 1.0 else
                   "contradicted" if np.isfinite(top) else "partly")
        return {"verdict": verdict,
                "key_number": f"measured NVFP4 {best['speedup']:.2f}x vs {best['baseline']} "
                              f"({best['model']}, {best['hardware']})",
                "hardware": str(best["hardware"]), "source": "lm records (measured)",
                "note": "measured on a chip with FP4 tensor cores; the model's projection is "
                        "in the perfmodel records"}
    proj = perf[perf["metric"] == "projected_speedup"] if len(perf) else perf
    if not len(proj):
        return {"verdict": "not yet measured", "key_number": "", "hardware": "",
                "source": "perfmodel", "note": "no projection records"}

    def pick(model, comparison, target):
        m = proj[(proj["size_model"] == model) & (proj["size_comparison"] == comparison)
                 & (proj["size_target"] == target)]
        return float(m["value"].iloc[0]) if len(m) else float("nan")

    calibrated = bool(proj["extra"].map(lambda e: e.get("calibrated")).any())
    hw_slug = str(proj["hardware"].iloc[0])
    bf = pick("llama3-8b", "nvfp4_vs_bf16", "gb200")
    f8 = pick("llama3-8b", "nvfp4_mlp_vs_fp8", "gb200")
    f8_300 = pick("llama3-405b", "nvfp4_mlp_vs_fp8", "gb300")
    val = perf[perf["metric"] == "predicted_speedup"]
    if len(val):
        # MLP and LM shapes count alike
        err = val["extra"].map(lambda e: abs(e.get("error", np.nan)))
        n_lm = int(val["sizes"].map(lambda s: (s or {}).get("workload") == "lm").sum())
        vtxt = (f"validated on {hw_slug}: FP8/BF16 speedup predicted within 10% at "
                f"{int((err <= 0.10).sum())}/{len(err)} measured shapes ({len(err) - n_lm} MLP, "
                f"{n_lm} LM; max error {err.max():.0%})")
    elif calibrated:
        vtxt = "not validated: no FP8 mlp_step/lm_step records beside the BF16 ones"
    elif proj["extra"].map(lambda e: e.get("mode") == "rates_only").any():
        vtxt = (f"NOT validated: measured {hw_slug} GEMM rates, but no mlp_step records (nor "
                "lm_step) yet to calibrate and validate the step model (default "
                "bandwidth/gap parameters)")
    else:
        vtxt = "NOT validated: no GPU gemm/mlp_step/lm_step records yet (datasheet peaks only)"
    key = (f"projected NVFP4 {bf:.2f}x vs BF16 (Llama-3-8B, GB200; published 1.59x), "
           f"{f8:.2f}x vs FP8 MLP-only (GB200; published 1.35x), 405B GB300 {f8_300:.2f}x "
           f"(published 1.73x)")
    return {"verdict": "projected", "key_number": key,
            "hardware": f"{hw_slug} -> gb200/gb300 (projection)",
            "source": "perfmodel records" + ("" if calibrated else " (not calibrated)"),
            "note": f"no record from a chip with FP4 tensor cores yet; {vtxt}"}
