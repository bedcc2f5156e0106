"""A MaxText/Llama-style decoder LM whose every linear layer takes a precision recipe.

Pre-norm blocks: RMSNorm -> causal self-attention with rotary position embeddings (RoPE) ->
residual; RMSNorm -> SwiGLU MLP -> residual. Untied input embedding and output head, no
biases, byte-level vocabulary (256). Linear layers are ``repro.precision.layers.Dense`` with the recipe
that :func:`layer_recipe` picks for that layer; the model code never knows which format runs.

The NVFP4 policy follows NVIDIA (arXiv 2509.25149; TE ``NVFP4BlockScaling``): the linear layers
of the transformer blocks (QKV, attention output, MLP gate/up and down) run NVFP4; the embedding,
the output head, attention itself (QK^T and AV) and the norms stay BF16; so do the last
``n_bf16_last_blocks`` blocks. NVIDIA kept roughly the last 15% of the 12B model's layers in
BF16 because the final layers were the most sensitive to FP4 (their ablations diverged
without); with the 2-17 blocks of the models here 15% rounds to ONE block, hence the default 1.
The recipe's ``scope`` ablates the policy: "default" (the above), "mlp" (NVFP4 on the MLP GEMMs
only, MaxText's ``te_nvfp4`` setting in NVIDIA's MaxText post; recipe ``nvfp4-mlp-only``) and
"all" (NVFP4 in every linear layer of every block and in the output head; only the embedding
lookup, attention and norms, which have no weight GEMM, stay BF16; ``nvfp4-all-layers``).

FP8 and MXFP8 recipes quantize every block linear layer (Transformer Engine's and MaxText's
convention); embedding and head stay BF16. Non-quantized recipes (bf16, fp32, ...) run every
layer in that recipe.

``recipe="jax-nvfp4"`` is a second NVFP4 reference, GPU only: the block linear layers go
through JAX's built-in ``jax.nn.scaled_dot_general`` with the ``nvfp4`` config, in all three
GEMMs (``repro.precision.peers``), under the same default policy.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

from repro import hardware
from repro.precision import formats
from repro.precision.recipes import Recipe, resolve

LayerKind = Literal["embed", "attn_qkv", "attn_core", "attn_out", "mlp_in", "mlp_out",
                    "norm", "head"]
LAYER_KINDS: tuple[str, ...] = ("embed", "attn_qkv", "attn_core", "attn_out", "mlp_in",
                                "mlp_out", "norm", "head")
BLOCK_LINEAR_KINDS = ("attn_qkv", "attn_out", "mlp_in", "mlp_out")
# Module paths of the block linear layers (a regex over flax paths, e.g. "block3/mlp/wi"), for
# post-training quantization rules: attention's QK^T and AV, the embedding and the head are
# left out.
BLOCK_LINEAR_PATH = r"block\d+/(attn/(qkv|out)|mlp/(wi|wo))"


@dataclass(frozen=True)
class LMConfig:
    """Sizes of the decoder. ``d_ff`` is the SwiGLU hidden width (about 8/3 d_model, rounded
    to a multiple of 64). Every GEMM dimension is a multiple of 16 (NVFP4 16x16 blocks)."""

    name: str = "tiny"
    vocab_size: int = 256
    d_model: int = 64
    n_layers: int = 2
    n_heads: int = 4
    d_ff: int = 192
    seq_len: int = 64
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    init_std: float = 0.02
    n_bf16_last_blocks: int = 1

    def __post_init__(self):
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model {self.d_model} not divisible by n_heads {self.n_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim {self.head_dim} must be even for RoPE")
        if not 0 <= self.n_bf16_last_blocks <= self.n_layers:
            raise ValueError(f"n_bf16_last_blocks must be in [0, {self.n_layers}], "
                             f"got {self.n_bf16_last_blocks}")

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def replace(self, **changes) -> "LMConfig":
        return dataclasses.replace(self, **changes)


PRESETS: dict[str, LMConfig] = {
    # CPU tests and the smoke profile: 0.14M parameters.
    "tiny": LMConfig("tiny", d_model=64, n_layers=2, n_heads=4, d_ff=192, seq_len=64),
    # ~19.6M parameters (nanoGPT's small char models are 10M).
    "20m": LMConfig("20m", d_model=512, n_layers=6, n_heads=8, d_ff=1408, seq_len=512),
    # ~121M parameters (GPT-2 small / Llama-style 125M class).
    "120m": LMConfig("120m", d_model=768, n_layers=17, n_heads=12, d_ff=2048, seq_len=1024),
    # ~812M parameters, for speed only (never trained here): Llama-2-7B's widths (d_model
    # 4096, SwiGLU 11008, 32 heads) in 4 blocks at sequence length 2048, where the block GEMMs
    # are wide enough for FP8 tensor cores to pay.
    "wide": LMConfig("wide", d_model=4096, n_layers=4, n_heads=32, d_ff=11008, seq_len=2048),
    # ~407M parameters in two blocks of the inference study's wide GEMM shapes (d_model 4096,
    # d_ff 11008): a train step whose GEMMs are wide enough for 8-bit arithmetic to matter,
    # small enough for a 16 GiB chip (a TPU v5e).
    "wide2": LMConfig("wide2", d_model=4096, n_layers=2, n_heads=32, d_ff=11008, seq_len=1024),
}


def get_config(name: str | LMConfig, **overrides) -> LMConfig:
    """A preset by name (``tiny``, ``20m``, ``120m``, ``wide``, ``wide2``) with optional field
    overrides."""
    if isinstance(name, LMConfig):
        return name.replace(**overrides) if overrides else name
    if name not in PRESETS:
        raise ValueError(f"unknown model size {name!r}; presets: {', '.join(PRESETS)}")
    return PRESETS[name].replace(**overrides) if overrides else PRESETS[name]


def param_count(cfg: LMConfig) -> int:
    """Number of parameters (embedding + head + blocks + final norm)."""
    d, f, v = cfg.d_model, cfg.d_ff, cfg.vocab_size
    block = 3 * d * d + d * d + 2 * d * f + f * d + 2 * d
    return v * d + d * v + cfg.n_layers * block + d


# ------------------------------------------------------------------------ recipe policy


def _bf16() -> Recipe:
    return resolve("bf16")


def layer_recipe(recipe: str | Recipe, layer_kind: str, block_index: int | None,
                 cfg: LMConfig) -> Recipe:
    """The recipe one layer runs under (see the module docstring for the policy).

    ``layer_kind``: one of :data:`LAYER_KINDS`; ``block_index``: the block (0-based), or None
    outside the blocks (embed, head, final norm).
    """
    if layer_kind not in LAYER_KINDS:
        raise ValueError(f"unknown layer kind {layer_kind!r}; kinds: {', '.join(LAYER_KINDS)}")
    r = resolve(recipe)
    if not r.quantized:
        return r
    if layer_kind in ("embed", "attn_core", "norm"):
        return _bf16()  # lookups, attention BMMs and norms: BF16 in every recipe
    if r.gemm != "nvfp4":
        return _bf16() if layer_kind == "head" else r
    if r.scope == "all":
        return r
    if layer_kind == "head":
        return _bf16()
    if block_index is not None and block_index >= cfg.n_layers - cfg.n_bf16_last_blocks:
        return _bf16()
    if r.scope == "mlp" and layer_kind not in ("mlp_in", "mlp_out"):
        return _bf16()
    return r


def recipe_map(recipe: str | Recipe, cfg: LMConfig) -> dict[str, str]:
    """``{"block3/attn_qkv": "nvfp4", ...}``: the policy for every linear layer, for reports."""
    out = {}
    for i in range(cfg.n_layers):
        for kind in BLOCK_LINEAR_KINDS:
            out[f"block{i}/{kind}"] = layer_recipe(recipe, kind, i, cfg).name
    out["head"] = layer_recipe(recipe, "head", None, cfg).name
    return out


# ------------------------------------------------------------------------------- layers


def _linear(features: int, recipe: Recipe, std: float, name: str) -> nn.Module:
    init = nn.initializers.normal(std)
    from repro.precision import layers

    return layers.dense(features, recipe, use_bias=False, kernel_init=init, name=name)


class RMSNorm(nn.Module):
    """``x / rms(x) * scale``, computed in FP32, returned in ``dtype``."""

    eps: float = 1e-5
    dtype: jnp.dtype = jnp.bfloat16

    @nn.compact
    def __call__(self, x):
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32)
        xf = x.astype(jnp.float32)
        y = xf * lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + self.eps)
        return (y * scale).astype(self.dtype)


def rope(x, positions, theta: float = 10000.0):
    """Rotary position embedding of ``x[..., T, H, D]`` at ``positions[T]`` (Llama's
    rotate-half layout: dimension i pairs with i + D/2, frequency theta^(-2i/D))."""
    d = x.shape[-1]
    freq = theta ** (-jnp.arange(0, d // 2, dtype=jnp.float32) * 2.0 / d)
    angle = positions.astype(jnp.float32)[:, None] * freq[None, :]  # [T, D/2]
    cos, sin = jnp.cos(angle)[:, None, :], jnp.sin(angle)[:, None, :]  # [T, 1, D/2]
    xf = x.astype(jnp.float32)
    x1, x2 = xf[..., : d // 2], xf[..., d // 2:]
    return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)


def attention_implementation(dtype) -> str:
    """cuDNN flash attention on GPUs for BF16/FP16 (no T x T matrix in memory), else XLA."""
    on_gpu = hardware.platform() == "gpu"
    return "cudnn" if on_gpu and jnp.dtype(dtype) in (jnp.bfloat16, jnp.float16) else "xla"


# The cuDNN version that cuDNN attention's checks are answered with where a program is traced
# for a GPU on another device (:func:`_cudnn_attention`); the traced program does not depend on it.
TRACED_CUDNN_VERSION = 91000


def _cudnn_attention(q, k, v):
    """cuDNN's flash attention. Traced for a GPU on a machine without one
    (``repro.hardware.target``), JAX's cuDNN checks (library version, compute capability) are
    answered as the target GPU would answer them, so the traced program is the GPU's."""
    if jax.default_backend() == "gpu":
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    from jax._src.cudnn import fused_attention_stablehlo as F

    entry = hardware._registered_as(hardware.device_kind() or "-")
    cc = hardware.lookup(entry).compute_capability if entry else None
    have = tuple(int(c) for c in (cc or "0.0").split("."))
    names = ("check_cudnn_version", "check_compute_capability",
             "is_cuda_compute_capability_equal")
    saved = [getattr(F, n) for n in names]
    F.check_cudnn_version = lambda: TRACED_CUDNN_VERSION
    F.check_compute_capability = lambda c: have >= tuple(int(x) for x in c.split("."))
    F.is_cuda_compute_capability_equal = lambda c: have == tuple(int(x) for x in c.split("."))
    try:
        return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="cudnn")
    finally:
        for n, f in zip(names, saved):
            setattr(F, n, f)


def causal_attention(q, k, v):
    """softmax(q k^T / sqrt(d) + causal mask) v for ``[B, T, H, D]``; FP32 softmax."""
    impl = attention_implementation(q.dtype)
    if impl == "cudnn":
        try:
            return _cudnn_attention(q, k, v)
        except Exception:  # noqa: BLE001 - an unsupported shape/version: XLA's is exact too
            pass
    return jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")


DECODE_MODES = (None, "prefill", "step")


def _no_cache(*_):
    raise ValueError("decode='prefill'/'step' needs a KV cache: apply with variables "
                     "{'params': ..., 'cache': repro.models.lm_decode.init_cache(...)} and "
                     "mutable=['cache']")


def cached_attention(module: nn.Module, q, k, v, decode: str, start):
    """Attention through the KV cache of ``module`` (variables "cache"/"k" and "cache"/"v",
    ``[B, max_len, H, D]``): the new keys and values are written at positions
    ``start .. start + T - 1``. "prefill" (``start`` 0): the prompt attends to itself, as the
    uncached forward pass does. "step": each query attends to every cached position up to its
    own (the cache holds the whole prefix)."""
    ck = module.variable("cache", "k", _no_cache)
    cv = module.variable("cache", "v", _no_cache)
    at = (0, start, 0, 0)
    if ck.value.dtype == KV_FP8:
        return _fp8_cached_attention(module, ck, cv, q, k, v, decode, at)
    ck.value = lax.dynamic_update_slice(ck.value, k.astype(ck.value.dtype), at)
    cv.value = lax.dynamic_update_slice(cv.value, v.astype(cv.value.dtype), at)
    if decode == "prefill":
        return causal_attention(q, k, v)
    qpos = start + jnp.arange(q.shape[1])
    mask = jnp.arange(ck.value.shape[1])[None, :] <= qpos[:, None]  # [T, max_len]
    return jax.nn.dot_product_attention(q, ck.value.astype(q.dtype), cv.value.astype(q.dtype),
                                        mask=mask[None, None], implementation="xla")


KV_FP8 = jnp.float8_e4m3fn  # the element type of an FP8 KV cache


def _fp8_cached_attention(module: nn.Module, ck, cv, q, k, v, decode: str, at):
    """:func:`cached_attention` through an FP8 (E4M3) cache: keys and values are stored as
    ``fp8_quantize(x, scale)`` with one per-tensor scale each per block (variables
    "cache"/"k_scale" and "v_scale"), set at "prefill" from the prompt's amax (as a rollout
    engine recalibrates its KV scales for the current policy) and kept for the decode steps,
    whose keys and values saturate at ``448 * scale``. Attention reads them dequantized, the
    prompt's own included."""
    ks = module.variable("cache", "k_scale", _no_cache)
    vs = module.variable("cache", "v_scale", _no_cache)
    if decode == "prefill":
        fmax = float(jnp.finfo(KV_FP8).max)
        ks.value = formats.compute_scale(jnp.max(jnp.abs(k.astype(jnp.float32))), fmax)
        vs.value = formats.compute_scale(jnp.max(jnp.abs(v.astype(jnp.float32))), fmax)
    kq, vq = (formats.fp8_quantize(x, KV_FP8, s.value) for x, s in ((k, ks), (v, vs)))
    ck.value = lax.dynamic_update_slice(ck.value, kq, at)
    cv.value = lax.dynamic_update_slice(cv.value, vq, at)

    def read(x, s):
        return formats.fp8_dequantize(x, s.value, q.dtype)

    if decode == "prefill":
        return causal_attention(q, read(kq, ks), read(vq, vs))
    qpos = at[1] + jnp.arange(q.shape[1])
    mask = jnp.arange(ck.value.shape[1])[None, :] <= qpos[:, None]  # [T, max_len]
    return jax.nn.dot_product_attention(q, read(ck.value, ks), read(cv.value, vs),
                                        mask=mask[None, None], implementation="xla")


class Attention(nn.Module):
    cfg: LMConfig
    recipe: Recipe | str
    block: int

    @nn.compact
    def __call__(self, x, decode: str | None = None, start=0):
        cfg = self.cfg
        b, t, d = x.shape
        h, hd = cfg.n_heads, cfg.head_dim
        qkv = _linear(3 * d, layer_recipe(self.recipe, "attn_qkv", self.block, cfg),
                      cfg.init_std, "qkv")(x)
        q, k, v = jnp.split(qkv.reshape(b, t, 3, h, hd), 3, axis=2)
        q, k, v = q[:, :, 0], k[:, :, 0], v[:, :, 0]
        pos = jnp.arange(t) + (start if decode == "step" else 0)
        q, k = rope(q, pos, cfg.rope_theta), rope(k, pos, cfg.rope_theta)
        core = layer_recipe(self.recipe, "attn_core", self.block, cfg).dtype
        q, k, v = q.astype(core), k.astype(core), v.astype(core)
        if decode is None:
            o = causal_attention(q, k, v)
        else:
            o = cached_attention(self, q, k, v, decode, start if decode == "step" else 0)
        o = o.reshape(b, t, d)
        # Depth-scaled init of the residual projections (GPT-2 / MaxText practice).
        std = cfg.init_std / (2 * cfg.n_layers) ** 0.5
        return _linear(d, layer_recipe(self.recipe, "attn_out", self.block, cfg), std,
                       "out")(o)


class MLP(nn.Module):
    cfg: LMConfig
    recipe: Recipe | str
    block: int

    @nn.compact
    def __call__(self, x):
        cfg = self.cfg
        gate_up = _linear(2 * cfg.d_ff, layer_recipe(self.recipe, "mlp_in", self.block, cfg),
                          cfg.init_std, "wi")(x)
        gate, up = jnp.split(gate_up, 2, axis=-1)
        hmid = (nn.silu(gate.astype(jnp.float32)) * up.astype(jnp.float32)).astype(x.dtype)
        std = cfg.init_std / (2 * cfg.n_layers) ** 0.5
        return _linear(cfg.d_model, layer_recipe(self.recipe, "mlp_out", self.block, cfg),
                       std, "wo")(hmid)


class Block(nn.Module):
    cfg: LMConfig
    recipe: Recipe | str
    block: int

    @nn.compact
    def __call__(self, x, decode: str | None = None, start=0):
        cfg = self.cfg
        nd = layer_recipe(self.recipe, "norm", self.block, cfg).dtype
        x = x + Attention(cfg, self.recipe, self.block, name="attn")(
            RMSNorm(cfg.norm_eps, nd, name="attn_norm")(x), decode, start).astype(x.dtype)
        x = x + MLP(cfg, self.recipe, self.block, name="mlp")(
            RMSNorm(cfg.norm_eps, nd, name="mlp_norm")(x)).astype(x.dtype)
        return x


class Decoder(nn.Module):
    """``tokens[B, T] (int) -> logits[B, T, vocab] (float32)``.

    ``decode`` (KV-cache inference, ``repro.models.lm_decode``): "prefill" runs the prompt
    and writes its keys and values into the "cache" collection; "step" runs ``tokens`` at
    positions ``start ..`` against the cache. The parameters are the same in every mode.
    """

    cfg: LMConfig
    recipe: Recipe | str = "bf16"

    @nn.compact
    def __call__(self, tokens, decode: str | None = None, start=0):
        if decode not in DECODE_MODES:
            raise ValueError(f"decode must be one of {DECODE_MODES}, got {decode!r}")
        cfg = self.cfg
        emb_r = layer_recipe(self.recipe, "embed", None, cfg)
        emb = self.param("embedding", nn.initializers.normal(cfg.init_std),
                         (cfg.vocab_size, cfg.d_model), jnp.float32)
        x = jnp.take(emb, tokens, axis=0).astype(emb_r.dtype)
        for i in range(cfg.n_layers):
            x = Block(cfg, self.recipe, i, name=f"block{i}")(x, decode, start)
        x = RMSNorm(cfg.norm_eps, layer_recipe(self.recipe, "norm", None, cfg).dtype,
                    name="final_norm")(x)
        logits = _linear(cfg.vocab_size, layer_recipe(self.recipe, "head", None, cfg),
                         cfg.init_std, "head")(x)
        return logits.astype(jnp.float32)


def make_model(cfg: LMConfig | str, recipe: str | Recipe = "bf16") -> Decoder:
    return Decoder(get_config(cfg), recipe)


def cross_entropy(logits, targets):
    """Mean next-token cross-entropy in nats (FP32)."""
    logp = jax.nn.log_softmax(logits.astype(jnp.float32), axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, targets[..., None], axis=-1))
