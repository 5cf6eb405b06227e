"""Check that every TensorRT-LLM name the build pipeline relies on exists in the
installed release. Run it inside the NGC TensorRT-LLM container:

    python -m build_engines.check_trtllm_names [--examples-dir DIR]

It prints one line per check (``OK`` or ``MISSING``) and exits 1 when any is missing,
2 when TensorRT-LLM cannot be imported. The names are not listed by hand: they are
taken from the commands, option files and verification keys the pipeline itself
produces for representative specs, so a new flag is checked as soon as it is used.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import re
import subprocess
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, TextIO, get_args

from build_engines.commands import (
    Layout,
    Toolchain,
    build_argv,
    llm_api_options,
    quantize_argv,
)
from build_engines.spec import BuildSpec, CapacitySchedulerPolicy
from build_engines.verify import expected_engine_config
from orchestrator.common.name_checks import NameCheck, run_checks

ImportModule = Callable[[str], Any]
RunHelp = Callable[[list[str]], str]

LLM_ARGS_MODULE = "tensorrt_llm.llmapi.llm_args"
LLMAPI_MODULE = "tensorrt_llm.llmapi"
EXECUTOR_MODULE = "tensorrt_llm.bindings.executor"

# LLM-API option section -> its class in tensorrt_llm.llmapi.
SECTION_CLASSES = {
    "kv_cache_config": "KvCacheConfig",
    "scheduler_config": "SchedulerConfig",
    "cuda_graph_config": "CudaGraphConfig",
    "extended_runtime_perf_knob_config": "ExtendedRuntimePerfKnobConfig",
}

# What the engine-mode executor is configured through (tensorrt_llm.bindings.executor):
# the C++ names behind the engine backend's LLM-API options and the manifest.
EXECUTOR_BINDINGS = {
    "ExtendedRuntimePerfKnobConfig": ("cuda_graph_mode", "cuda_graph_cache_size"),
    "KvCacheConfig": ("free_gpu_memory_fraction", "enable_block_reuse"),
    "SchedulerConfig": ("capacity_scheduler_policy",),
    "ExecutorConfig": (
        "enable_chunked_context",
        "extended_runtime_perf_knob_config",
        "kv_cache_config",
        "scheduler_config",
        "max_batch_size",
        "max_num_tokens",
    ),
    "CapacitySchedulerPolicy": get_args(CapacitySchedulerPolicy),
}


def representative_specs() -> list[BuildSpec]:
    """An engine spec and PyTorch specs that between them use every flag and option key
    (the PyTorch ones with explicit CUDA graph batch sizes and with the default ones)."""
    common: dict[str, Any] = {
        "model": {"spec": "llama3-8b", "source": "org/model", "revision": "main"},
        "quantization": {"weights": "fp8", "kv_cache": "fp8"},
        "limits": {
            "max_batch_size": 8,
            "max_num_tokens": 256,
            "max_input_len": 128,
            "max_seq_len": 256,
        },
        "target": {"gpu": "h100-sxm"},
        "output_dir": "out",
    }
    engine = BuildSpec.model_validate(
        {**common, "name": "engine", "runtime": {"cuda_graph_cache_size": 8}}
    )
    pytorch = [
        BuildSpec.model_validate({**common, "name": "pytorch", "backend": "pytorch", "runtime": rt})
        for rt in ({"cuda_graph_batch_sizes": [1, 8], "cuda_graph_padding": True}, {})
    ]
    return [engine, *pytorch]


def _flags(argv: Sequence[str]) -> list[str]:
    return [a for a in argv if a.startswith("--")]


def _class(import_module: ImportModule, module: str, name: str) -> Any:
    return getattr(import_module(module), name)


def _has_name(cls: Any, name: str) -> bool:
    fields = getattr(cls, "model_fields", None)  # pydantic models
    if isinstance(fields, dict):
        return name in fields
    if dataclasses.is_dataclass(cls):
        return name in {f.name for f in dataclasses.fields(cls)}
    return hasattr(cls, name)  # pybind classes and enums expose members as attributes


def member_check(import_module: ImportModule, module: str, cls: str, name: str) -> NameCheck:
    def run() -> str | None:
        try:
            owner = _class(import_module, module, cls)
        except (ImportError, AttributeError) as err:
            return f"{module}.{cls} unavailable ({err})"
        return None if _has_name(owner, name) else f"{cls} has no {name!r}"

    return NameCheck(f"{module}.{cls}.{name}", run)


def flag_checks(run_help: RunHelp, command: list[str], flags: Sequence[str]) -> list[NameCheck]:
    """One check per flag, against one ``--help`` run of ``command``."""
    cache: dict[str, str] = {}

    def help_text() -> str:
        if "text" not in cache:
            cache["text"] = run_help(command)
        return cache["text"]

    def check(flag: str) -> NameCheck:
        pattern = re.compile(rf"(?<![\w-]){re.escape(flag)}(?![\w-])")

        def run() -> str | None:
            try:
                text = help_text()
            except (OSError, subprocess.SubprocessError) as err:
                return f"could not run {' '.join(command)} --help ({err})"
            return None if pattern.search(text) else "not in --help"

        return NameCheck(f"{Path(command[-1]).name} {flag}", run)

    return [check(flag) for flag in dict.fromkeys(flags)]


def build_checks(
    import_module: ImportModule, run_help: RunHelp, toolchain: Toolchain
) -> list[NameCheck]:
    """Every check, derived from what the pipeline produces for ``representative_specs``."""
    engine, *pytorch = representative_specs()
    layout = Layout(Path("out"))
    checks: list[NameCheck] = []

    quantize = [toolchain.python, str(toolchain.quantize_script)]
    q_flags = [f for s in (engine, *pytorch) for f in _flags(quantize_argv(s, layout, toolchain))]
    checks += flag_checks(run_help, quantize, q_flags)
    checks += flag_checks(
        run_help, [toolchain.trtllm_build], _flags(build_argv(engine, layout, toolchain))
    )

    for spec in (engine, *pytorch):
        args_class = "TrtLlmArgs" if spec.backend == "engine" else "TorchLlmArgs"
        for key, value in llm_api_options(spec).items():
            checks.append(member_check(import_module, LLM_ARGS_MODULE, args_class, key))
            if isinstance(value, dict):
                section = SECTION_CLASSES[key]
                checks += [member_check(import_module, LLMAPI_MODULE, section, k) for k in value]
    checks += [
        member_check(import_module, LLMAPI_MODULE, "CapacitySchedulerPolicy", policy)
        for policy in get_args(CapacitySchedulerPolicy)
    ]

    for cls, names in EXECUTOR_BINDINGS.items():
        checks += [member_check(import_module, EXECUTOR_MODULE, cls, n) for n in names]

    # Keys the verification reads from an engine's config.json.
    plugin_prefix, build_prefix = "build_config.plugin_config.", "build_config."
    for key in expected_engine_config(engine):
        if key.startswith(plugin_prefix):
            name = key.removeprefix(plugin_prefix)
            checks.append(member_check(import_module, "tensorrt_llm.plugin", "PluginConfig", name))
        elif key.startswith(build_prefix):
            name = key.removeprefix(build_prefix)
            checks.append(member_check(import_module, "tensorrt_llm.builder", "BuildConfig", name))
        elif key.startswith("pretrained_config.quantization."):
            name = key.rsplit(".", 1)[1]
            checks.append(
                member_check(
                    import_module, "tensorrt_llm.models.modeling_utils", "QuantConfig", name
                )
            )
    checks += [
        member_check(import_module, "tensorrt_llm.quantization", "QuantAlgo", algo)
        for algo in ("FP8", "INT8")
    ]
    checks += [
        member_check(import_module, "tensorrt_llm.bindings", "KVCacheType", kind)
        for kind in ("PAGED", "CONTINUOUS")
    ]
    return list({check.label: check for check in checks}.values())  # each name once


def _run_help(command: list[str]) -> str:
    done = subprocess.run(
        [*command, "--help"], capture_output=True, text=True, timeout=600, check=False
    )
    return done.stdout + done.stderr


def main(
    argv: Sequence[str] | None = None,
    *,
    import_module: ImportModule = importlib.import_module,
    run_help: RunHelp = _run_help,
    out: TextIO = sys.stdout,
) -> int:
    parser = argparse.ArgumentParser(
        description="Check the TensorRT-LLM names the build pipeline uses."
    )
    parser.add_argument("--examples-dir", help="TensorRT-LLM examples folder")
    args = parser.parse_args(argv)
    try:
        trtllm = import_module("tensorrt_llm")
    except ImportError as err:
        print(
            f"tensorrt_llm is not importable here ({err}); run this inside the NGC "
            "TensorRT-LLM container",
            file=out,
        )
        return 2
    version = str(getattr(trtllm, "__version__", "unknown"))
    note = "" if version.startswith("1.2") else " (the engine backend targets 1.2.x)"
    print(f"tensorrt_llm {version}{note}", file=out)
    toolchain = Toolchain.from_env(args.examples_dir)
    missing = run_checks(build_checks(import_module, run_help, toolchain), out)
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
