"""What the torch executor reads of the CPU and decides from it: features from CPUID, the
kernel variant and its override, the build cache's keys, and the dtype, matmul dtype and
weight format ``auto`` resolves to. Imports no torch."""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import pytest

from plugins.torch_executor import kernel_build
from plugins.torch_executor.cpu_features import CpuFeatures, cpu_model, detect
from plugins.torch_executor.precision import (
    resolve_dtype,
    resolve_kv_cache_dtype,
    resolve_matmul_dtype,
    resolve_weights,
)

AVX2 = CpuFeatures(avx2=True, fma=True, f16c=True)
AVX512 = CpuFeatures(
    avx2=True, fma=True, f16c=True, avx512f=True, avx512bw=True, avx512vl=True, avx512dq=True
)


def amx_features() -> CpuFeatures:
    return CpuFeatures(
        avx2=True, fma=True, f16c=True, avx512f=True, avx512bw=True, avx512vl=True,
        avx512dq=True, avx512_vnni=True, avx512_bf16=True, amx_tile=True, amx_bf16=True,
    )  # fmt: skip


def test_detected_features_are_consistent_with_torch() -> None:
    """torch's own CPUID reading (cpuinfo) agrees on the vector level."""
    torch = pytest.importorskip("torch")
    level = torch.backends.cpu.get_cpu_capability()
    f = detect()
    if level.startswith("AVX512"):
        assert f.x86_64_v4
    elif level == "AVX2":
        assert f.x86_64_v3 and not f.avx512f
    assert cpu_model()
    assert (f.amx_tile or f.amx_bf16) <= f.x86_64_v4  # no AMX CPU lacks AVX-512


def test_the_highest_runnable_variant_is_chosen() -> None:
    assert kernel_build.select_variant(amx_features(), "").name == "amx"
    assert kernel_build.select_variant(AVX512, "").name == "avx512"
    assert kernel_build.select_variant(AVX2, "").name == "avx2"
    assert kernel_build.select_variant(CpuFeatures(), "").name == "portable"
    assert [v.name for v in kernel_build.runnable(AVX2)] == ["avx2", "portable"]


def test_the_override_forces_a_lower_variant_and_refuses_a_higher_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(kernel_build.ISA_ENV, "avx2")
    assert kernel_build.select_variant(amx_features()).name == "avx2"
    assert kernel_build.effective(amx_features()) == AVX2  # dtype: auto sees an AVX2 CPU
    monkeypatch.setenv(kernel_build.ISA_ENV, "avx512")
    with pytest.raises(ValueError, match=r"ORCHESTRATOR_CPU_ISA=avx512 .* it runs: avx2, portable"):
        kernel_build.select_variant(AVX2)
    monkeypatch.setenv(kernel_build.ISA_ENV, "sse9")
    with pytest.raises(ValueError, match="one of: amx, avx512, avx2, portable"):
        kernel_build.select_variant(AVX2)


def test_a_forced_variant_caps_onednn_and_mkl_at_its_level_unless_the_user_set_a_cap(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(kernel_build.ONEDNN_ISA_ENV, raising=False)
    monkeypatch.delenv(kernel_build.MKL_ISA_ENV, raising=False)
    monkeypatch.delenv(kernel_build.ISA_ENV, raising=False)
    assert kernel_build.cap_libraries(amx_features()) is None  # nothing forced: no cap
    monkeypatch.setenv(kernel_build.ISA_ENV, "amx")
    assert kernel_build.cap_libraries(amx_features()) is None  # the top level: no cap
    assert kernel_build.MKL_ISA_ENV not in os.environ
    for variant, cap, mkl in (
        ("avx512", "AVX512_CORE", "AVX512"),
        ("avx2", "AVX2", "AVX2"),
        ("portable", "SSE41", "SSE4_2"),
    ):
        monkeypatch.delenv(kernel_build.ONEDNN_ISA_ENV, raising=False)
        monkeypatch.delenv(kernel_build.MKL_ISA_ENV, raising=False)
        monkeypatch.setenv(kernel_build.ISA_ENV, variant)
        assert kernel_build.cap_libraries(amx_features()) == cap
        assert os.environ[kernel_build.ONEDNN_ISA_ENV] == cap
        assert os.environ[kernel_build.MKL_ISA_ENV] == mkl
    monkeypatch.setenv(kernel_build.ONEDNN_ISA_ENV, "AVX2")
    monkeypatch.setenv(kernel_build.MKL_ISA_ENV, "AVX")
    monkeypatch.setenv(kernel_build.ISA_ENV, "avx512")
    assert kernel_build.cap_libraries(amx_features()) == "AVX2"  # the user's own caps stand
    assert os.environ[kernel_build.MKL_ISA_ENV] == "AVX"


def test_library_names_depend_on_sources_and_flags_not_on_the_cpu() -> None:
    names = {v.name: v.file_name for v in kernel_build.VARIANTS}
    assert len(set(names.values())) == len(names)
    assert all(n.startswith(f"cpu_kernels-{v}-") for v, n in names.items())
    # The same on every machine: nothing about this CPU goes into the digest.
    assert (
        kernel_build.variant_named("avx2").digest() == kernel_build.variant_named("avx2").digest()
    )


def test_a_prebuilt_library_is_found_without_building(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    variant = kernel_build.variant_named("portable")
    (tmp_path / variant.file_name).write_bytes(b"")
    monkeypatch.setenv(kernel_build.PREBUILT_ENV, str(tmp_path))
    monkeypatch.setenv("CXX", "false")  # any build would fail
    assert kernel_build.find(variant, tmp_path / "cache") == tmp_path / variant.file_name


def test_each_variant_builds_with_its_flags_where_a_compiler_is(tmp_path: Path) -> None:
    """Every variant compiles here (running it needs the features; building does not),
    so the image's build stage and a first start on any CPU can produce it."""
    if kernel_build.compiler() is None:
        pytest.skip("no C++ compiler here")
    for variant in kernel_build.VARIANTS:
        kernel_build.build(variant, tmp_path / variant.file_name)
        lib = ctypes.CDLL(str(tmp_path / variant.file_name))  # loading runs no vector code
        assert hasattr(lib, "linear_int8_f32") and hasattr(lib, "paged_attention_f32")
        assert hasattr(lib, "tile_linear_bf16") == variant.has_tiles


def test_auto_dtype_is_bfloat16_on_amx_and_float32_with_bfloat16_matmuls_where_native() -> None:
    avx512_bf16 = CpuFeatures(**{**_fields(AVX512), "avx512_bf16": True})
    assert resolve_dtype("auto", "cpu", amx_features())[0] == "bfloat16"
    assert resolve_dtype("auto", "cpu", avx512_bf16) == (
        "float32",
        "auto: native bfloat16 without AMX",
    )
    assert resolve_matmul_dtype("auto", "auto", "float32", "cpu", avx512_bf16)[0] == "bfloat16"
    assert resolve_dtype("auto", "cpu", AVX512)[0] == "float32"  # emulated in oneDNN: slow
    assert resolve_matmul_dtype("auto", "auto", "float32", "cpu", AVX512)[0] == "float32"
    assert resolve_dtype("auto", "cpu", AVX2) == (
        "float32",
        "auto: no native bfloat16 (avx2 fma f16c)",
    )
    assert resolve_dtype("auto", "cuda", CpuFeatures())[0] == "bfloat16"
    assert resolve_dtype("float32", "cpu", amx_features())[0] == "float32"


def test_matmul_dtype_auto_follows_dtype_auto_only() -> None:
    avx512_bf16 = CpuFeatures(**{**_fields(AVX512), "avx512_bf16": True})
    # A configured float32 model keeps float32 matmuls unless they are asked for.
    assert resolve_matmul_dtype("auto", "float32", "float32", "cpu", avx512_bf16) == (
        "float32",
        "auto: dtype float32 configured",
    )
    assert resolve_matmul_dtype("bfloat16", "float32", "float32", "cpu", avx512_bf16)[0] == (
        "bfloat16"
    )
    assert resolve_matmul_dtype("auto", "auto", "float32", "cuda", avx512_bf16)[0] == "float32"
    # A bfloat16 model's matmuls are bfloat16 whatever is asked.
    for asked in ("auto", "float32", "bfloat16"):
        assert resolve_matmul_dtype(asked, "auto", "bfloat16", "cpu", amx_features()) == (
            "bfloat16",
            "the model's dtype",
        )


def test_explicit_bfloat16_matmuls_where_onednn_cannot_run_them_name_the_features() -> None:
    with pytest.raises(ValueError, match=r"matmul_dtype bfloat16 needs .* features: avx2 fma f16c"):
        resolve_matmul_dtype("bfloat16", "float32", "float32", "cpu", AVX2)
    with pytest.raises(ValueError, match=r"got device cuda"):
        resolve_matmul_dtype("bfloat16", "float32", "float32", "cuda", AVX512)
    # oneDNN runs bfloat16 with AVX-512 BW/VL/DQ, natively or not.
    assert resolve_matmul_dtype("bfloat16", "float32", "float32", "cpu", AVX512)[0] == "bfloat16"


def test_explicit_bfloat16_on_a_cpu_without_it_names_the_missing_features() -> None:
    with pytest.raises(
        ValueError,
        match=r"needs a CPU with native bfloat16 .* this one has: avx2 fma f16c\. Use dtype: float32",
    ):
        resolve_dtype("bfloat16", "cpu", AVX2)
    assert resolve_dtype("bfloat16", "cpu", AVX512)[0] == "bfloat16"  # oneDNN can run it


def test_weight_formats() -> None:
    assert resolve_weights("auto", "float32", "cpu", kernels_loaded=True)[0] == "int8"
    assert resolve_weights("auto", "float32", "cpu", kernels_loaded=False)[0] == "dense"
    assert resolve_weights("auto", "bfloat16", "cpu", kernels_loaded=True)[0] == "dense"
    assert resolve_weights("auto", "bfloat16", "cuda", kernels_loaded=False)[0] == "dense"
    assert resolve_weights("bfloat16", "float32", "cpu", kernels_loaded=True)[0] == "bfloat16"
    # With bfloat16 matmuls (and KV cache) int8 weights fell under the accuracy bar.
    assert resolve_weights("auto", "float32", "cpu", True, "bfloat16")[0] == "bfloat16"
    assert resolve_weights("int8", "float32", "cpu", True, "bfloat16")[0] == "int8"
    with pytest.raises(ValueError, match="needs device cpu and dtype float32"):
        resolve_weights("int8", "bfloat16", "cpu", kernels_loaded=True)
    with pytest.raises(ValueError, match="needs the CPU kernels"):
        resolve_weights("int8", "float32", "cpu", kernels_loaded=False)


def test_kv_cache_dtype() -> None:
    # The float32 model over compact weights on kernels with F16C: float16.
    for kernels in ("avx2", "avx512", "amx"):
        assert resolve_kv_cache_dtype("auto", "float32", "float32", "int8", kernels) == (
            "float16",
            f"auto: compact weights on the {kernels} kernels",
        )
    assert resolve_kv_cache_dtype("auto", "float32", "float32", "int8", "portable")[0] == "float32"
    assert resolve_kv_cache_dtype("auto", "float32", "float32", "dense", "avx2")[0] == "float32"
    assert resolve_kv_cache_dtype("auto", "float32", "float32", "dense", "torch")[0] == "float32"
    # bfloat16 matmuls: the cache they already round K and V to.
    assert resolve_kv_cache_dtype("auto", "float32", "bfloat16", "bfloat16", "avx512")[0] == (
        "bfloat16"
    )
    assert resolve_kv_cache_dtype("float32", "float32", "bfloat16", "bfloat16", "avx512") == (
        "float32",
        "configured",
    )
    assert resolve_kv_cache_dtype("float16", "float32", "float32", "dense", "torch")[0] == (
        "float16"
    )
    assert resolve_kv_cache_dtype("auto", "bfloat16", "bfloat16", "dense", "amx")[0] == "bfloat16"
    with pytest.raises(ValueError, match="kv_cache_dtype float16 needs dtype float32"):
        resolve_kv_cache_dtype("float16", "bfloat16", "bfloat16", "dense", "amx")


def _fields(f: CpuFeatures) -> dict[str, bool]:
    return {name: getattr(f, name) for name in CpuFeatures.__slots__}
