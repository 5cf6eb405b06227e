"""Continuous vs static batching on real tensors: the torch executor on the embedded
default model (SmolLM2-135M-Instruct), CPU.

One workload (64 requests, prompts of 100-400 tokens cut from real text, output lengths
log-normal with median 64 and sigma 1.0 clipped to [8, 256], EOS ignored so lengths are
exact, all arriving at t=0) runs three ways, one after the other in this process, on the
same weights and threads:

1. ``continuous``: our scheduler, iteration-level batching with chunked prefill;
2. ``static``: our scheduler in ``static`` mode with the same batch size;
3. ``hf-generate``: transformers ``generate`` in static left-padded batches of that size.

For float32 and bfloat16 it prints output tokens/s, TTFT and TPOT p50/p99, and batch
occupancy (mean running requests per step; for hf-generate, the rows per step that
still produce a wanted token). Then decode tokens/s at batch 1, 16 and 64 beside the
roofline of this machine (weight and KV bytes over measured memory bandwidth vs FLOPs
over the measured matmul rate), the paged/dense step time ratio at batch 64, and, last:

    continuous/static throughput: <X>x, continuous/hf-generate: <Y>x (float32)

Run: ``.venv/bin/python benchmarks/continuous_vs_static.py`` (about 15 minutes on 2
cores; ``--requests`` and ``--dtypes`` shorten it).
"""

from __future__ import annotations

import argparse
import math
import random
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from orchestrator.common.corpus import token_prompts
from orchestrator.common.metrics import RequestRecord, Summary, summarize
from orchestrator.common.model_source import load_tokenizer, resolve_source
from orchestrator.core import (
    CacheConfig,
    EngineConfig,
    EngineCore,
    ModelConfig,
    SamplingParams,
    SchedulerConfig,
    SchedulerOutput,
    Submission,
    WallClock,
    shape_plan,
)
from plugins.torch_executor import TorchExecutor
from plugins.torch_executor.config import DEFAULT_CACHE_DIR
from plugins.torch_executor.model import RotaryTable, compute_logits, forward_hidden
from plugins.torch_executor.paged import PagedKVCache
from plugins.torch_executor.weights import LlamaWeights, cached_gguf_folder, load_folder

BLOCK_SIZE = 16
OUTPUT_MEDIAN, OUTPUT_SIGMA, OUTPUT_MIN, OUTPUT_MAX = 64, 1.0, 8, 256
PROMPT_MIN, PROMPT_MAX = 100, 400
DECODE_BATCHES = (1, 16, 64)
DECODE_CONTEXT = 256  # tokens already cached when the decode step runs


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    output_lens: list[int]


@dataclass(frozen=True)
class RunResult:
    summary: Summary
    occupancy: float  # mean requests producing a wanted token per step
    steps: int  # forward passes (engine steps, or generate iterations)
    wall_s: float


def make_workload(encode: Callable[[str], list[int]], n: int, seed: int) -> Workload:
    rng = random.Random(seed)
    lengths = [rng.randint(PROMPT_MIN, PROMPT_MAX) for _ in range(n)]
    outputs = [
        min(
            OUTPUT_MAX,
            max(OUTPUT_MIN, round(rng.lognormvariate(math.log(OUTPUT_MEDIAN), OUTPUT_SIGMA))),
        )
        for _ in range(n)
    ]
    return Workload(token_prompts(encode, lengths, seed), outputs)


def run_engine(
    weights: LlamaWeights, workload: Workload, mode: str, batch_size: int, num_blocks: int
) -> RunResult:
    """All requests submitted at once; token times are the engine's step end times."""
    config = EngineConfig(
        scheduler=SchedulerConfig(batching=mode, max_batch_size=batch_size),
        # Prefix caching off: hf-generate has none, and overlapping text windows would
        # otherwise favour whichever mode happens to reuse more.
        cache=CacheConfig(block_size=BLOCK_SIZE, enable_prefix_caching=False),
        executor={"type": "torch"},
    )
    executor = TorchExecutor(weights, block_size=BLOCK_SIZE, num_blocks=num_blocks, seed=0)
    engine = EngineCore.from_config(config, executor=executor, clock=WallClock())
    t0 = engine.clock.now()
    for i, (prompt, n_out) in enumerate(zip(workload.prompts, workload.output_lens, strict=True)):
        params = SamplingParams(max_tokens=n_out, temperature=0)
        engine.add_request(Submission(f"r{i}", list(prompt), params, arrival_time=t0))
    times: dict[str, list[float]] = {f"r{i}": [] for i in range(len(workload.prompts))}
    occupancy = []
    while engine.has_work():
        step = engine.step()
        if step.plan.scheduled:
            occupancy.append(len(step.plan.scheduled))
        for out in step.outputs:
            times[out.request_id] += [step.start_time + step.duration_s] * len(out.new_token_ids)
    wall = engine.clock.now() - t0
    executor.shutdown()
    return _result(workload, t0, times, occupancy, wall)


def _result(
    workload: Workload, t0: float, times: dict[str, list[float]], occupancy: list[int], wall: float
) -> RunResult:
    records = [
        RequestRecord(rid, t0, tuple(ts), len(workload.prompts[i]), len(ts))
        for i, (rid, ts) in enumerate(times.items())
    ]
    for r, want in zip(records, workload.output_lens, strict=True):
        if r.num_output_tokens != want:
            raise RuntimeError(f"{r.request_id}: {r.num_output_tokens} tokens, wanted {want}")
    duration = max(r.token_times[-1] for r in records) - t0
    return RunResult(
        summarize(records, duration), statistics.fmean(occupancy), len(occupancy), wall
    )


def run_hf_generate(model: Any, workload: Workload, batch_size: int, pad_id: int) -> RunResult:
    """transformers ``generate`` over static batches in arrival order: each batch is
    left-padded and decodes until its longest request has all its tokens."""
    from transformers import StoppingCriteria, StoppingCriteriaList

    class StepClock(StoppingCriteria):
        """Records when each generated token of the batch became available."""

        def __init__(self) -> None:
            self.times: list[float] = []

        def __call__(
            self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs: Any
        ) -> torch.Tensor:
            self.times.append(time.monotonic())
            return torch.zeros(input_ids.shape[0], dtype=torch.bool)

    t0 = time.monotonic()
    times: dict[str, list[float]] = {}
    occupancy: list[int] = []
    n = len(workload.prompts)
    for start in range(0, n, batch_size):
        idx = list(range(start, min(start + batch_size, n)))
        width = max(len(workload.prompts[i]) for i in idx)
        ids = torch.full((len(idx), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(idx), width), dtype=torch.long)
        for row, i in enumerate(idx):
            p = workload.prompts[i]
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        lens = [workload.output_lens[i] for i in idx]
        clock = StepClock()
        with torch.inference_mode():
            model.generate(
                ids,
                attention_mask=mask,
                do_sample=False,
                max_new_tokens=max(lens),
                eos_token_id=None,
                pad_token_id=pad_id,
                stopping_criteria=StoppingCriteriaList([clock]),
            )
        for i, n_out in zip(idx, lens, strict=True):
            times[f"r{i}"] = clock.times[:n_out]
        occupancy += [sum(1 for n_out in lens if n_out > j) for j in range(max(lens))]
    return _result(workload, t0, times, occupancy, time.monotonic() - t0)


# ----------------------------------------------------------------- decode and roofline


def median_time(fn: Callable[[], object], repeats: int = 5) -> float:
    fn()  # warm-up: first-touch allocations and kernel selection
    samples = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def decode_plan(batch: int, context: int) -> SchedulerOutput:
    """One decode token per request at position ``context``, each request on blocks of
    its own (``shape_plan``). Cache contents do not change the step's cost."""
    return shape_plan([(1, context)] * batch, BLOCK_SIZE)


class DenseAttention:
    """Baseline for the paging cost: each layer's K/V for a batch of equal-length
    sequences in contiguous ``[kv_heads, batch, context + 1, head_dim]`` tensors, so
    attention reads them in place with no block gather and no mask."""

    def __init__(self, weights: LlamaWeights, batch: int, context: int) -> None:
        a = weights.args
        shape = (a.num_kv_heads, batch, context + 1, a.head_dim)
        self.k = [torch.zeros(shape, dtype=weights.dtype) for _ in range(a.num_layers)]
        self.v = [torch.zeros(shape, dtype=weights.dtype) for _ in range(a.num_layers)]
        self.args, self.context = a, context
        self.rope = RotaryTable(a, context + 1, weights.dtype)
        self.positions = torch.full((batch,), context, dtype=torch.long)

    def __call__(self, layer: int, qkv: torch.Tensor) -> torch.Tensor:
        a, batch = self.args, qkv.shape[0]
        nq, nkv = a.num_heads * a.head_dim, a.num_kv_heads * a.head_dim
        q = self.rope.apply(qkv[:, :nq].view(batch, a.num_heads, a.head_dim), self.positions)
        k = self.rope.apply(
            qkv[:, nq : nq + nkv].view(batch, a.num_kv_heads, a.head_dim), self.positions
        )
        v = qkv[:, nq + nkv :].view(batch, a.num_kv_heads, a.head_dim)
        self.k[layer][:, :, self.context] = k.transpose(0, 1)  # [kv_heads, batch, head_dim]
        self.v[layer][:, :, self.context] = v.transpose(0, 1)
        qg = (
            (q * a.head_dim**-0.5)
            .view(batch, a.num_kv_heads, a.group_size, a.head_dim)
            .transpose(0, 1)
        )
        scores = torch.matmul(qg, self.k[layer].transpose(-1, -2)).float()
        probs = torch.softmax(scores, dim=-1).to(q.dtype)
        o = torch.matmul(probs, self.v[layer])  # [kv_heads, batch, group, head_dim]
        return o.transpose(0, 1).reshape(batch, a.num_heads, a.head_dim)


def dense_step(weights: LlamaWeights, batch: int, context: int) -> Callable[[], object]:
    attention = DenseAttention(weights, batch, context)
    tokens = torch.full((batch,), 17, dtype=torch.long)

    def step() -> object:
        with torch.inference_mode():
            hidden = forward_hidden(weights, tokens, attention)
            return compute_logits(weights, hidden).argmax(-1).tolist()

    return step


@dataclass(frozen=True)
class Machine:
    bandwidth: float  # bytes/s, measured by a large copy (read + write)
    matmul_rate: dict[int, float]  # FLOP/s of the model's layer matmuls, by rows


def measure_machine(weights: LlamaWeights) -> Machine:
    src = torch.empty(2**28, dtype=torch.uint8).fill_(1)  # 256 MiB, far beyond cache
    dst = torch.empty_like(src)
    bandwidth = 2 * src.numel() / median_time(lambda: dst.copy_(src))
    layer = weights.layers[0]
    rates = {}
    for rows in DECODE_BATCHES:
        x = torch.randn(rows, weights.args.hidden_size, dtype=weights.dtype)
        y = torch.randn(rows, weights.args.intermediate_size, dtype=weights.dtype)
        flops = 2 * rows * sum(lin.out_features * lin.in_features for lin in layer.linears)

        def mm(x: torch.Tensor = x, y: torch.Tensor = y) -> None:
            # The executor's own kernels on one layer's weights, which stay in cache:
            # the compute roof, not a memory-bound figure.
            for _ in range(10):
                layer.qkv(x), layer.o(x), layer.gate_up(x), layer.down(y)

        rates[rows] = 10 * flops / median_time(mm)
    return Machine(bandwidth, rates)


def roofline_tok_s(
    weights: LlamaWeights, machine: Machine, batch: int, context: int
) -> tuple[float, str]:
    """Decode tokens/s if the step took only max(bytes / bandwidth, FLOPs / matmul rate)."""
    a = weights.args
    kv_bytes = PagedKVCache.bytes_per_block(a, 1, weights.dtype) * batch * (context + 1)
    linears = [lin for layer in weights.layers for lin in layer.linears] + [weights.lm_head]
    flops = 2 * batch * sum(lin.out_features * lin.in_features for lin in linears)
    flops += 4 * batch * (context + 1) * a.num_heads * a.head_dim * a.num_layers  # QK and PV
    t_mem = (weights.num_bytes + kv_bytes) / machine.bandwidth
    t_compute = flops / machine.matmul_rate[batch]
    bound = "memory" if t_mem >= t_compute else "compute"
    return batch / max(t_mem, t_compute), bound


def decode_report(name: str, weights: LlamaWeights) -> float:
    """Print decode tokens/s beside the roofline at each batch; return the paged/dense
    step time ratio at the largest batch (samples interleaved, so both see the same
    background load)."""
    machine = measure_machine(weights)
    executor = TorchExecutor(
        weights,
        block_size=BLOCK_SIZE,
        num_blocks=max(DECODE_BATCHES) * (DECODE_CONTEXT // BLOCK_SIZE + 1),
    )
    for batch in DECODE_BATCHES:
        plan = decode_plan(batch, DECODE_CONTEXT)
        t = median_time(lambda plan=plan: executor.execute(plan))
        roof, bound = roofline_tok_s(weights, machine, batch, DECODE_CONTEXT)
        print(
            f"{name:9} {batch:5} {batch / t:8.1f} {roof:9.1f} {bound:>8} {batch / t / roof:7.0%}"
            f"   {machine.bandwidth / 1e9:.1f} GB/s, matmul {machine.matmul_rate[batch] / 1e9:.0f} GFLOP/s",
            flush=True,
        )
    batch = max(DECODE_BATCHES)
    plan = decode_plan(batch, DECODE_CONTEXT)
    dense = dense_step(weights, batch, DECODE_CONTEXT)
    paged_times, dense_times = [], []
    for _ in range(7):
        paged_times.append(median_time(lambda: executor.execute(plan), repeats=1))
        dense_times.append(median_time(dense, repeats=1))
    executor.shutdown()
    return statistics.median(paged_times) / statistics.median(dense_times)


# ---------------------------------------------------------------------------- report


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1e3:9.0f}"


def print_row(dtype: str, mode: str, r: RunResult) -> None:
    s = r.summary
    print(
        f"{dtype:9} {mode:12} {s.output_throughput:8.1f} {fmt_ms(s.ttft.p[50])} {fmt_ms(s.ttft.p[99])}"
        f" {fmt_ms(s.tpot.p[50])} {fmt_ms(s.tpot.p[99])} {r.occupancy:9.1f} {r.steps:6} {r.wall_s:7.1f}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument(
        "--batch-size", type=int, default=16, help="max running requests (all modes)"
    )
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cache-dir", default=DEFAULT_CACHE_DIR)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM

    model_config = ModelConfig()
    folder = cached_gguf_folder(resolve_source(model_config), Path(args.cache_dir).expanduser())
    tokenizer = load_tokenizer(model_config)
    workload = make_workload(tokenizer.encode, args.requests, args.seed)
    total_out = sum(workload.output_lens)
    print(
        f"workload: {args.requests} requests at t=0, prompts {PROMPT_MIN}-{PROMPT_MAX} tokens "
        f"(mean {statistics.fmean(map(len, workload.prompts)):.0f}), outputs log-normal median "
        f"{OUTPUT_MEDIAN} sigma {OUTPUT_SIGMA} clipped [{OUTPUT_MIN}, {OUTPUT_MAX}] (mean "
        f"{total_out / args.requests:.0f}, {total_out} tokens), EOS ignored; batch size "
        f"{args.batch_size}, {args.threads} threads, torch {torch.__version__}"
    )
    print(
        f"{'dtype':9} {'mode':12} {'tok/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} {'TPOT p50':>9}"
        f" {'TPOT p99':>9} {'occupancy':>9} {'steps':>6} {'wall s':>7}   (latencies in ms)"
    )
    dtypes = args.dtypes.split(",")
    throughput: dict[tuple[str, str], float] = {}
    weights_by_dtype = {}
    for name in dtypes:
        dtype = getattr(torch, name)
        weights = load_folder(folder, dtype)
        weights_by_dtype[name] = weights
        longest = max(
            len(p) + n for p, n in zip(workload.prompts, workload.output_lens, strict=True)
        )
        num_blocks = args.batch_size * -(-longest // BLOCK_SIZE) + args.batch_size
        for mode in ("continuous", "static"):
            result = run_engine(weights, workload, mode, args.batch_size, num_blocks)
            throughput[name, mode] = result.summary.output_throughput
            print_row(name, mode, result)
        hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
        result = run_hf_generate(hf, workload, args.batch_size, tokenizer.pad_token_id or 0)
        throughput[name, "hf-generate"] = result.summary.output_throughput
        print_row(name, "hf-generate", result)
        del hf

    print(
        f"\ndecode step at context {DECODE_CONTEXT}: measured vs roofline (this machine, this run)"
    )
    print(
        f"{'dtype':9} {'batch':>5} {'tok/s':>8} {'roofline':>9} {'bound':>8} {'of roof':>8}   machine"
    )
    paging = {name: decode_report(name, weights) for name, weights in weights_by_dtype.items()}
    print(
        f"\npaged/dense decode step time at batch {max(DECODE_BATCHES)}: "
        + ", ".join(f"{ratio:.2f}x ({name})" for name, ratio in paging.items())
        + " (target < 1.5x)"
    )
    ref = "float32" if "float32" in dtypes else dtypes[0]
    x = throughput[ref, "continuous"] / throughput[ref, "static"]
    y = throughput[ref, "continuous"] / throughput[ref, "hf-generate"]
    print(f"continuous/static throughput: {x:.2f}x, continuous/hf-generate: {y:.2f}x ({ref})")


if __name__ == "__main__":
    main()
