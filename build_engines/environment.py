"""What the build machine has: TensorRT-LLM, its tools, GPUs. Probed without importing
TensorRT-LLM or torch (both are heavy, and TensorRT-LLM is absent off the NGC image)."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import re
import shutil
import subprocess
from dataclasses import dataclass, field

from build_engines.commands import Toolchain
from build_engines.spec import BuildSpec
from orchestrator.common.build_manifest import Backend
from orchestrator.common.specs import GPUSpec

# TensorRT-LLM 1.3.0rc20 is the last release with the TensorRT engine backend; later ones
# run the PyTorch backend only (docs/source/legacy/tensorrt-backend-removal.md).
LAST_ENGINE_RELEASE = (1, 3, 0, 20)
_VERSION = re.compile(r"^(\d+)\.(\d+)\.(\d+)(?:rc(\d+))?")

# Distribution name -> manifest key.
_TOOLS = {
    "tensorrt_llm": "tensorrt_llm",
    "tensorrt": "tensorrt",
    "nvidia-modelopt": "modelopt",
    "huggingface-hub": "huggingface_hub",
    "trtllm-orchestrator": "build_engines",
}


@dataclass(frozen=True)
class Environment:
    """``has_tensorrt_llm``: the ``tensorrt_llm`` package is importable.
    ``trtllm_build``: path of the ``trtllm-build`` executable, if on PATH.
    ``quantize_script``: whether the toolchain's ``quantize.py`` exists.
    ``gpus``: names reported by ``nvidia-smi`` (empty without a GPU)."""

    has_tensorrt_llm: bool
    trtllm_build: str | None
    quantize_script: bool
    gpus: tuple[str, ...]
    tool_versions: dict[str, str | None] = field(default_factory=dict)

    @property
    def gpu_name(self) -> str | None:
        return self.gpus[0] if self.gpus else None

    def missing_for(self, spec: BuildSpec, gpu: GPUSpec, toolchain: Toolchain) -> list[str]:
        """What stops ``spec`` from building here, one human-readable item each."""
        missing = []
        version = self.tool_versions.get("tensorrt_llm")
        if not self.has_tensorrt_llm:
            missing.append("TensorRT-LLM (the tensorrt_llm Python package is not importable)")
        elif spec.backend == "engine" and version and has_engine_backend(version) is False:
            missing.append(
                f"TensorRT-LLM 1.2.x for backend: engine (the installed {version} has no "
                "engine backend; build with backend: pytorch)"
            )
        if spec.backend == "engine" and self.trtllm_build is None:
            missing.append(f"{toolchain.trtllm_build} (not on PATH)")
        if not self.quantize_script:
            missing.append(
                f"the TensorRT-LLM examples ({toolchain.quantize_script} not found; "
                "pass --examples-dir or set TRTLLM_EXAMPLES_DIR)"
            )
        if not self.gpus:
            missing.append("an NVIDIA GPU (nvidia-smi lists none)")
        elif not any(gpu_family(gpu.name) in name.upper() for name in self.gpus):
            missing.append(
                f"{gpu.name} GPUs: an engine runs only on the GPU architecture it is built "
                f"on, and this machine has {', '.join(self.gpus)}"
            )
        return missing


@dataclass(frozen=True)
class BackendChoice:
    """The backend a spec without ``backend:`` builds for, and why (printed with the
    plan)."""

    backend: Backend
    reason: str


def has_engine_backend(version: str) -> bool | None:
    """Whether TensorRT-LLM ``version`` (``1.2.1``, ``1.3.0rc20``, ...) has the TensorRT
    engine backend; ``None`` when the version cannot be read."""
    match = _VERSION.match(version)
    if match is None:
        return None
    major, minor, patch, rc = match.groups()
    # A final release sorts after all of its release candidates.
    key = (int(major), int(minor), int(patch), int(rc) if rc is not None else 1 << 30)
    return key <= LAST_ENGINE_RELEASE


def default_backend(trtllm_version: str | None) -> BackendChoice:
    """The backend the installed TensorRT-LLM supports: ``engine`` where it has the
    engine backend (and where none is installed: the project's container is 1.2.x),
    ``pytorch`` where it has not."""
    if trtllm_version is None:
        return BackendChoice(
            "engine", "TensorRT-LLM is not installed here; engine (TensorRT-LLM 1.2.x) assumed"
        )
    engine = has_engine_backend(trtllm_version)
    if engine is None:
        return BackendChoice(
            "engine", f"TensorRT-LLM version {trtllm_version!r} not understood; engine assumed"
        )
    if engine:
        return BackendChoice(
            "engine", f"the installed TensorRT-LLM {trtllm_version} has the engine backend"
        )
    return BackendChoice(
        "pytorch",
        f"the installed TensorRT-LLM {trtllm_version} has no engine backend "
        "(removed after 1.3.0rc20)",
    )


def installed_trtllm_version() -> str | None:
    """The installed TensorRT-LLM's version, read without importing it."""
    try:
        return importlib.metadata.version("tensorrt_llm")
    except importlib.metadata.PackageNotFoundError:
        return None


def gpu_family(spec_name: str) -> str:
    """``H100-SXM`` -> ``H100``: the part of a spec name that nvidia-smi also prints."""
    return spec_name.split("-")[0].upper()


def list_gpus() -> tuple[str, ...]:
    """GPU names from ``nvidia-smi``; empty when it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(line.strip() for line in out.splitlines() if line.strip())


def tool_versions() -> dict[str, str | None]:
    """Installed versions of the tools that shape an artefact (``None``: not installed)."""
    versions: dict[str, str | None] = {}
    for dist, key in _TOOLS.items():
        try:
            versions[key] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            versions[key] = None
    return versions


def probe(toolchain: Toolchain) -> Environment:
    """The real environment of this machine."""
    return Environment(
        has_tensorrt_llm=importlib.util.find_spec("tensorrt_llm") is not None,
        trtllm_build=shutil.which(toolchain.trtllm_build),
        quantize_script=toolchain.quantize_script.is_file(),
        gpus=list_gpus(),
        tool_versions=tool_versions(),
    )
