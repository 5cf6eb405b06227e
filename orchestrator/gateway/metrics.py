"""Prometheus metrics of the gateway, in a registry of its own (no global state).

Latencies come from ``orchestrator.common.metrics.RequestRecord``, so TTFT, TPOT, inter-token
latency and end-to-end latency mean here exactly what they mean in the simulator and the
benchmark client. Each engine request (one choice of an API request) is one record: its
arrival is when the API request reached the gateway, its token times are when each
step's tokens reached the serving layer. Latencies cover requests that finished with
``stop`` or ``length``. Engine gauges are read from the engine's stats at scrape time.

The queue and KV gauges are also exported under vLLM's names (``vllm:num_requests_waiting``,
``vllm:num_requests_running``, ``vllm:kv_cache_usage_perc``, labelled ``model_name`` as
vLLM's are), which an inference router such as llm-d's endpoint picker (Gateway API
Inference Extension) reads by default; ``kv_cache_usage_perc`` is a fraction in 0..1,
as vLLM's is despite its name. ``vllm:cache_config_info`` is vLLM's info gauge (always
1) whose ``block_size`` (tokens) and ``num_gpu_blocks`` (the KV pool, whatever the
device) labels tell the picker the pool's size, with ``enable_prefix_caching`` and
``engine`` (``"0"``: one engine per server) as vLLM labels them (``log_metrics_info``
in vLLM's ``vllm/v1/metrics/loggers.py``). No ``vllm:lora_requests_info`` is exported:
vLLM exports it only with LoRA enabled, and no adapters are served here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from orchestrator.common.engine_metrics import engine_metric_families, kv_cache_usage
from orchestrator.common.metrics import RequestRecord
from orchestrator.core import CacheConfig, EngineStats, FinishReason

PREFIX = "orchestrator"
VLLM_PREFIX = "vllm:"
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 0.75, 1, 2.5, 5, 10, 20, 40, 80)
TOKEN_BUCKETS = (0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.5, 1, 2.5, 5)
E2E_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 20, 40, 80, 160, 320, 640)


class _EngineCollector(Collector):
    """Gauges and the preemption counter, from the engine's latest stats; the router's
    gauges again under vLLM's names."""

    def __init__(
        self,
        stats: Callable[[], EngineStats | None],
        model_name: str,
        platform: Callable[[], tuple[tuple[str, str], ...]],
        cache: CacheConfig,
    ) -> None:
        self._stats = stats
        self._model_name = model_name
        self._platform = platform
        self._cache = cache

    def collect(self) -> Iterator[Metric]:
        labels = self._platform()
        if labels:
            info = GaugeMetricFamily(
                f"{PREFIX}_executor_info",
                "What the executor runs on and in (device, dtype, kernels, ...); always 1.",
                labels=[k for k, _ in labels],
            )
            info.add_metric([v for _, v in labels], 1.0)
            yield info
        stats = self._stats()
        if stats is None:  # the model is still loading
            return
        yield from engine_metric_families(stats, PREFIX)
        usage = kv_cache_usage(stats)
        vllm: dict[str, tuple[str, float]] = {
            "num_requests_waiting": ("Requests waiting for admission.", stats.num_waiting),
            "num_requests_running": ("Requests in the running batch.", stats.num_running),
            "kv_cache_usage_perc": ("Fraction of KV blocks in use (0..1).", usage),
        }
        for name, (doc, sample) in vllm.items():
            family = GaugeMetricFamily(f"{VLLM_PREFIX}{name}", doc, labels=["model_name"])
            family.add_metric([self._model_name], sample)
            yield family
        cache_labels = {
            "block_size": str(self._cache.block_size),
            "num_gpu_blocks": str(stats.kv_blocks_total),
            "enable_prefix_caching": str(self._cache.enable_prefix_caching),
            "engine": "0",
        }
        cache_info = GaugeMetricFamily(
            f"{VLLM_PREFIX}cache_config_info",
            "Information of the LLMEngine CacheConfig",
            labels=list(cache_labels),
        )
        cache_info.add_metric(list(cache_labels.values()), 1.0)
        yield cache_info


class GatewayMetrics:
    """The gateway's Prometheus metrics. ``stats`` returns the engine's latest stats, or
    ``None`` while no engine runs; ``model_name`` labels the vLLM-named gauges;
    ``platform`` returns the executor's ``info().platform`` labels (empty while none);
    ``cache`` (the config's) gives ``vllm:cache_config_info`` its block size and prefix
    caching flag (the engine checks the executor's block size against it)."""

    def __init__(
        self,
        stats: Callable[[], EngineStats | None],
        model_name: str,
        platform: Callable[[], tuple[tuple[str, str], ...]] = tuple,
        cache: CacheConfig | None = None,
    ) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.ttft = Histogram(
            f"{PREFIX}_time_to_first_token_seconds",
            "Arrival at the gateway to the first output token (TTFT).",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.tpot = Histogram(
            f"{PREFIX}_time_per_output_token_seconds",
            "(last token time - first token time) / (output tokens - 1), per request (TPOT).",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.itl = Histogram(
            f"{PREFIX}_inter_token_latency_seconds",
            "Gap between consecutive token arrivals of one request (ITL).",
            buckets=TOKEN_BUCKETS,
            registry=r,
        )
        self.queue_time = Histogram(
            f"{PREFIX}_queue_time_seconds",
            "Arrival at the gateway to first being scheduled.",
            buckets=TTFT_BUCKETS,
            registry=r,
        )
        self.e2e = Histogram(
            f"{PREFIX}_e2e_request_latency_seconds",
            "Arrival at the gateway to the last output token.",
            buckets=E2E_BUCKETS,
            registry=r,
        )
        self.requests = Counter(
            f"{PREFIX}_requests",
            "Engine requests (one per choice) that ended, by finish reason.",
            ["finish_reason"],
            registry=r,
        )
        for reason in FinishReason:
            self.requests.labels(finish_reason=reason.value)
        self.rejected = Counter(
            f"{PREFIX}_requests_rejected",
            "API requests rejected with 429 because the waiting queue was full.",
            registry=r,
        )
        self.prompt_tokens = Counter(
            f"{PREFIX}_prompt_tokens", "Prompt tokens of API requests (as in usage).", registry=r
        )
        self.generation_tokens = Counter(
            f"{PREFIX}_generation_tokens", "Output tokens generated (as in usage).", registry=r
        )
        r.register(_EngineCollector(stats, model_name, platform, cache or CacheConfig()))

    def observe_request(
        self, record: RequestRecord, finish_reason: FinishReason, queue_time_s: float | None
    ) -> None:
        """Count one ended engine request; latencies only for ``stop`` and ``length``."""
        self.requests.labels(finish_reason=finish_reason.value).inc()
        if queue_time_s is not None:
            self.queue_time.observe(queue_time_s)
        if finish_reason not in (FinishReason.STOP, FinishReason.LENGTH) or not record.ok:
            return
        for value, histogram in (
            (record.ttft, self.ttft),
            (record.tpot, self.tpot),
            (record.e2e, self.e2e),
        ):
            if value is not None:
                histogram.observe(value)
        for gap in record.itls:
            self.itl.observe(gap)

    def observe_usage(self, prompt_tokens: int, completion_tokens: int) -> None:
        self.prompt_tokens.inc(prompt_tokens)
        self.generation_tokens.inc(completion_tokens)

    def render(self) -> bytes:
        """The text exposition format."""
        return generate_latest(self.registry)
