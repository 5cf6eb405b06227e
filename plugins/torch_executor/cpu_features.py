"""What this CPU can execute, read from CPUID and XCR0, not from ``/proc/cpuinfo``.

``/proc/cpuinfo`` describes the host kernel's view: under ``qemu-x86_64 -cpu Haswell`` it
still lists the host's AVX-512 and AMX while the emulated CPU has neither, and a
container may run on a CPU other than the one it was built on. CPUID is what the
instructions themselves obey (it is what torch's cpuinfo and oneDNN read), so this module
runs CPUID and XGETBV directly: a few bytes of machine code placed in an executable page
and called through ``ctypes``. Elsewhere than x86-64 Linux (or where the page cannot be
made executable) no x86 feature is reported, which selects the portable kernels.

Imports no torch: the executor's config resolves ``dtype: auto`` with it.
"""

from __future__ import annotations

import ctypes
import functools
import mmap
import platform
from dataclasses import dataclass, fields

# cpuid(leaf=edi, subleaf=esi, out=rdx): push rbx; mov eax, edi; mov ecx, esi; mov r8, rdx;
# cpuid; mov [r8], eax; mov [r8+4], ebx; mov [r8+8], ecx; mov [r8+12], edx; pop rbx; ret
_CPUID = bytes.fromhex("5389f889f14989d00fa241890041895804418948084189500c5bc3")
# xgetbv(xcr=edi) -> rax: mov ecx, edi; xgetbv; shl rdx, 32; or rax, rdx; ret
_XGETBV = bytes.fromhex("89f90f01d048c1e2204809d0c3")


@dataclass(frozen=True, slots=True)
class CpuFeatures:
    """The instruction-set features the kernels and ``dtype: auto`` care about; each is
    true only where the CPU has it and the OS saves its register state."""

    avx2: bool = False
    fma: bool = False
    f16c: bool = False
    avx512f: bool = False
    avx512bw: bool = False
    avx512vl: bool = False
    avx512dq: bool = False
    avx512_vnni: bool = False
    avx512_bf16: bool = False
    avx_ne_convert: bool = False
    amx_tile: bool = False
    amx_bf16: bool = False

    @property
    def x86_64_v3(self) -> bool:
        """AVX2 with FMA and F16C: what the ``avx2`` kernels are compiled for."""
        return self.avx2 and self.fma and self.f16c

    @property
    def x86_64_v4(self) -> bool:
        """AVX-512 F/BW/VL/DQ (on top of v3): what the ``avx512`` kernels are compiled for."""
        return self.x86_64_v3 and self.avx512f and self.avx512bw and self.avx512vl and self.avx512dq

    @property
    def native_bfloat16(self) -> bool:
        """Whether bfloat16 arithmetic is native here (AMX-BF16, AVX512-BF16 or
        AVX-NE-CONVERT), so a bfloat16 model runs at least as fast as float32."""
        return self.amx_bf16 or self.avx512_bf16 or self.avx_ne_convert

    @property
    def onednn_bfloat16(self) -> bool:
        """Whether oneDNN's bfloat16 matmuls run here: it needs AVX-NE-CONVERT or AVX-512
        BW/VL/DQ (and raises from a private torch op otherwise)."""
        return self.avx_ne_convert or (self.avx512bw and self.avx512vl and self.avx512dq)

    def names(self) -> list[str]:
        """The features present, by their Linux names (``avx2``, ``amx_tile``, ...)."""
        return [f.name for f in fields(self) if getattr(self, f.name)]


def _bit(value: int, n: int) -> bool:
    return bool(value >> n & 1)


class _Machine:
    """CPUID and XGETBV as callables over executable pages (kept alive with the object)."""

    def __init__(self) -> None:
        self._pages = []
        self.cpuid = ctypes.CFUNCTYPE(None, ctypes.c_uint32, ctypes.c_uint32, ctypes.c_void_p)(
            self._load(_CPUID)
        )
        self.xgetbv = ctypes.CFUNCTYPE(ctypes.c_uint64, ctypes.c_uint32)(self._load(_XGETBV))

    def _load(self, code: bytes) -> int:
        # Written while writable, then made executable only (no page is both at once).
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE)
        page.write(code)
        address = ctypes.addressof(ctypes.c_char.from_buffer(page))
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        if libc.mprotect(address, mmap.PAGESIZE, mmap.PROT_READ | mmap.PROT_EXEC) != 0:
            raise OSError(ctypes.get_errno(), "mprotect refused an executable page")
        self._pages.append(page)
        return address

    def registers(self, leaf: int, subleaf: int = 0) -> tuple[int, int, int, int]:
        """``(eax, ebx, ecx, edx)`` of CPUID ``leaf``/``subleaf``."""
        out = (ctypes.c_uint32 * 4)()
        self.cpuid(leaf, subleaf, ctypes.addressof(out))
        return out[0], out[1], out[2], out[3]


def _read_x86() -> CpuFeatures:
    m = _Machine()
    max_leaf = m.registers(0)[0]
    _, _, ecx1, _ = m.registers(1)
    if not (_bit(ecx1, 27) and _bit(ecx1, 28)):  # OSXSAVE and AVX
        return CpuFeatures()
    xcr0 = m.xgetbv(0)
    ymm = xcr0 & 0x6 == 0x6  # the OS saves SSE and AVX state
    zmm = ymm and xcr0 & 0xE0 == 0xE0  # ... and opmask, ZMM_Hi256, Hi16_ZMM
    tiles = xcr0 & 0x60000 == 0x60000  # XTILECFG, XTILEDATA
    _, ebx7, ecx7, edx7 = m.registers(7, 0) if max_leaf >= 7 else (0, 0, 0, 0)
    eax71, _, _, edx71 = m.registers(7, 1) if max_leaf >= 7 else (0, 0, 0, 0)
    return CpuFeatures(
        avx2=ymm and _bit(ebx7, 5),
        fma=ymm and _bit(ecx1, 12),
        f16c=ymm and _bit(ecx1, 29),
        avx512f=zmm and _bit(ebx7, 16),
        avx512dq=zmm and _bit(ebx7, 17),
        avx512bw=zmm and _bit(ebx7, 30),
        avx512vl=zmm and _bit(ebx7, 31),
        avx512_vnni=zmm and _bit(ecx7, 11),
        avx512_bf16=zmm and _bit(eax71, 5),
        avx_ne_convert=ymm and _bit(edx71, 5),
        amx_tile=tiles and _bit(edx7, 24),
        amx_bf16=tiles and _bit(edx7, 22),
    )


@functools.cache
def detect() -> CpuFeatures:
    """This CPU's features (read once per process). No x86 feature off x86-64 Linux, or
    where an executable page cannot be had."""
    if platform.machine().lower() not in ("x86_64", "amd64") or platform.system() != "Linux":
        return CpuFeatures()
    try:
        return _read_x86()
    except (OSError, ValueError, AttributeError):
        return CpuFeatures()


def cpu_model() -> str:
    """The CPU's brand string from CPUID (leaves 0x80000002-4), or the platform's name."""
    if platform.machine().lower() in ("x86_64", "amd64") and platform.system() == "Linux":
        try:
            m = _Machine()
            if m.registers(0x80000000)[0] >= 0x80000004:
                words = [w for leaf in range(0x80000002, 0x80000005) for w in m.registers(leaf)]
                raw = b"".join(w.to_bytes(4, "little") for w in words)
                return raw.split(b"\0", 1)[0].decode(errors="replace").strip()
        except (OSError, ValueError, AttributeError):
            pass
    return platform.processor() or platform.machine()
