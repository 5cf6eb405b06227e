"""``TorchExecutor``: the ``Executor`` that runs a Llama model with our own paged-KV forward.

This module imports no torch at import time, so ``TorchExecutor.Config`` validates
config files on machines without it; the model code loads in ``from_config``.
"""

from __future__ import annotations

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
from plugins.torch_executor.config import DEFAULT_CACHE_DIR, TorchExecutorConfig

if TYPE_CHECKING:
    from orchestrator.core import EngineConfig
    from plugins.torch_executor.grammar import GrammarBackend, Matchers
    from plugins.torch_executor.runner import ModelRunner
    from plugins.torch_executor.weights import LlamaWeights

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
      projections are stored (``precision.resolve_weights``).
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
    ) -> None:
        """Serve ``weights`` (shared, never modified) with a fresh KV pool of
        ``num_blocks`` blocks of ``block_size`` tokens on the weights' device. ``seed``
        seeds the generator of sampled requests without a seed of their own (``None``:
        fresh entropy). ``grammar``: the constraint backend (``None``: none enforced)."""
        import torch

        from plugins.torch_executor import native
        from plugins.torch_executor.compact import WeightFormat
        from plugins.torch_executor.cpu_features import cpu_model, detect
        from plugins.torch_executor.kernel_build import ONEDNN_ISA_ENV
        from plugins.torch_executor.precision import resolve_weights
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
        rng = torch.Generator()
        if seed is None:
            rng.seed()
        else:
            rng.manual_seed(seed)
        self._num_blocks = num_blocks
        loaded = None
        device = weights.device.type
        if kernels == "auto" and device == "cpu" and native.supports(weights.dtype):
            loaded = native.load_kernels(kernel_dir or Path(DEFAULT_CACHE_DIR).expanduser())
        dtype = "bfloat16" if weights.dtype == torch.bfloat16 else "float32"
        fmt, why = resolve_weights(weights_format, dtype, device, loaded is not None)
        self.grammar = grammar
        matchers: Matchers | None = None
        if grammar is not None:
            from plugins.torch_executor.grammar import Matchers

            if grammar.vocab_size != args.vocab_size:
                raise ValueError(
                    f"the grammar tokenizer covers {grammar.vocab_size} ids, the model's "
                    f"logits {args.vocab_size}"
                )
            matchers = Matchers(args.vocab_size)
        self._runner: ModelRunner | None = ModelRunner(
            weights,
            num_blocks,
            block_size,
            self.max_model_len,
            rng,
            loaded,
            cuda_graphs,
            WeightFormat(fmt),
            matchers,
        )
        features = " ".join(detect().names()) if device == "cpu" else ""
        onednn_cap = os.environ.get(ONEDNN_ISA_ENV) if device == "cpu" else None
        runner = self._runner
        self.platform = (
            ("device", device),
            ("dtype", dtype),
            ("weights", fmt),
            *((("compact_max_rows", str(runner.compact_max_rows)),) if fmt != "dense" else ()),
            ("kernels", loaded.variant if loaded is not None else "torch"),
            ("cpu", cpu_model()),
            ("cpu_features", features or "none"),
            *((("onednn_max_isa", onednn_cap),) if onednn_cap else ()),
        )
        log.info(
            "torch executor: %s (weights %s)",
            ", ".join(f"{k} {v}" for k, v in self.platform),
            why,
        )
        if runner.row_bound is not None:
            log.info("torch executor: %s", runner.row_bound.describe())

    @classmethod
    def from_config(cls, config: Any, engine: EngineConfig) -> TorchExecutor:
        """Load the engine's model in ``config.dtype`` on ``config.device`` and size the KV
        pool from ``config.kv_cache_gib``."""
        import torch

        from plugins.torch_executor.cpu_features import detect
        from plugins.torch_executor.kernel_build import cap_onednn, effective
        from plugins.torch_executor.paged import PagedKVCache
        from plugins.torch_executor.precision import resolve_dtype
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
        onednn_cap = cap_onednn(detect())
        if onednn_cap is not None:
            log.info("torch executor: oneDNN capped at %s", onednn_cap)
        features = effective(detect())
        name, why = resolve_dtype(options.dtype, options.device, features)
        log.info("torch executor dtype %s (%s)", name, why)
        dtype = getattr(torch, name)
        weights = load_weights(engine.model, options.cache_path, dtype, options.device)
        block_size = engine.cache.block_size
        per_block = PagedKVCache.bytes_per_block(weights.args, block_size, dtype)
        num_blocks = options.kv_cache_bytes // per_block
        if num_blocks < 1:
            raise ValueError(
                f"kv_cache_gib={options.kv_cache_gib} holds no block of {block_size} tokens "
                f"({per_block} bytes each in {name})"
            )
        grammar = None
        if options.constraints:
            import importlib.util

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
            tokenizer = llg.load_tokenizer(
                text, weights.args.vocab_size, weights.args.eos_token_ids
            )
            grammar = llg.GrammarBackend(tokenizer)
        return cls(
            weights,
            block_size=block_size,
            num_blocks=num_blocks,
            max_model_len=engine.model.max_model_len,
            seed=options.seed,
            kernels=options.kernels,
            kernel_dir=options.cache_path,
            cuda_graphs=options.cuda_graphs,
            weights_format=options.weights,
            grammar=grammar,
        )

    @classmethod
    def describe(cls, config: Any, engine: EngineConfig) -> tuple[tuple[str, str], ...]:
        """What ``from_config`` would run on and in, without loading the model: the CPU,
        the features read from it, the kernel variant, the dtype and the weight format.
        Raises ``ValueError`` where ``from_config`` would refuse the options."""
        from plugins.torch_executor import kernel_build
        from plugins.torch_executor.cpu_features import cpu_model, detect
        from plugins.torch_executor.precision import resolve_dtype, resolve_weights

        options = cls.Config.model_validate(config or {})
        features = detect()
        variant = kernel_build.select_variant(features)
        dtype, why = resolve_dtype(options.dtype, options.device, kernel_build.effective(features))
        on_cpu = options.device == "cpu"
        kernels = variant.name if on_cpu and options.kernels == "auto" else "torch"
        fmt, fmt_why = resolve_weights(options.weights, dtype, options.device, kernels != "torch")
        return (
            ("cpu", cpu_model()),
            ("cpu_features", " ".join(features.names()) or "none"),
            ("isa_override", os.environ.get(kernel_build.ISA_ENV) or "none"),
            ("kernels", kernels),
            ("device", options.device),
            ("dtype", f"{dtype} ({why})"),
            ("weights", f"{fmt} ({fmt_why}; int8 needs the kernels to build or be prebuilt)"),
        )

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
