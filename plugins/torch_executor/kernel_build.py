"""Building and finding the CPU kernels' shared libraries, one per ISA level.

The C++ sources live in ``csrc/``; each *variant* compiles them with explicit flags for
one level, so a build never depends on the machine that runs it (no ``-march=native``):

==========  ==================================================  =========================
variant     flags                                               runs where the CPU has
==========  ==================================================  =========================
amx         x86-64-v4, AVX512-VNNI, AVX512-BF16, AMX-TILE/BF16  all of those
avx512      x86-64-v4 (AVX-512 F/BW/VL/DQ)                      AVX-512 F/BW/VL/DQ
avx2        x86-64-v3 (AVX2, FMA, F16C)                         AVX2, FMA and F16C
portable    none (the compiler's baseline: SSE2, or NEON ...)   anything
==========  ==================================================  =========================

``select_variant`` picks the highest level the CPU runs (``cpu_features``, read from
CPUID); ``ORCHESTRATOR_CPU_ISA=amx|avx512|avx2|portable`` forces one, and asking for a
level this CPU cannot run is an error naming what it lacks. A forced level caps oneDNN's
and MKL's kernels at the same level (``cap_libraries``), so the whole process computes as
a CPU of that class would. Uncapped, on an AMX CPU oneDNN's AMX matmuls round a row
differently with the number of rows beside it, and a forced ``avx512`` run then answered
a prompt differently when its earlier blocks came from the prefix cache; and torch's
float32 ``addmm`` (MKL) ran AVX-512 under a forced ``avx2``, 1.5x the AVX2 rate on an
Intel Xeon.

A library's file name carries its variant and a digest of the sources and flags, never
of the CPU, so a build made on one machine (the container image's build stage, or a
native run before an emulated one) serves every machine with the features. ``find`` looks
in ``$ORCHESTRATOR_KERNELS_DIR`` (the image's prebuilt variants) first, then in the
cache folder, and builds into the cache on first use with the system C++ compiler.

``python -m plugins.torch_executor.kernel_build --out DIR [--variants a,b]`` builds
variants ahead of time (the Dockerfile's build stage does, for every x86 variant).
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from plugins.torch_executor.cpu_features import CpuFeatures

# Bump to force a rebuild when the calling convention changes without a source change.
ABI_VERSION = 2
SOURCE_DIR = Path(__file__).parent / "csrc"
HEADERS = ("vec.h", "ops.h", "stack.h", "tile_attention.h")
COMMON_FLAGS = ("-O3", "-fopenmp", "-shared", "-fPIC", "-std=c++17")
ISA_ENV = "ORCHESTRATOR_CPU_ISA"
PREBUILT_ENV = "ORCHESTRATOR_KERNELS_DIR"


@dataclass(frozen=True, slots=True)
class Variant:
    """One build of the kernels: its name, compiler flags, sources, and the CPU features
    it needs to run."""

    name: str
    flags: tuple[str, ...]
    sources: tuple[str, ...]
    runs_on: Callable[[CpuFeatures], bool]
    # The features the build may use; an override to this variant caps what the rest
    # of the executor (``dtype: auto``) assumes at these. ``None``: no cap.
    assumes: CpuFeatures | None
    # oneDNN's ``ONEDNN_MAX_CPU_ISA`` and MKL's ``MKL_ENABLE_INSTRUCTIONS`` for the same
    # level, set when the variant is forced; ``None``: no cap.
    onednn_isa: str | None
    mkl_isa: str | None
    has_tiles: bool = False  # it carries the AMX projections (tile_linear.cpp)

    def digest(self) -> str:
        """A digest of everything the library's code depends on: sources, headers, flags."""
        h = hashlib.sha256(f"{ABI_VERSION}\n{' '.join(COMMON_FLAGS + self.flags)}\n".encode())
        for name in (*self.sources, *HEADERS):
            h.update(name.encode() + b"\n" + (SOURCE_DIR / name).read_bytes())
        return h.hexdigest()[:16]

    @property
    def file_name(self) -> str:
        return f"cpu_kernels-{self.name}-{self.digest()}.so"


# Highest level first.
VARIANTS: tuple[Variant, ...] = (
    Variant(
        "amx",
        (
            "-march=x86-64-v4",
            "-mavx512vnni",
            "-mavx512bf16",
            "-mamx-tile",
            "-mamx-bf16",
            "-mprefer-vector-width=512",
        ),
        ("kernels.cpp", "stack.cpp", "tile_linear.cpp"),
        lambda f: f.x86_64_v4 and f.avx512_vnni and f.avx512_bf16 and f.amx_tile and f.amx_bf16,
        None,
        None,
        None,
        has_tiles=True,
    ),
    Variant(
        "avx512",
        ("-march=x86-64-v4", "-mprefer-vector-width=512"),
        ("kernels.cpp", "stack.cpp"),
        lambda f: f.x86_64_v4,
        CpuFeatures(
            avx2=True,
            fma=True,
            f16c=True,
            avx512f=True,
            avx512bw=True,
            avx512vl=True,
            avx512dq=True,
        ),
        "AVX512_CORE",
        "AVX512",
    ),
    Variant(
        "avx2",
        ("-march=x86-64-v3",),
        ("kernels.cpp", "stack.cpp"),
        lambda f: f.x86_64_v3,
        CpuFeatures(avx2=True, fma=True, f16c=True),
        "AVX2",
        "AVX2",
    ),
    Variant(
        "portable",
        (),
        ("kernels.cpp", "stack.cpp"),
        lambda f: True,
        CpuFeatures(),
        "SSE41",
        "SSE4_2",
    ),
)
VARIANT_NAMES = tuple(v.name for v in VARIANTS)


def variant_named(name: str) -> Variant:
    """The variant called ``name``; ``ValueError`` listing the names otherwise."""
    for v in VARIANTS:
        if v.name == name:
            return v
    raise ValueError(f"no CPU kernel variant {name!r} (one of: {', '.join(VARIANT_NAMES)})")


def runnable(features: CpuFeatures) -> list[Variant]:
    """The variants this CPU runs, highest level first (``portable`` always last)."""
    return [v for v in VARIANTS if v.runs_on(features)]


def select_variant(features: CpuFeatures, override: str | None = None) -> Variant:
    """The highest variant ``features`` run, or ``override`` (``$ORCHESTRATOR_CPU_ISA``
    when ``None``) if set; ``ValueError`` when the override names an unknown variant or
    one this CPU cannot run."""
    name = os.environ.get(ISA_ENV) if override is None else override
    if not name:
        return runnable(features)[0]
    chosen = variant_named(name.strip().lower())
    if not chosen.runs_on(features):
        can = ", ".join(v.name for v in runnable(features))
        raise ValueError(
            f"{ISA_ENV}={name} asks for kernels this CPU cannot run (its features: "
            f"{' '.join(features.names()) or 'none'}); it runs: {can}"
        )
    return chosen


def effective(features: CpuFeatures, override: str | None = None) -> CpuFeatures:
    """``features`` as the executor should assume them: capped at the overriding variant's
    level when ``$ORCHESTRATOR_CPU_ISA`` (or ``override``) is set, as they are otherwise.
    Raises as ``select_variant``."""
    name = os.environ.get(ISA_ENV) if override is None else override
    if not name:
        return features
    cap = select_variant(features, name).assumes
    if cap is None:
        return features
    return CpuFeatures(
        **{f: getattr(features, f) and getattr(cap, f) for f in CpuFeatures.__slots__}
    )


ONEDNN_ISA_ENV = "ONEDNN_MAX_CPU_ISA"
MKL_ISA_ENV = "MKL_ENABLE_INSTRUCTIONS"


def cap_libraries(features: CpuFeatures, override: str | None = None) -> str | None:
    """Cap oneDNN's and MKL's kernels at the forced variant's level
    (``$ORCHESTRATOR_CPU_ISA`` or ``override``) by setting ``$ONEDNN_MAX_CPU_ISA`` and
    ``$MKL_ENABLE_INSTRUCTIONS``, each unless the user set it; return oneDNN's cap in
    force (``None``: none). Both libraries read their variable once, at their first
    kernel, so this must run before the process's first matmul
    (``TorchExecutor.from_config`` calls it before loading weights); later calls change
    nothing in them."""
    name = os.environ.get(ISA_ENV) if override is None else override
    if name:
        variant = select_variant(features, name)
        for env, cap in ((ONEDNN_ISA_ENV, variant.onednn_isa), (MKL_ISA_ENV, variant.mkl_isa)):
            if cap is not None and env not in os.environ:
                os.environ[env] = cap
    return os.environ.get(ONEDNN_ISA_ENV)


def compiler() -> str | None:
    """The C++ compiler: ``$CXX``, else ``c++`` or ``g++`` on the PATH."""
    return os.environ.get("CXX") or shutil.which("c++") or shutil.which("g++")


def build(variant: Variant, target: Path) -> None:
    """Compile ``variant`` into ``target``: into a temporary file beside it, renamed into
    place, so a concurrent start never loads a half-written library. Raises ``OSError``
    without a compiler and ``subprocess.CalledProcessError`` when the build fails."""
    cxx = compiler()
    if cxx is None:
        raise OSError("no C++ compiler found (set CXX)")
    target.parent.mkdir(parents=True, exist_ok=True)
    sources = [str(SOURCE_DIR / s) for s in variant.sources]
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
        out = Path(tmp) / target.name
        subprocess.run(
            [cxx, *COMMON_FLAGS, *variant.flags, f"-I{SOURCE_DIR}", *sources, "-o", str(out)],
            check=True,
            capture_output=True,
            timeout=300,
        )
        os.replace(out, target)


_lock = threading.Lock()


def find(variant: Variant, cache_dir: Path) -> Path:
    """The library for ``variant``: prebuilt in ``$ORCHESTRATOR_KERNELS_DIR``, cached under
    ``<cache_dir>/torch_executor/kernels/``, or built there now (see ``build``)."""
    prebuilt = os.environ.get(PREBUILT_ENV)
    if prebuilt and (Path(prebuilt) / variant.file_name).exists():
        return Path(prebuilt) / variant.file_name
    path = cache_dir / "torch_executor" / "kernels" / variant.file_name
    with _lock:
        if not path.exists():
            build(variant, path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Build the torch executor's CPU kernels.")
    parser.add_argument("--out", type=Path, required=True, help="folder for the libraries")
    parser.add_argument(
        "--variants",
        default=",".join(VARIANT_NAMES),
        help=f"comma-separated, from {', '.join(VARIANT_NAMES)} (default: all)",
    )
    args = parser.parse_args(argv)
    for name in args.variants.split(","):
        variant = variant_named(name.strip())
        build(variant, args.out / variant.file_name)
        print(f"built {variant.name}: {args.out / variant.file_name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
