# %% [markdown]
# # 01 · The number formats: FP8 (E4M3, E5M2), MXFP8 and NVFP4
#
# **Claim B1** (seed article on NVFP4 with JAX / MaxText): *"NVFP4 is a 4-bit floating-point
# format with native Blackwell tensor-core support."* What a reproduction must show is the exact
# format, bit-faithful: **E2M1 elements** (values 0, 0.5, 1, 1.5, 2, 3, 4, 6), **one E4M3 scale
# per block of 16 elements**, **one FP32 scale per tensor** (NVIDIA, arXiv 2509.25149; Transformer
# Engine's `NVFP4BlockScaling`).
#
# **Method.** `repro.precision.formats` implements the quantizers in pure JAX. This notebook
# (1) lists every representable value of E4M3, E5M2 and E2M1 from the bit patterns, (2) checks
# the NVFP4 quantizer bit for bit against an independent NumPy + `ml_dtypes` implementation of
# the recipe and against a block computed by hand, (3) measures the relative quantization error
# against magnitude over 20 decades, with and without scaling. The *native Blackwell support*
# half of the claim is tested only by NVFP4 GEMMs run natively on FP4 tensor cores: a committed
# `lm` record from such a chip (notebook 06 projects NVFP4's speed until one exists).
#
# **Decision rule** (`repro.claims.verdicts.b1`): **reproduced** if every check of section 2
# passes (the quantizer is the NVFP4 recipe, bit for bit) and a record shows NVFP4 running
# natively on FP4 tensor cores; **partly** if the checks pass but the native half is not
# measured; **contradicted** if a check fails.

# %% tags=["parameters"]
profile = "smoke"
scratch = "build/results"  # smoke records (`repro notebook` gives each notebook its own)

# %%
import jax
import jax.numpy as jnp
import matplotlib.pyplot as plt
import ml_dtypes
import numpy as np
import pandas as pd
import seaborn as sns

from repro import hardware, notebook, plotstyle
from repro.claims import registration, verdicts
from repro.precision import formats
from repro.precision.formats import E2M1, E4M3, E5M2

nb = notebook.start("01_formats", "formats", profile, scratch)
P, HW = nb.params, nb.machine
COMPUTED = (f"Computed in this notebook ({HW.slug}, {nb.profile} profile); the formats' "
            "numerics are the same on every device.")

# %% [markdown]
# ## 1. Representable values
#
# Every finite, non-negative value of each format, read off all of its bit patterns
# (`repro.precision.formats.representable_values`). E4M3 (no infinities) trades range for
# precision against E5M2; E2M1 has 8 magnitudes.

# %%
FORMATS = {"E4M3": E4M3, "E5M2": E5M2, "E2M1 (NVFP4 elements)": E2M1}
values = {name: formats.representable_values(dt) for name, dt in FORMATS.items()}
pd.DataFrame([{"format": name, "finite values >= 0": len(v), "max": v.max(),
               "smallest subnormal": v[v > 0].min(),
               "binades covered": np.log2(v.max() / v[v > 0].min())}
              for name, v in values.items()])

# %%
rows = [{"format": name, "value": x} for name, v in values.items() for x in v if x > 0]
df_values = pd.DataFrame(rows)
fig, axes = plt.subplots(2, 1, figsize=(10, 5.5), gridspec_kw={"height_ratios": [3, 2]})
sns.stripplot(data=df_values, x="value", y="format", hue="format", jitter=False, size=4,
              palette={n: plotstyle.color(n.split()[0]) for n in FORMATS},
              marker="|", linewidth=1.2, legend=False, ax=axes[0], native_scale=True)
axes[0].set(xscale="log", xlabel="representable value (log2 axis)", ylabel="",
            title="Positive representable values")
axes[0].set_xscale("log", base=2)
e2m1 = values["E2M1 (NVFP4 elements)"]
axes[1].stem(e2m1, np.ones_like(e2m1), basefmt=" ")
for x in e2m1:
    axes[1].annotate(f"{x:g}", (x, 1.02), ha="center", va="bottom", fontsize=9)
axes[1].set(ylim=(0, 1.35), yticks=[], xlabel="value (linear axis)",
            title="E2M1, the NVFP4 element format: all 8 magnitudes")
nb.save(fig, "01_formats_values", COMPUTED)

# %% [markdown]
# ## 2. Is the NVFP4 quantizer bit-faithful?
#
# The reference below is independent of `repro.precision.formats`: NumPy and `ml_dtypes` casts
# (round to nearest even, saturating), global scale `amax / (448 * 6)` in FP32, block scale
# `e4m3((block_amax / 6) / global)`, elements `e2m1(clip(x / (block_scale * global), ±6))`.
# Bits are compared, not values.

# %%
def nvfp4_reference(x: np.ndarray, block: int = 16):
    """Independent NVFP4 (1 x 16 blocks) with numpy + ml_dtypes; returns (q, block_scale, gs)."""
    x = x.astype(np.float32)
    gs = np.float32(np.abs(x).max()) / np.float32(448.0 * 6.0)
    xb = x.reshape(*x.shape[:-1], -1, block)
    bmax = np.abs(xb).max(axis=-1, keepdims=True)
    bs = ((bmax / np.float32(6.0)) / gs).astype(ml_dtypes.float8_e4m3fn)
    denom = bs.astype(np.float32) * gs
    y = np.where(denom > 0, xb / np.where(denom > 0, denom, 1), 0).astype(np.float32)
    q = np.clip(y, -6, 6).astype(ml_dtypes.float4_e2m1fn)
    return q.reshape(x.shape), bs[..., 0], gs


def bits(a) -> np.ndarray:
    return np.asarray(a).view(np.uint8)


rng = np.random.default_rng(0)
cols = max(int(P.get("n_samples", 20000)) // 8 // 128 * 128, 128)
# Heavy-tailed data with block-to-block magnitude changes, so scales differ between blocks.
x = (rng.standard_t(3, size=(8, cols))
     * np.exp(rng.normal(0, 2, size=(8, cols // 16))).repeat(16, axis=1)).astype(np.float32)
t = formats.nvfp4_quantize(jnp.asarray(x), block=(1, 16))
q_ref, bs_ref, gs_ref = nvfp4_reference(x)

checks = {}
checks["E2M1 values == {0,0.5,1,1.5,2,3,4,6}"] = (
    formats.representable_values(E2M1).tolist() == [0, 0.5, 1, 1.5, 2, 3, 4, 6])
checks["elements are E2M1 (4-bit float)"] = np.asarray(t.q).dtype == ml_dtypes.float4_e2m1fn
checks["one E4M3 scale per 16 elements"] = (
    np.asarray(t.block_scale).dtype == ml_dtypes.float8_e4m3fn
    and t.block_scale.shape == (x.shape[0], x.shape[1] // 16))
checks["one FP32 global scale = amax/(448*6)"] = (
    np.asarray(t.global_scale).dtype == np.float32 and np.asarray(t.global_scale).shape == ()
    and float(t.global_scale) == float(gs_ref))
mism_q = int((bits(t.q) != bits(q_ref)).sum())
mism_s = int((bits(t.block_scale) != bits(bs_ref)).sum())
checks["elements bit-exact vs ml_dtypes"] = mism_q == 0
checks["block scales bit-exact vs ml_dtypes"] = mism_s == 0

# Every E2M1 rounding tie (midpoints between neighbours) rounds to even, as ml_dtypes does.
grid = formats.representable_values(E2M1)
mid = np.concatenate([(grid[1:] + grid[:-1]) / 2, [7.0, 100.0]]).astype(np.float32)
mid = np.concatenate([mid, -mid])
ours = np.asarray(jnp.clip(jnp.asarray(mid), -6, 6).astype(E2M1))
theirs = np.clip(mid, -6, 6).astype(ml_dtypes.float4_e2m1fn)
checks["E2M1 ties round to even (and saturate at 6)"] = bool((bits(ours) == bits(theirs)).all())

# A block worked by hand: amax 12 -> global = 12/2688; block scale = (12/6)/global = 448 (E4M3
# max, exact); element unit = 448 * global = 2, so x/2 = [0, .25, .5, ..., 6] rounds to E2M1
# with ties to even: .25 -> 0, .75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
hand_x = np.array([0, 0.5, 1, 1.5, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9, 10, 12], np.float32)
hand_q = np.array([0, 0, 0.5, 1, 1, 1, 1.5, 2, 2, 2, 3, 4, 4, 4, 4, 6], np.float32)
th = formats.nvfp4_quantize(jnp.asarray(hand_x), block=(1, 16))
checks["hand-computed block (scale 448, elements)"] = (
    float(th.block_scale[0]) == 448.0 and np.array_equal(np.asarray(th.q, np.float32), hand_q))
pd.Series(checks, name="passed").to_frame()

# %% [markdown]
# ## 3. Relative quantization error against magnitude
#
# **Left:** a whole tensor (standard normal values times a magnitude *m*) quantized at each *m*
# from 1e-10 to 1e10. Without scaling, a format works only inside its own range: below it
# values flush to zero (error 1), above it they saturate. With scaling (per tensor for FP8, per
# block for MXFP8 and NVFP4) the error is flat over all 20 decades: the scale absorbs the
# magnitude, and what remains is the mantissa's precision.
#
# **Right:** one tensor whose magnitude drifts smoothly over 20 decades along its length, so
# each block is locally uniform. A per-tensor scale serves the largest values only; small ones
# flush to zero. MXFP8's power-of-two (E8M0) block scales cover all 20 decades; NVFP4's E4M3
# block scales, relative to one FP32 tensor scale, cover about 448 / 2^-9 ≈ 2.3e5, a little
# over 5 decades below the tensor's maximum.

# %%
def rel_error(q, x):
    """Norm-wise relative error of each row."""
    q, x = np.asarray(q, np.float64), np.asarray(x, np.float64)
    return np.linalg.norm(q - x, axis=-1) / np.linalg.norm(x, axis=-1)


def unscaled(dtype):
    fmax = float(jnp.finfo(dtype).max)
    return lambda r: jnp.clip(r, -fmax, fmax).astype(dtype).astype(jnp.float32)


VARIANTS = {  # (format, scaling) -> quantize-dequantize of one row
    ("E4M3", "none"): unscaled(E4M3),
    ("E5M2", "none"): unscaled(E5M2),
    ("E2M1", "none"): unscaled(E2M1),
    ("E4M3", "per tensor"): lambda r: formats.fake_quantize(r, "e4m3"),
    ("E5M2", "per tensor"): lambda r: formats.fake_quantize(r, "e5m2"),
    ("MXFP8", "per block (32, E8M0)"): lambda r: formats.fake_quantize(r, "mxfp8"),
    ("NVFP4", "per block (16, E4M3) + FP32 tensor"): lambda r: formats.fake_quantize(r, "nvfp4"),
}

n_mag = 121  # 20 decades, 6 points per decade
n_per = max(int(P.get("n_samples", 20000)) // 8 // 32 * 32, 256)
mags = np.logspace(-10, 10, n_mag)
base = jax.random.normal(jax.random.key(1), (n_per,), jnp.float32)
X = (mags[:, None] * np.asarray(base)[None, :]).astype(np.float32)
rows = []
for (fmt, scaling), f in VARIANTS.items():
    err = rel_error(jax.jit(jax.vmap(f))(jnp.asarray(X)), X)
    rows += [{"format": fmt, "scaling": scaling, "magnitude": m, "rel_error": e}
             for m, e in zip(mags, err)]
df_tensor = pd.DataFrame(rows)

# One tensor over 20 decades: magnitude drifts along the last axis (blocks locally uniform).
n_drift = 32 * 40 * 16  # a multiple of both block sizes
drift = np.logspace(-10, 10, n_drift)
sign = np.where(np.asarray(jax.random.bernoulli(jax.random.key(2), 0.5, (n_drift,))), 1, -1)
jitter = 1 + 0.5 * np.asarray(jax.random.uniform(jax.random.key(3), (n_drift,)))
xd = (drift * sign * jitter).astype(np.float32)
ONE_TENSOR = [("E4M3", "per tensor"), ("E5M2", "per tensor"),
              ("MXFP8", "per block (32, E8M0)"), ("NVFP4", "per block (16, E4M3) + FP32 tensor")]
rows = []
for key in ONE_TENSOR:
    qd = np.asarray(VARIANTS[key](jnp.asarray(xd)), np.float64)
    e = np.abs(qd - xd) / np.abs(xd)
    # Median error per 1/4 decade of magnitude.
    bins = np.floor(np.log10(np.abs(xd)) * 4) / 4
    for b, g in pd.Series(e).groupby(bins):
        rows.append({"format": key[0], "scaling": key[1], "magnitude": 10 ** (b + 0.125),
                     "rel_error": float(np.median(g))})
df_drift = pd.DataFrame(rows)

# %%
palette = plotstyle.palette(["E4M3", "E5M2", "E2M1", "MXFP8", "NVFP4"])
dashes = {"none": (2, 2), "per tensor": "", "per block (32, E8M0)": "",
          "per block (16, E4M3) + FP32 tensor": ""}
fig, axes = plt.subplots(1, 2, figsize=(15, 5.2), sharey=True)
sns.lineplot(data=df_tensor, x="magnitude", y="rel_error", hue="format", style="scaling",
             palette=palette, dashes=dashes, ax=axes[0])
sns.lineplot(data=df_drift, x="magnitude", y="rel_error", hue="format", style="scaling",
             palette=palette, dashes=dashes, ax=axes[1], legend=False)
for ax in axes:
    ax.set(xscale="log", yscale="log", ylim=(1e-3, 3), xlabel="magnitude |x|")
axes[0].set(ylabel="relative error (|q - x| / |x|)",
            title="Whole tensor at magnitude m (norm-wise error)")
axes[1].set(title="One tensor spanning 20 decades (median error per element)")
handles, labels = axes[0].get_legend_handles_labels()
axes[0].get_legend().remove()
fig.legend(handles, labels, loc="center left", bbox_to_anchor=(1.0, 0.5), frameon=False)
nb.save(fig, "01_formats_error", COMPUTED)

# %% [markdown]
# The plateau levels are the formats' precision (the table below): with scaling, on normal
# data, the error follows the mantissa width, E4M3 (3 bits) below E5M2 (2 bits) below NVFP4 (1
# bit, but a fine 16-element scale). The flat right-hand MXFP8 curve and the NVFP4 cliff about
# five decades below the maximum are why NVFP4 needs a per-tensor FP32 scale on top of its
# block scales.

# %%
flat = (df_tensor[df_tensor.scaling != "none"].groupby(["format", "scaling"]).rel_error
        .agg(["min", "median", "max"]))
flat

# %% [markdown]
# ## Conclusion
#
# Filled in from the computed verdict:

# %%
# NVFP4 run natively: a non-emulated record from a chip with FP4 units (B1's ledger set: none
# until a Blackwell GPU records one)
lm = nb.ledger(nb.records("lm"), "B1")
fp4 = [h for h in (lm.hardware.unique() if len(lm) else [])
       if h in hardware.registry() and hardware.lookup(h).has_fp4]
native = bool(len(lm) and (lm.hardware.isin(fp4) & lm.recipe.str.contains("nvfp4")
                           & ~lm.emulated.astype(bool)).any())
b1 = registration.judged(verdicts.b1, "B1", checks, (mism_q, mism_s),
                        (int(t.q.size), int(t.block_scale.size)),
                        float(flat.loc[("NVFP4", "per block (16, E4M3) + FP32 tensor"), "median"]),
                        HW.slug, HW.has_fp4, native, records=lm)
nb.conclusion(b1)
