"""What compiled programs compute their narrow products in, per platform, from stored HLO
texts (tests/data/hlo: post-optimization HLO of a GPU and of a TPU, both spellings of an
operand): compute emulated or native, weights read narrow or widened."""

from pathlib import Path

import pytest

from repro import hardware
from repro.precision import resolve
from repro.studies import lowering as L

HLO = Path(__file__).parent / "data" / "hlo"


def hlo(name: str) -> str:
    return (HLO / f"{name}.hlo").read_text()


# (file, fp8 lowering, int8 lowering, dequantization, weight storage), read as its platform
TPU = [
    ("tpu_int8_prefill", "no-f8", "s8-gemm", "fused", "native"),
    ("tpu_fp8_upcast_prefill", "upcast", "no-s8", "fused", "native"),
    ("tpu_int8_weight_only_decode", "no-f8", "s8-other", "fused", "native"),
    ("tpu_int8_weight_only_widened", "no-f8", "s8-other", "separate", "widened"),
    ("tpu_bf16_prefill", "no-f8", "no-s8", "none", "none"),
]
GPU = [
    ("gpu_fp8_cublaslt", "cublaslt-f8", "native"),
    ("gpu_int8_cublas", "no-f8", "native"),
    ("gpu_bf16_cublas", "no-f8", "none"),  # cuBLAS's s8 workspace is no narrow weight
]


@pytest.mark.parametrize("name,fp8,int8,dequant,storage", TPU)
def test_tpu_programs(name, fp8, int8, dequant, storage):
    text = hlo(name)
    assert L.fp8_lowering(text, "tpu") == fp8
    assert L.int8_lowering(text, "tpu") == int8
    assert L.dequant_lowering(text, "tpu") == dequant
    assert L.weight_storage(text) == storage


def test_tpu_products_read_inline_operand_types_and_tpu_layouts():
    assert L.products(hlo("tpu_int8_prefill")) == [("convolution", "s32", "s8", "s8")]
    assert L.products(hlo("tpu_fp8_upcast_prefill")) == [("convolution", "f32", "bf16", "bf16")]
    # the same product spelled without inline types, as a dot
    plain = ("%fused (p0: s8[128,512], p1: s8[512,256]) -> s32[128,256] {\n"
             "  %p0 = s8[128,512]{1,0} parameter(0)\n  %p1 = s8[512,256]{1,0} parameter(1)\n"
             "  ROOT %dot.1 = s32[128,256]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, "
             "rhs_contracting_dims={0}\n}\n")
    inline = plain.replace("dot(%p0, %p1)", "dot(s8[128,512]{1,0} %p0, s8[512,256]{1,0} %p1)")
    for text in (plain, inline):
        assert L.products(text) == [("dot", "s32", "s8", "s8")]
        assert L.int8_lowering_tpu(text) == "s8-gemm"
    # an s8 x s8 product with an s8 result is not the MXU's INT8 mode
    assert L.int8_lowering_tpu(inline.replace("ROOT %dot.1 = s32", "ROOT %dot.1 = s8")) \
        == "s8-other"


def test_tpu_f8_dot_is_fp8_arithmetic_only_on_a_chip_that_has_it():
    text = hlo("tpu_int8_prefill").replace("s8[", "f8e4m3fn[").replace("s32[", "f32[")
    assert L.fp8_lowering_tpu(text, has_fp8=True) == "f8-dot" and "f8-dot" in L.NATIVE_FP8
    assert L.fp8_lowering_tpu(text, has_fp8=False) == "upcast"
    for kind in ("TPU v5 lite", "TPU v5", "TPU v6 lite", "TPU v9 unknown"):
        with hardware.target("tpu", kind):  # none of these has FP8 arithmetic
            assert L.fp8_lowering(text) == L.fp8_lowering(text, "tpu") == "upcast"
    assert L.fp8_lowering(text, "tpu") == "upcast"  # read on this CPU: as the TPUs known


@pytest.mark.parametrize("name,fp8,storage", GPU)
def test_gpu_programs_read_as_before(name, fp8, storage):
    text = hlo(name)
    assert L.fp8_lowering(text, "gpu") == fp8
    assert L.weight_storage(text) == storage
    # the GPU (and CPU) readings are the functions the records have always used
    for platform in ("gpu", "cpu"):
        assert L.int8_lowering(text, platform) == L.int8_lowering_gpu(text)
        assert L.dequant_lowering(text, platform) == L.dequant_lowering_gpu(text)


def test_gpu_int8_gemm_call():
    assert L.int8_lowering(hlo("gpu_int8_cublas"), "gpu") == "s8-gemm"


def test_every_stored_program_read_on_gpu_unchanged():
    """On every stored text, the GPU reading is exactly the one before TPUs were read."""
    for path in sorted(HLO.glob("*.hlo")):
        text = path.read_text()
        assert L.fp8_lowering(text, "gpu") == L.fp8_lowering(text, "cpu")
        assert L.int8_lowering(text, "gpu") == L.int8_lowering_gpu(text)


def test_default_platform_is_this_process():
    text = ("%gemm (p0: f8e4m3fn[4,4], p1: f8e4m3fn[4,4]) -> bf16[4,4] {\n"
            "  %p0 = f8e4m3fn[4,4]{1,0} parameter(0)\n  %p1 = f8e4m3fn[4,4]{1,0} parameter(1)\n"
            "  ROOT %d = bf16[4,4]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}\n}\n")
    with hardware.target("tpu", "TPU v5 lite"):
        assert L.fp8_lowering(text) == "upcast"  # a v5e converts f8 to BF16
    with hardware.target("gpu", "NVIDIA H200"):
        assert L.fp8_lowering(text) == "fused-f8-dot"  # the GPU's reading of it
    assert L.fp8_lowering(hlo("tpu_fp8_upcast_prefill")) == "upcast"  # this CPU


# ------------------------------------------------------------------------ record labels


def test_tpu_speed_records_split_compute_from_storage():
    pytest.importorskip("qwix")
    from repro.experiments.inference import speed as S
    from repro.precision import export as X

    v5e, h200 = hardware.lookup("tpu-v5e"), hardware.lookup("h200")
    fmt = {n: X.resolve_format(n) for n in ("bf16", "int8", "fp8", "int8-w", "fp8-w",
                                            "nvfp4-w")}

    def label(name, program):
        text = hlo(program)
        low = S.lowering(fmt[name], text, "tpu")
        return S.speed_emulated(fmt[name], low, v5e), L.weight_storage(text)

    # INT8 weights and activations on the MXU: native compute, 1-byte weights
    assert label("int8", "tpu_int8_prefill") == (False, "native")
    # FP8 upcast to BF16: emulated compute, but the 1-byte weights are read (bandwidth)
    assert label("fp8", "tpu_fp8_upcast_prefill") == (True, "native")
    # weight-only: a BF16 GEMM by design (as on a GPU), the widening fused or not
    assert label("int8-w", "tpu_int8_weight_only_decode") == (False, "native")
    assert label("int8-w", "tpu_int8_weight_only_widened") == (False, "widened")
    assert S.speed_emulated(fmt["fp8-w"], "fused", v5e) is False
    assert S.speed_emulated(fmt["nvfp4-w"], "fused", v5e) is True
    assert S.speed_emulated(fmt["bf16"], "bf16", v5e) is False
    # an INT8 product that did not run s8 x s8 -> s32 is not the MXU's
    assert S.speed_emulated(fmt["int8"], "s8-other", v5e) is True
    # accuracy labels: INT8 has the TPU's matrix units, FP8 has not
    assert not S.quality_emulated(fmt["int8"], v5e) and S.quality_emulated(fmt["fp8"], v5e)
    # the GPU's labels as before
    assert not S.speed_emulated(fmt["int8"], "s8-gemm", h200)
    assert S.speed_emulated(fmt["fp8"], "upcast", h200)


def test_programs_a_tpu_v5e_compiled_are_read_as_its_matrix_unit_ran_them():
    """Texts a TPU v5e compiled (JAX 0.10.2): an s8 x s8 -> s32 product is the MXU's INT8
    mode; its optimized HLO keeps a dot of two f8 operands, but a v5e has no FP8 arithmetic
    (the registry's has_fp8): the compiler converts them, and the reading says "upcast"."""
    int8, fp8 = hlo("tpu_v5e_int8_dot_compiled"), hlo("tpu_v5e_fp8_dot_compiled")
    assert L.int8_lowering(int8, "tpu") == "s8-gemm"
    assert L.int8_lowering(fp8, "tpu") == "no-s8"
    assert any(a.startswith("f8") and b.startswith("f8") for _, _, a, b in L.products(fp8))
    with hardware.target("tpu", "TPU v5 lite"):
        assert L.fp8_lowering(fp8) == "upcast"
        assert L.fp8_lowering_tpu(fp8, has_fp8=True) == "f8-dot"


V5E, H200, CPU = (hardware.lookup(s) for s in ("tpu-v5e", "h200", "cpu"))


def _labels(recipe, text, platform, hw):
    """(lowering of the recipe's format, emulated) as a record of ``recipe`` says them."""
    kind = {"tpu": "TPU v5 lite", "gpu": "NVIDIA H200", "cpu": "cpu"}[platform]
    with hardware.target(platform, kind):
        facts = {"fp8_lowering": L.fp8_lowering(text),
                 "int8_lowering": L.int8_lowering(text)}
    low = L.narrow_lowering(resolve(recipe), facts)
    return low, L.recipe_emulated(recipe, facts, hw)


def test_record_labels_say_what_a_tpu_v5e_did():
    """fp8-delayed on a v5e: its f8 products were upcast, so emulated, and no label names
    FP8 arithmetic; fp8-auto there ran only BF16: not emulated, and its lowering says it
    ran no FP8; INT8 products s8 x s8 -> s32 ran natively."""
    fp8, int8 = hlo("tpu_v5e_fp8_dot_compiled"), hlo("tpu_v5e_int8_dot_compiled")
    bf16 = hlo("tpu_bf16_prefill")
    assert _labels("fp8-delayed", fp8, "tpu", V5E) == ("upcast", True)
    assert _labels("fp8-auto", bf16, "tpu", V5E) == ("no-f8", False)
    assert _labels("int8", int8, "tpu", V5E) == ("s8-gemm", False)
    assert _labels("int8-auto", bf16, "tpu", V5E) == ("no-s8", False)
    assert _labels("int8", hlo("tpu_int8_weight_only_decode"), "tpu", V5E) == ("s8-other", True)
    assert _labels("bf16", bf16, "tpu", V5E)[1] is False
    # the same INT8 program read on a device without INT8 matrix units: emulated
    assert _labels("int8", int8, "tpu", CPU) == ("s8-gemm", True)


def test_gpu_record_labels():
    assert _labels("fp8-delayed", hlo("gpu_fp8_cublaslt"), "gpu", H200) == ("cublaslt-f8", False)
    assert _labels("fp8-delayed", hlo("tpu_fp8_upcast_prefill"), "gpu", H200) == ("upcast", True)
    assert _labels("fp8-auto", hlo("gpu_bf16_cublas"), "gpu", H200) == ("no-f8", False)
    assert _labels("int8", hlo("gpu_int8_cublas"), "gpu", H200) == ("s8-gemm", False)
    assert _labels("fp8-delayed", hlo("gpu_fp8_cublaslt"), "gpu", CPU)[1] is True
    assert L.recipe_emulated("fp8-delayed", "cublaslt-f8", H200) is False
    assert L.recipe_emulated("nvfp4", "no-f8", H200) is True


@pytest.mark.parametrize("platform,kind,slug", [("tpu", "TPU v5 lite", "tpu-v5e"),
                                                ("gpu", "NVIDIA H200", "h200")])
def test_no_stored_program_reads_as_fp8_arithmetic_on_a_device_without_it(platform, kind,
                                                                          slug):
    """On every stored text: a lowering named native FP8 only where the device has FP8
    arithmetic, and a record of an FP8 recipe is emulated exactly where its lowering is
    neither native nor free of f8 values (never both native-named and emulated)."""
    hw = hardware.lookup(slug)
    texts = sorted(HLO.glob("*.hlo"))
    assert len(texts) >= 10
    for path in texts:
        text = path.read_text()
        with hardware.target(platform, kind):
            low = L.fp8_lowering(text)
        assert low not in L.NATIVE_FP8 or hw.has_fp8, (path.name, low)
        emulated = L.recipe_emulated("fp8-delayed", low, hw)
        assert emulated == (low not in L.NATIVE_FP8 and low != "no-f8"), (path.name, low)


def test_an_int8_program_with_widened_integer_products_is_partly_int8():
    """A training step whose weight-gradient GEMMs multiply s32 copies of the INT8 values
    (XLA:CPU does) ran only some of its INT8 products natively: "s8-partial", emulated."""
    native = ("%f (p0: s8[64,32], p1: s8[32,16]) -> s32[64,16] {\n"
              "  %p0 = s8[64,32]{1,0} parameter(0)\n  %p1 = s8[32,16]{1,0} parameter(1)\n"
              "  ROOT %d = s32[64,16]{1,0} dot(%p0, %p1), lhs_contracting_dims={1}, "
              "rhs_contracting_dims={0}\n}\n")
    widened = ("\n%g (q0: s32[64,32], q1: s32[64,16]) -> s32[32,16] {\n"
               "  %q0 = s32[64,32]{1,0} parameter(0)\n  %q1 = s32[64,16]{1,0} parameter(1)\n"
               "  ROOT %e = s32[32,16]{1,0} dot(%q0, %q1), lhs_contracting_dims={0}, "
               "rhs_contracting_dims={0}\n}\n")
    assert L.int8_products(native) == {"s8": 1, "widened": 0}
    assert L.int8_products(native + widened) == {"s8": 1, "widened": 1}
    for platform in ("tpu", "gpu", "cpu"):
        assert L.int8_lowering(native, platform) == "s8-gemm"
        assert L.int8_lowering(native + widened, platform) == "s8-partial"
    assert L.recipe_emulated("int8", "s8-partial", V5E) is True
    assert L.recipe_emulated("int8", "s8-gemm", V5E) is False
    for name in ("tpu_int8_prefill", "tpu_v5e_int8_dot_compiled", "gpu_int8_cublas"):
        assert L.int8_products(hlo(name))["widened"] == 0, name
