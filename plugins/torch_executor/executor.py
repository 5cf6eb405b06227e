"""``TorchExecutor``: the ``Executor`` that runs a Llama model with our own paged-KV forward.

This module imports no torch at import time, so ``TorchExecutor.Config`` validates
config files on machines without it; the model code loads in ``from_config``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Literal

from orchestrator.core import (
    ConstraintError,
    ConstraintKind,
    ConstraintSpec,
    ExecutorInfo,
    SchedulerOutput,
    StepResult,
)
from plugins.torch_executor import kernel_build
from plugins.torch_executor.config import DEFAULT_CACHE_DIR, TorchExecutorConfig
from plugins.torch_executor.cpu_features import detect
from plugins.torch_executor.kv_size import available_cpu_memory_bytes, kv_pool_size
from plugins.torch_executor.plan import (
    TORCH_OPS,
    CpuPlatform,
    ExecutorPlan,
    plan_options,
    resolve_plan,
)
from plugins.torch_executor.precision import Dtype

if TYPE_CHECKING:
    import torch

    from orchestrator.core import EngineConfig
    from plugins.torch_executor.grammar import GrammarBackend, Matchers
    from plugins.torch_executor.native import Kernels
    from plugins.torch_executor.runner import ModelRunner
    from plugins.torch_executor.weights import LlamaWeights, ModelArgs

log = logging.getLogger(__name__)

# What a grammar backend enforces (``grammar.KINDS``, named here without importing it).
KINDS = frozenset(ConstraintKind)


class TorchExecutor:
    """Runs each step's mixed batch (prefill chunks and decodes) in one forward pass.

    - ``info()``: the KV pool in blocks of ``block_size`` tokens, fixed at start; the
      longest sequence (prompt plus output, tokens) it runs: ``model.max_model_len`` from
      the engine config, else the model's ``max_position_embeddings``; the model's
      end-of-sequence ids (config and generation config).
    - Sampling is keyed by ``(seed, position)``, so the executor keeps no per-request
      state and ``finished_ids``/``preempted_ids`` need no handling.
    - ``StepResult.duration_s`` is the measured wall time of ``execute`` in seconds.
    - A plan entry the executor cannot run (a block outside the pool, positions past
      ``max_model_len``, a block table too short, token ids outside the vocabulary, no
      tokens) is reported in ``StepResult.failed`` with the reason; the rest of the plan
      runs as if it were absent.
    - The device is the weights'; on the CPU, ``kernels`` (``auto`` or ``torch``) picks
      the CPU kernels or torch ops (``native.py``), and their build is cached under
      ``kernel_dir`` (default: the default cache folder); ``weights`` picks how the
      projections are stored (``precision.resolve_weights``). The choices are made once,
      as the executor's ``plan`` (``plan.py``), which the rest reads.
    - ``info().platform`` names what runs: device, dtype, weight format (and, when
      compact, the most rows its projections take, measured at start), kernel variant,
      the CPU and the features read from it; it is logged at start.
    - With a ``grammar`` backend (``grammar.py``, llguidance) it enforces every
      ``ConstraintKind``: ``compile_constraint`` builds a request's matcher (on the
      engine's compile thread), the step masks constrained rows before sampling, and the
      matchers live from a request's first sample to its ``finished_ids``.
    """

    Config: ClassVar[type[TorchExecutorConfig]] = TorchExecutorConfig

    def __init__(
        self,
        weights: LlamaWeights,
        *,
        block_size: int,
        num_blocks: int,
        max_model_len: int | None = None,
        seed: int | None = None,
        kernels: Literal["auto", "torch"] = "auto",
        kernel_dir: Path | None = None,
        cuda_graphs: bool = True,
        weights_format: Literal["auto", "dense", "int8", "bfloat16"] = "dense",
        grammar: GrammarBackend | None = None,
        matmul_dtype: Literal["auto", "float32", "bfloat16"] = "float32",
        compact_max_rows: int | None = None,
        kv_cache_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto",
    ) -> None:
        """Serve ``weights`` (shared, never modified) with a fresh KV pool of
        ``num_blocks`` blocks of ``block_size`` tokens on the weights' device. ``seed``
        seeds the generator of sampled requests without a seed of their own (``None``:
        fresh entropy). ``grammar``: the constraint backend (``None``: none enforced).
        ``matmul_dtype``: what the float32 model's dense matmuls compute in
        (``precision.resolve_matmul_dtype``). ``compact_max_rows``: the most rows a step
        may have for compact weights (``None``: measured at start, ``row_bound.py``).
        ``kv_cache_dtype``: what the KV cache stores (``precision.resolve_kv_cache_dtype``)."""
        import torch

        from plugins.torch_executor.compact import WeightFormat
        from plugins.torch_executor.runner import ModelRunner

        args = weights.args
        limit = args.max_position_embeddings
        if max_model_len is not None and max_model_len > limit:
            raise ValueError(
                f"max_model_len {max_model_len} exceeds the model's max_position_embeddings {limit}"
            )
        self.max_model_len = max_model_len or limit
        self.block_size = block_size
        self.eos_token_ids = args.eos_token_ids
        self._num_blocks = num_blocks
        rng = _generator(seed)
        self.plan, loaded = _resolve(
            weights, kernels, weights_format, (matmul_dtype, kv_cache_dtype), kernel_dir
        )
        self.grammar = grammar
        matchers = _matchers(grammar, args.vocab_size)
        runner = ModelRunner(
            weights,
            num_blocks,
            block_size,
            self.max_model_len,
            rng,
            loaded,
            cuda_graphs,
            WeightFormat(self.plan.weights),
            matchers,
            compact_max_rows=compact_max_rows,
            matmul_dtype=getattr(torch, self.plan.matmul_dtype),
            kv_dtype=getattr(torch, self.plan.kv_cache_dtype),
        )
        self._runner: ModelRunner | None = runner
        self.platform = self.plan.platform(runner.compact_max_rows)
        log.info(
            "torch executor: %s (weights %s)",
            ", ".join(f"{k} {v}" for k, v in self.platform),
            self.plan.weights_why,
        )
        if runner.row_bound is not None:
            log.info("torch executor: %s", runner.row_bound.describe())
        if runner.attention_bound is not None:
            log.info("torch executor: %s", runner.attention_bound.describe())

    @classmethod
    def from_config(cls, config: Any, engine: EngineConfig) -> TorchExecutor:
        """Load the engine's model in ``config.dtype`` on ``config.device`` and size the KV
        pool from ``config.kv_cache_gib`` (``kv_size.kv_pool_size``)."""
        import torch

        from plugins.torch_executor.paged import PagedKVCache
        from plugins.torch_executor.weights import load_weights

        options = (
            config
            if isinstance(config, TorchExecutorConfig)
            else cls.Config.model_validate(config or {})
        )
        if options.num_threads is not None:
            torch.set_num_threads(options.num_threads)
        if options.device == "cuda" and not torch.cuda.is_available():
            raise ValueError("executor.device is cuda, but torch sees no CUDA device here")
        # Before the weights load: oneDNN reads its cap at its first kernel.
        onednn_cap = kernel_build.cap_libraries(detect())
        if onednn_cap is not None:
            mkl_cap = os.environ.get(kernel_build.MKL_ISA_ENV, "not capped")
            log.info("torch executor: oneDNN capped at %s, MKL at %s", onednn_cap, mkl_cap)
        # The choices as the config makes them on this CPU, the kernels assumed to load
        # (the executor resolves its plan again from what did load).
        planned = plan_options(options, CpuPlatform.read())
        log.info(
            "torch executor dtype %s (%s), matmuls %s (%s), KV cache %s (%s)",
            planned.dtype, planned.dtype_why, planned.matmul_dtype, planned.matmul_why,
            planned.kv_cache_dtype, planned.kv_cache_why,
        )  # fmt: skip
        dtype = getattr(torch, planned.dtype)
        kv_dtype = getattr(torch, planned.kv_cache_dtype)
        weights = load_weights(engine.model, options.cache_path, dtype, options.device)
        block_size = engine.cache.block_size
        if options.device == "cuda":
            available: int | None = torch.cuda.mem_get_info()[0]
        else:
            available = available_cpu_memory_bytes()
        pool = kv_pool_size(
            kv_cache_gib=options.kv_cache_size_gib,
            bytes_per_block=PagedKVCache.bytes_per_block(weights.args, block_size, kv_dtype),
            block_size=block_size,
            max_batch_size=engine.scheduler.max_batch_size,
            max_model_len=engine.model.max_model_len or weights.args.max_position_embeddings,
            available_bytes=available,
        )
        log.info("torch executor: KV pool %s", pool.reason)
        grammar = _grammar_backend(options, engine, weights.args) if options.constraints else None
        return cls(
            weights,
            block_size=block_size,
            num_blocks=pool.num_blocks,
            max_model_len=engine.model.max_model_len,
            seed=options.seed,
            kernels=options.kernels,
            kernel_dir=options.cache_path,
            cuda_graphs=options.cuda_graphs,
            weights_format=options.weights,
            grammar=grammar,
            matmul_dtype=planned.matmul_dtype,
            kv_cache_dtype=planned.kv_cache_dtype,
        )

    @classmethod
    def describe(cls, config: Any, engine: EngineConfig) -> tuple[tuple[str, str], ...]:
        """What ``from_config`` would run on and in, without loading the model: the CPU,
        the features read from it, the kernel variant, the dtype and the weight format.
        Raises ``ValueError`` where ``from_config`` would refuse the options."""
        options = cls.Config.model_validate(config or {})
        return plan_options(options, CpuPlatform.read()).describe()

    @property
    def runner(self) -> ModelRunner:
        """The model runner; raises once the executor is shut down."""
        if self._runner is None:
            raise RuntimeError("the torch executor is shut down")
        return self._runner

    def info(self) -> ExecutorInfo:
        return ExecutorInfo(
            num_kv_blocks=self._num_blocks,
            block_size=self.block_size,
            max_model_len=self.max_model_len,
            eos_token_ids=tuple(self.eos_token_ids),
            constraint_kinds=KINDS if self.grammar is not None else frozenset(),
            platform=self.platform,
        )

    def compile_constraint(self, spec: ConstraintSpec) -> object:
        """A fresh llguidance matcher for ``spec`` (``ConstraintError`` when it does not
        compile). Thread-safe; called on the engine's compile threads."""
        if self.grammar is None:
            raise ConstraintError("this executor enforces no constraints (constraints: false)")
        return self.grammar.compile(spec)

    def execute(self, plan: SchedulerOutput) -> StepResult:
        start = time.perf_counter()
        out = self.runner.execute(plan)
        return StepResult(
            sampled=out.sampled,
            duration_s=time.perf_counter() - start,
            logprobs=out.logprobs,
            failed=out.failed,
        )

    def shutdown(self) -> None:
        """Free the KV cache and weights; later ``execute`` calls raise ``RuntimeError``."""
        if self._runner is not None and self._runner.matchers is not None:
            self._runner.matchers.shutdown()
        self._runner = None


def _generator(seed: int | None) -> torch.Generator:
    """The generator of sampled requests without a seed of their own: seeded with
    ``seed``, or from fresh entropy for ``None``."""
    import torch

    rng = torch.Generator()
    if seed is None:
        rng.seed()
    else:
        rng.manual_seed(seed)
    return rng


def _resolve(
    weights: LlamaWeights,
    kernels: Literal["auto", "torch"],
    weights_format: str,
    dtypes: tuple[str, str],
    kernel_dir: Path | None,
) -> tuple[ExecutorPlan, Kernels | None]:
    """The plan ``weights`` run with, and the CPU kernels it runs (``None``: torch ops):
    with ``kernels: auto``, on the CPU, in a dtype they have a variant for, those that
    load (``native.load_kernels``, which falls back to a lower variant); the weight
    format, the matmuls' and the KV cache's dtypes as ``weights_format`` and ``dtypes``
    (matmuls, KV cache) ask where the model, the CPU and the kernels allow them."""
    import torch

    from plugins.torch_executor import native

    loaded = None
    device = weights.device.type
    if kernels == "auto" and device == "cpu" and native.supports(weights.dtype):
        loaded = native.load_kernels(kernel_dir or Path(DEFAULT_CACHE_DIR).expanduser())
    dtype: Dtype = "bfloat16" if weights.dtype == torch.bfloat16 else "float32"
    variant = loaded.variant if loaded is not None else TORCH_OPS
    plan = resolve_plan(
        device,
        (dtype, "the weights'"),
        variant,
        weights_format,
        (dtypes[0], dtype),
        CpuPlatform.read(),
        dtypes[1],
    )
    return plan, loaded


def _matchers(grammar: GrammarBackend | None, vocab_size: int) -> Matchers | None:
    """The constrained requests' grammar state over the model's ``vocab_size`` logits;
    ``None`` without a grammar backend. Raises ``ValueError`` when the grammar's
    tokenizer covers another vocabulary."""
    if grammar is None:
        return None
    from plugins.torch_executor.grammar import Matchers

    if grammar.vocab_size != vocab_size:
        raise ValueError(
            f"the grammar tokenizer covers {grammar.vocab_size} ids, the model's "
            f"logits {vocab_size}"
        )
    return Matchers(vocab_size)


def _grammar_backend(
    options: TorchExecutorConfig, engine: EngineConfig, args: ModelArgs
) -> GrammarBackend:
    """llguidance over the model's tokenizer, for ``constraints: true``; ``ValueError``
    naming the fix where llguidance is missing or the tokenizer cannot be read."""
    if importlib.util.find_spec("llguidance") is None:
        raise ValueError(
            "executor.constraints is true but llguidance is not installed: install "
            "the torch extra (llguidance>=1.9,<2) or set executor.constraints: false"
        )
    from plugins.torch_executor import grammar as llg

    try:
        text = llg.tokenizer_json(engine.model, options.cache_path)
    except (OSError, ValueError) as err:
        raise ValueError(
            f"executor.constraints is true but the model's tokenizer cannot be read "
            f"for llguidance ({err}); give the model a tokenizer.json or set "
            "executor.constraints: false"
        ) from err
    tokenizer = llg.load_tokenizer(text, args.vocab_size, args.eos_token_ids)
    return llg.GrammarBackend(tokenizer)
