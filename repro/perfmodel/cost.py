"""What a training step does: its GEMMs and its memory traffic, counted from the shapes.

A step (:class:`Step`) is a list of GEMMs (:class:`Gemm`: ``m x k x n``, how many launches,
which number format) plus memory traffic (:class:`Traffic`: bytes of one kind of elementwise or
quantization pass). :func:`mlp_step_gemms` builds the step of the ReLU MLP of
``repro.experiments.mlp_step.measure``, :func:`lm_step_gemms` that of a Llama-style decoder
(:class:`DecoderShape`: the Llama 3 presets and this repository's LM presets). Recipes are read
through ``repro.precision.resolve`` only: the GEMM format is ``Recipe.number_format``, the
quantization cost follows ``Recipe.quantizer``. Nothing here is measured or timed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from repro.precision.recipes import Recipe, resolve

FORMATS = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp4", "int8")
# Bytes per stored element. NVFP4: 4-bit values plus one E4M3 scale per 16 elements.
ELEMENT_BYTES = {"fp32": 4.0, "tf32": 4.0, "bf16": 2.0, "fp16": 2.0, "fp8": 1.0,
                 "fp4": 0.5 + 1.0 / 16, "int8": 1.0}
NVFP4_POLICIES = ("paper", "mlp", "all")  # as repro.models.lm.NVFP4_SCOPES
GAP_PER = ("gemm", "kernel")  # what the idle-gap term counts (ModelParams.gap_per)


def check_gap_per(per: str) -> str:
    """``per`` if it is one of :data:`GAP_PER`, else a one-line ValueError."""
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
        return self.gemm_launches if check_gap_per(per) == "gemm" else self.kernels


def program_step(step: Step, hlo_bytes: float | None, hlo_kernels: float | None) -> Step:
    """``step`` with its assumed elementwise traffic replaced by what the compiled program says
    (``repro.studies.lowering.compiled_facts``): XLA's bytes accessed minus the GEMMs' own operand
    and output bytes, in the program's launching ops minus the GEMM launches. The GEMMs stay.
    Without both facts (records made before they were recorded), ``step`` unchanged."""
    if hlo_bytes is None or hlo_kernels is None or not (
            math.isfinite(hlo_bytes) and math.isfinite(hlo_kernels)):
        return step
    gemm_bytes = sum(g.launch_bytes * g.count for g in step.gemms)
    other = Traffic(max(0.0, hlo_bytes - gemm_bytes), "compiled_program",
                    max(0, int(hlo_kernels) - step.gemm_launches))
    return Step(list(step.gemms), [other], step.name + " (compiled traffic)")


def _linear(step: Step, m: int, k: int, n: int, fmt: str, count: int = 1, *, dgrad=True,
            prefix: str = "", wgrad_out_bytes: float = 2.0):
    """Forward, data-gradient and weight-gradient GEMMs of ``y[m,n] = x[m,k] w[k,n]``."""
    step.gemms.append(Gemm(m, k, n, count, fmt, prefix + "fwd"))
    if dgrad:
        step.gemms.append(Gemm(m, n, k, count, fmt, prefix + "dgrad"))
    step.gemms.append(Gemm(k, m, n, count, fmt, prefix + "wgrad", out_bytes=wgrad_out_bytes))


# Bytes written per element of one quantized layout, by Recipe.quantizer.
_QUANTIZED_BYTES = {"current": 1.0, "delayed": 1.0, "none": 1.0, "mxfp8": 1.0 + 1.0 / 32,
                    "nvfp4": ELEMENT_BYTES["fp4"]}
# Tiny kernels per operand that roll an amax history or compute a scale, by Recipe.quantizer.
_SCALE_KERNELS = {"current": 1, "delayed": 2, "none": 0, "mxfp8": 0, "nvfp4": 1}


def _quant_traffic(step: Step, recipe: Recipe, x_elems: float, w_elems: float,
                   g_elems: float, count: int = 1, act_bytes: float = 2.0,
                   master_bytes: float = 4.0, x_fused: bool = True):
    """The quantization cost of ``count`` linear layers quantized by ``recipe``, as the CHANGE
    against the same layers in BF16 (whose elementwise passes, counted by the builders, write
    the input ``x`` and the output gradient ``g`` in BF16, and whose FP32 master weight is cast
    once).

    ``x`` and ``g`` are produced by an elementwise pass (bias/ReLU, norm, SwiGLU, ReLU
    backward...): XLA fuses the quantization into that pass (Transformer Engine's fused
    kernels do the same), and it writes the two layouts the two GEMMs need (row-wise and
    column-wise: FP8 tensor cores take K-major operands) in place of the BF16 copy. Per
    element of ``x`` and ``g``, by ``recipe.quantizer``:

    - ``current`` (FP8): one extra read (the amax must be complete before the quantizing pass
      starts) in an amax kernel, plus a scalar kernel for the scale; 2 x 1 byte written.
    - ``delayed`` (FP8): the amax for the history is fused into the quantizing pass (no extra
      bytes); two tiny kernels per operand roll the history and recompute the scale.
    - ``none`` (FP8 without scaling): a cast, nothing extra.
    - ``mxfp8``: 2 x (1 + 1/32) bytes written (E8M0 scale per 32), no amax pass.
    - ``nvfp4``: a global-amax pass (one extra read), 2 x 0.5625 bytes written; ``x`` and ``g``
      (the weight-gradient inputs) also get the random Hadamard transform on their column
      copy, whose amax needs another read.

    The weight (FP32 master, ``w_elems``) replaces the BF16 cast by a quantizing pass: read 4
    bytes, write both layouts (plus an amax read for current scaling and NVFP4).
    ``x_fused=False``: the input has no producing pass (the network input): quantizing it is
    a pass of its own (read + write).
    """
    c, b, scaling = count, act_bytes, recipe.quantizer
    if scaling not in _QUANTIZED_BYTES:
        raise ValueError(f"recipe {recipe.name!r}: unknown quantizer {scaling!r}; valid: "
                         f"{', '.join(_QUANTIZED_BYTES)}")
    q, amax = _QUANTIZED_BYTES[scaling], scaling in ("current", "nvfp4")
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
    if _SCALE_KERNELS[scaling]:
        hist = recipe.amax_history_len * 4 * 3 if scaling == "delayed" else 0
        step.traffic.append(Traffic(c * hist, "scale_update", 3 * c * _SCALE_KERNELS[scaling]))


def mlp_step_gemms(batch: int, width: int, depth: int, recipe: str | Recipe = "bf16", *,
                   input_grad: bool = True, bias: bool = True) -> Step:
    """The training step of ``repro.experiments.mlp_step.measure.MLP`` (ReLU, biases, MSE loss,
    Adam on FP32 master weights).

    Per layer: forward ``(B, W, W)``, data-gradient ``(B, W, W)`` and weight-gradient
    ``(W, B, W)`` GEMMs, all three in the recipe's format, plus the quantization cost of
    :func:`_quant_traffic`. ``input_grad=False`` drops the first layer's data gradient: XLA
    removes it, since nothing asks for the gradient of the input.

    Elementwise traffic per layer: bias (+ ReLU) after the forward GEMM (read, write), ReLU
    backward (read gradient and activation, write), bias gradient (read), the FP32 ->
    compute-dtype weight cast (unquantized recipes), Adam (read p, m, v, g; write p, m, v:
    28 bytes per FP32 parameter); and the loss once.
    """
    r = resolve(recipe)
    fmt, quantized = r.number_format, r.quantizer is not None
    act = ELEMENT_BYTES["fp32" if fmt in ("fp32", "tf32") else "bf16"]
    e, p = float(batch) * width, float(width) * width
    step = Step(name=f"mlp b{batch} w{width} d{depth} {r.name}")
    for i in range(depth):
        _linear(step, batch, width, width, fmt, dgrad=input_grad or i > 0, prefix=f"l{i}.",
                wgrad_out_bytes=4.0 if quantized else act)
        if quantized:
            _quant_traffic(step, r, e, p, e, act_bytes=act, x_fused=i > 0)
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


def lm_shape(size: str, seq_len: int | None = None) -> DecoderShape | None:
    """The decoder shape of one LM preset of ``repro.models.lm.PRESETS`` (``tiny``, ``20m``,
    ``120m``), named ``lm-<size>``, optionally at another ``seq_len``; None for an unknown
    size."""
    from repro.models.lm import PRESETS

    c = PRESETS.get(size)
    if c is None:
        return None
    shape = DecoderShape(f"lm-{size}", c.d_model, c.n_layers, c.d_ff, c.n_heads,
                         getattr(c, "n_kv_heads", c.n_heads), c.vocab_size, c.seq_len,
                         getattr(c, "n_bf16_last_blocks", 0))
    return dataclasses.replace(shape, seq_len=int(seq_len)) if seq_len else shape


def lm_shapes() -> dict[str, DecoderShape]:
    """This repository's trained LM presets (20m, 120m) as decoder shapes, by name."""
    return {s.name: s for s in map(lm_shape, ("20m", "120m")) if s is not None}


def _block_linears(step: Step, cfg: DecoderShape, T: int, recipe: Recipe, policy: str,
                   other: Recipe, bf16: Recipe) -> None:
    """The four linear layers of every block: QKV, attention output, SwiGLU gate+up (one
    GEMM) and down, each with its gradients and its quantization or cast traffic; the last
    ``cfg.n_bf16_last_blocks`` blocks of a block-scaled recipe's "paper" policy in ``bf16``."""
    d, f, L, hd = cfg.hidden, cfg.ffn, cfg.n_layers, cfg.head_dim
    block_scaled = recipe.scaling == "block"
    n_plain = cfg.n_bf16_last_blocks if (block_scaled and policy == "paper") else 0

    def linear(k, n, r, count, name):
        if count == 0:
            return
        quantized = r.quantizer is not None
        _linear(step, T, k, n, r.number_format, count, prefix=name + ".",
                wgrad_out_bytes=4.0 if quantized else 2.0)
        if quantized:
            _quant_traffic(step, r, T * k, k * n, T * n, count)
        else:
            step.traffic.append(Traffic(count * k * n * 6.0, "cast", count))

    mats = {"attn_qkv": (d, (cfg.n_heads + 2 * cfg.n_kv_heads) * hd),
            "attn_out": (cfg.n_heads * hd, d), "mlp_in": (d, 2 * f), "mlp_out": (f, d)}
    for name, (k, n) in mats.items():
        if block_scaled:
            in_policy = policy != "mlp" or name.startswith("mlp")
            linear(k, n, recipe if in_policy else other, L - n_plain, name)
            linear(k, n, bf16, n_plain, name)
        else:
            linear(k, n, recipe, L, name)


def _attention(step: Step, cfg: DecoderShape, T: int) -> None:
    """Attention core, BF16, flash-attention style: per launch all heads of all sequences,
    causal (half the tiles); backward recomputes QK^T, so 2 forward + 5 backward products.

    The scores and probabilities stay on chip (cuDNN's fused attention, repro.models.lm): each
    product moves about two [s, hd] BF16 tiles per (sequence, head) through device memory
    (forward: Q, K, V in, O out; backward: Q, K, V, O, dO in, dQ, dK, dV out). Counting the
    [s, s] scores instead made the GEMMs' bytes exceed the whole compiled program's, which
    left no room for the FP8 quantization traffic in :func:`program_step`."""
    L, hd, s = cfg.n_layers, cfg.head_dim, min(cfg.seq_len, T)
    score = dict(batch=max(T // s, 1) * cfg.n_heads, work=0.5, fmt="bf16",
                 hbm_bytes=2 * s * hd * 2.0)
    step.gemms += [Gemm(s, hd, s, L, role="attn.qk", **score),
                   Gemm(s, s, hd, L, role="attn.pv", **score),
                   Gemm(s, hd, s, L, role="attn.qk_recompute", **score),
                   Gemm(s, s, hd, L, role="attn.dv", **score),
                   Gemm(s, hd, s, L, role="attn.dp", **score),
                   Gemm(s, s, hd, L, role="attn.dq", **score),
                   Gemm(s, s, hd, L, role="attn.dk", **score)]


def lm_step_gemms(cfg: DecoderShape, batch_tokens: int, recipe: str | Recipe = "bf16",
                  policy: str = "paper", *, other_recipe: str | Recipe | None = None,
                  fsdp: int = 1) -> Step:
    """One training step of a Llama-style decoder on ``batch_tokens`` tokens (per GPU).

    Per block: QKV ``(T, d, (h + 2 kv) hd)``, attention output ``(T, h hd, d)``, SwiGLU gate+up
    as one ``(T, d, 2 f)`` GEMM and down ``(T, f, d)``, each with its data- and weight-
    gradient GEMMs; attention itself in BF16 (:func:`_attention`); the output head
    ``(T, d, V)`` in BF16. Embedding lookup, norms, RoPE, residuals, SwiGLU, the
    cross-entropy and Adam (28 bytes per FP32 parameter, sharded over ``fsdp`` GPUs) are
    memory traffic. Communication is not modelled.

    ``policy`` for a block-scaled recipe (``Recipe.scaling == "block"``: NVFP4, MXFP8), as
    ``repro.models.lm.NVFP4_SCOPES``: ``paper`` (NVIDIA's recipe: every block linear layer, the
    last ``cfg.n_bf16_last_blocks`` blocks excepted), ``mlp`` (MaxText's NVFP4 post: MLP GEMMs
    only) or ``all`` (every block). Block linear layers outside the policy run
    ``other_recipe``: BF16 by default; MaxText's NVFP4 runs keep them in FP8
    (``other_recipe="fp8-current"``). Per-tensor FP8 recipes quantize every block linear
    layer. Embeddings and the head stay BF16 in every recipe.
    """
    if policy not in NVFP4_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; valid: {', '.join(NVFP4_POLICIES)}")
    r, bf16, other = (None if n is None else resolve(n) for n in (recipe, "bf16", other_recipe))
    other = other or (bf16 if r.scaling == "block" else r)
    T, d, L = batch_tokens, cfg.hidden, cfg.n_layers
    step = Step(name=f"{cfg.name} T{T} {r.name}/{policy}")
    _block_linears(step, cfg, T, r, policy, other, bf16)
    _attention(step, cfg, T)
    # Output head (BF16), its gradients, and the cross-entropy over FP32 logits.
    _linear(step, T, d, cfg.vocab, "bf16", prefix="head.")
    step.traffic.append(Traffic(T * cfg.vocab * 4.0 * 3, "loss", 2))
    step.traffic.append(Traffic(T * d * 2.0 * 3, "embedding", 2))
    # Elementwise per block, forward (backward ~2x): 2 RMSNorms (r+w), 2 residual adds (2r+w),
    # RoPE on q and k (r+w), SwiGLU (2r+w of the f-wide activations).
    fwd = (2 * (2 * T * d) + 2 * (3 * T * d) + 2 * (T * (cfg.n_heads + cfg.n_kv_heads)
                                                      * cfg.head_dim) + 3 * T * cfg.ffn)
    step.traffic.append(Traffic(L * fwd * 2.0 * 3, "activation", L * 18))
    step.traffic.append(Traffic(cfg.params * 28.0 / fsdp, "optimizer", L * 9 + 4))
    return step
