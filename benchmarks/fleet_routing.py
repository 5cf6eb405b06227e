"""Dynamo's KV router against its round-robin router, in front of two of our workers, on
a multi-tenant shared-prefix workload (driven by ``benchmarks/fleet_routing.sh``, which
runs this inside a private network namespace).

One frontend per mode (``--router-mode round-robin``, and ``--router-mode kv`` at each
``--router-kv-overlap-score-credit`` of ``--kv-overlap-credits``, modes ``kv@<credit>``)
shares the same two ``orchestrator dynamo-worker`` processes through file discovery;
rounds alternate the order of the modes. Each (round, mode) draws its own tenants' system
prompts, so what one run cached never helps the next; arrivals, tenant choices and
questions are the same for every mode within a round.

The workers' KV pool (``cache.num_blocks``) holds about two tenants' prefixes and the
running requests, so the four tenants' prefixes fit the fleet's cache but not one
worker's: the setting in which the choice of worker decides whether a prefix is reused.

Per mode, medians over rounds: prefix hit rate (the workers' own
``orchestrator_prompt_tokens_cached_total`` over ``orchestrator_prompt_tokens_total``,
differenced around the run; the responses' ``usage.prompt_tokens_details.cached_tokens``
where the frontend forwards it), TTFT p50/p99, output tok/s and goodput under the SLO
config's ``interactive`` targets. Then the simulator's routers (``prefix_aware`` and
``round_robin``) replay the same prompts for their predicted hit rates.

Every process this starts is stopped at the end, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import statistics
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from plugins.dynamo.local_fleet import FleetError, LocalFleet, model_listed, prompt_counters

ROOT = Path(__file__).resolve().parents[1]
ROUND_ROBIN = "round-robin"
# Words the tenants' system prompts are drawn from: plain English, a token or two each.
WORDS = (  # noqa: SIM905 (a word list reads better as prose)
    "archive ledger harbour river mountain lantern orchard quarry meadow bridge "
    "tower garden forest valley canal market station library museum theatre factory "
    "mill granary chapel castle island village county parish border compass survey "
    "atlas weather season harvest winter summer autumn spring copper silver timber "
    "marble linen wool salt grain barley wheat apple pear cherry plum walnut "
    "chestnut cedar willow birch maple falcon heron sparrow otter badger fox hare "
    "deer salmon trout captain pilot keeper warden clerk baker mason smith weaver "
    "potter tailor scholar"
).split()


@dataclass
class Outcome:
    """One request as the client saw it (times in seconds from the run's start)."""

    tenant: int
    sent: float
    ttft: float | None = None
    tpot: float | None = None
    end: float | None = None
    completion_tokens: int = 0
    prompt_tokens: int = 0
    cached_tokens: int | None = None
    error: str | None = None


@dataclass
class RunResult:
    mode: str
    round: int
    outcomes: list[Outcome]
    span_s: float
    prompt_tokens: list[float]  # per worker, from its metrics
    cached_tokens: list[float]
    predicted: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------- workload


@dataclass(frozen=True)
class Request:
    tenant: int
    at: float  # seconds after the run starts
    question: str


def tenant_prompts(seed: int, tenants: int, words: int) -> list[str]:
    """One system prompt per tenant, ``words`` words each, different per tenant and
    per seed."""
    prompts = []
    for t in range(tenants):
        rng = random.Random(f"prefix-{seed}-{t}")
        body = " ".join(rng.choice(WORDS) for _ in range(words))
        prompts.append(
            f"You are assistant {seed}-{t} of tenant {t}. Answer briefly, using the notes "
            f"below. Notes: {body}."
        )
    return prompts


def schedule(seed: int, count: int, rate: float, tenants: int) -> list[Request]:
    """Poisson arrivals at ``rate`` requests/s, each for a tenant drawn uniformly, with a
    short unique question."""
    rng = random.Random(f"arrivals-{seed}")
    t, out = 0.0, []
    for i in range(count):
        t += rng.expovariate(rate)
        a, b = rng.choice(WORDS), rng.choice(WORDS)
        out.append(
            Request(rng.randrange(tenants), t, f"Question {i}: how is the {a} like the {b}?")
        )
    return out


def messages(system: str, question: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": system}, {"role": "user", "content": question}]


def chat_token_ids(tokenizer: Any, system: str, question: str) -> list[int]:
    """The prompt's token ids as the model's chat template renders it (the frontend
    applies the same template)."""
    text = tokenizer.apply_chat_template(
        messages(system, question), tokenize=False, add_generation_prompt=True
    )
    return list(tokenizer.encode(text, add_special_tokens=False))


# ---------------------------------------------------------------- load


async def one_request(
    client: httpx.AsyncClient,
    url: str,
    model: str,
    body_messages: list[dict[str, str]],
    output_len: int,
    outcome: Outcome,
    t0: float,
    timeout_s: float,
) -> None:
    body = {
        "model": model,
        "messages": body_messages,
        "max_tokens": output_len,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    token_times: list[float] = []
    try:
        async with asyncio.timeout(timeout_s):
            async with client.stream("POST", url, json=body) as response:
                if response.status_code != 200:
                    outcome.error = (
                        f"HTTP {response.status_code}: {(await response.aread())[:200]!r}"
                    )
                    return
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        break
                    chunk = json.loads(data)
                    if "error" in chunk:
                        outcome.error = f"stream error: {str(chunk['error'])[:200]}"
                        return
                    for choice in chunk.get("choices") or ():
                        if (choice.get("delta") or {}).get("content"):
                            token_times.append(time.monotonic() - t0)
                    usage = chunk.get("usage")
                    if usage:
                        outcome.completion_tokens = usage.get("completion_tokens") or 0
                        outcome.prompt_tokens = usage.get("prompt_tokens") or 0
                        details = usage.get("prompt_tokens_details") or {}
                        if details.get("cached_tokens") is not None:
                            outcome.cached_tokens = int(details["cached_tokens"])
    except TimeoutError:
        outcome.error = f"no end within {timeout_s:g} s"
        return
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        outcome.error = f"{type(exc).__name__}: {exc}"
        return
    if not token_times:
        outcome.error = "no token arrived"
        return
    outcome.end = time.monotonic() - t0
    outcome.ttft = token_times[0] - outcome.sent
    n = max(outcome.completion_tokens, len(token_times))
    if n > 1:
        outcome.tpot = (token_times[-1] - token_times[0]) / (n - 1)
    outcome.completion_tokens = n


async def open_loop(
    port: int,
    model: str,
    requests: Sequence[Request],
    prompts: Sequence[str],
    output_len: int,
    request_timeout_s: float,
) -> tuple[list[Outcome], float]:
    """Send each request at its arrival time whatever the others are doing; the span
    is from the first send to the last end (s)."""
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    limits = httpx.Limits(max_connections=len(requests) + 4)
    outcomes = [Outcome(r.tenant, r.at) for r in requests]
    async with httpx.AsyncClient(timeout=request_timeout_s, limits=limits) as client:
        t0 = time.monotonic()
        tasks = []
        for r, o in zip(requests, outcomes, strict=True):
            delay = r.at - (time.monotonic() - t0)
            if delay > 0:
                await asyncio.sleep(delay)
            o.sent = time.monotonic() - t0
            body = messages(prompts[r.tenant], r.question)
            tasks.append(
                asyncio.create_task(
                    one_request(client, url, model, body, output_len, o, t0, request_timeout_s)
                )
            )
        await asyncio.gather(*tasks)
    ends = [o.end for o in outcomes if o.end is not None]
    first = min(o.sent for o in outcomes)
    return outcomes, (max(ends) - first) if ends else float("nan")


# ---------------------------------------------------------------- prediction


@dataclass
class SimLoad:
    """What the simulator's routers read of a replica (``orchestrator.sim.router.Load``)."""

    outstanding_tokens: int = 0
    num_waiting: int = 0
    num_running: int = 0
    kv_usage: float = 0.0


def predict_hit_rate(
    router_name: str,
    token_ids: Sequence[Sequence[int]],
    arrivals: Sequence[float],
    output_len: int,
    block_size: int,
    pool_blocks: int,
    service_s: float,
) -> float:
    """Cached prompt tokens over prompt tokens when the simulator's ``router_name``
    places these prompts on two replicas, each replica's cache an LRU of ``pool_blocks``
    blocks (the router's own prefix index, which remembers what it sent where). A
    request counts as outstanding on its replica for ``service_s`` after it arrives: the
    only load the routers see, since no CPU cost model times the steps."""
    from orchestrator.sim.router import PrefixAwareRouter, PrefixIndex, RoundRobinRouter

    prefix_router = PrefixAwareRouter(block_size=block_size, lru_capacity_per_replica=pool_blocks)
    router = prefix_router if router_name == "prefix_aware" else RoundRobinRouter()
    index = prefix_router.index if router_name == "prefix_aware" else PrefixIndex(pool_blocks)
    routed: list[tuple[float, int, int]] = []  # (arrival, replica, tokens)
    cached = total = 0
    for ids, at in zip(token_ids, arrivals, strict=True):
        loads = [SimLoad(), SimLoad()]
        for start, replica, tokens in routed:
            if at - start < service_s:
                loads[replica].outstanding_tokens += tokens
        hashes = prefix_router.block_hashes(ids)
        held = index.longest_prefixes(hashes)
        choice = router.choose(loads, ids)
        if router_name != "prefix_aware":
            index.add(hashes, choice)
        # The engine computes at least the prompt's last token.
        hit = min(held.get(choice, 0) * block_size, (len(ids) - 1) // block_size * block_size)
        cached += hit
        total += len(ids)
        routed.append((at, choice, len(ids) - hit + output_len))
    return cached / total if total else float("nan")


# ---------------------------------------------------------------- report


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def figures(run: RunResult, ttft_target_s: float, tpot_target_s: float) -> dict[str, float]:
    ok = [o for o in run.outcomes if o.error is None]
    prompt = sum(run.prompt_tokens)
    reported = [o.cached_tokens for o in ok if o.cached_tokens is not None]
    good = [
        o
        for o in ok
        if o.ttft is not None
        and o.ttft <= ttft_target_s
        and (o.tpot is None or o.tpot <= tpot_target_s)
    ]
    span = run.span_s
    return {
        "hit_rate": sum(run.cached_tokens) / prompt if prompt else float("nan"),
        "client_hit_rate": (
            sum(reported) / sum(o.prompt_tokens for o in ok) if reported else float("nan")
        ),
        "ttft_p50_ms": 1e3 * pct([o.ttft for o in ok if o.ttft is not None], 50),
        "ttft_p99_ms": 1e3 * pct([o.ttft for o in ok if o.ttft is not None], 99),
        "tpot_p50_ms": 1e3 * pct([o.tpot for o in ok if o.tpot is not None], 50),
        "output_tok_s": sum(o.completion_tokens for o in ok) / span if span > 0 else float("nan"),
        "goodput_req_s": len(good) / span if span > 0 else float("nan"),
        "goodput_frac": len(good) / len(run.outcomes),
        "errors": float(len(run.outcomes) - len(ok)),
        "worker_share": max(run.prompt_tokens) / prompt if prompt else float("nan"),
        **{f"pred_{k}": v for k, v in run.predicted.items()},
    }


def median_of(rows: Sequence[dict[str, float]], key: str) -> float:
    values = [r[key] for r in rows if r[key] == r[key]]  # drop NaN
    return statistics.median(values) if values else float("nan")


# ---------------------------------------------------------------- main


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--base-config", type=Path, default=ROOT / "configs/serve/smollm2-cpu.yaml")
    ap.add_argument("--slo-config", type=Path, default=ROOT / "configs/serve/smollm2-cpu-slo.yaml")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--requests", type=int, default=48, help="per mode per round")
    ap.add_argument("--rate", type=float, default=1.0, help="requests/s, Poisson")
    ap.add_argument("--tenants", type=int, default=4)
    ap.add_argument("--prefix-words", type=int, default=240, help="words per system prompt")
    ap.add_argument("--output-len", type=int, default=32, help="output tokens (EOS ignored)")
    ap.add_argument("--num-blocks", type=int, default=48, help="each worker's KV pool")
    ap.add_argument("--num-threads", type=int, default=1, help="executor threads per worker")
    ap.add_argument(
        "--kv-overlap-credits",
        type=float,
        nargs="+",
        default=[1.0, 2.0],
        help="one kv-router frontend per value of --router-kv-overlap-score-credit",
    )
    ap.add_argument("--first-frontend-port", type=int, default=8191)
    ap.add_argument("--system-ports", type=int, nargs=2, default=[9311, 9312])
    ap.add_argument("--start-timeout-s", type=float, default=300.0)
    ap.add_argument("--request-timeout-s", type=float, default=120.0)
    ap.add_argument("--run-timeout-s", type=float, default=300.0, help="one mode's run")
    ap.add_argument("--sim-service-s", type=float, default=2.0)
    args = ap.parse_args()

    # `timeout` and the script's trap send SIGTERM: end through `finally`.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load(args.base_config.read_text())
    config.setdefault("cache", {})["num_blocks"] = args.num_blocks
    config.setdefault("executor", {})["num_threads"] = args.num_threads
    worker_config = out / "worker.yaml"
    worker_config.write_text(yaml.safe_dump(config, sort_keys=False))
    model = config["model"]["name"]
    block_size = int(config["cache"].get("block_size", 16))
    slo = yaml.safe_load(args.slo_config.read_text())["scheduler"]["slo_classes"]["interactive"]
    ttft_target_s, tpot_target_s = slo["ttft_ms"] / 1e3, slo["tpot_ms"] / 1e3

    fleet = LocalFleet(out)
    credits = {kv_mode(c): c for c in args.kv_overlap_credits}
    modes = (ROUND_ROBIN, *credits)
    ports = {mode: args.first_frontend_port + i for i, mode in enumerate(modes)}
    results: list[RunResult] = []
    try:
        for i, port in enumerate(args.system_ports):
            fleet.start_worker(f"worker{i}", worker_config, port)
        for mode, port in ports.items():
            router = ["--router-mode", ROUND_ROBIN]
            if mode != ROUND_ROBIN:
                router = [
                    "--router-mode",
                    "kv",
                    "--router-kv-overlap-score-credit",
                    f"{credits[mode]:g}",
                ]
            fleet.start_frontend(f"frontend-{mode}", port, router)
        fleet.wait_until(
            lambda: (
                fleet.registered_workers() == 2
                and all(model_listed(p, model) for p in ports.values())
            ),
            "both workers to register with every frontend",
            args.start_timeout_s,
        )
        print(
            f"fleet up: workers on system ports {args.system_ports}, frontends {ports}",
            file=sys.stderr,
        )

        from orchestrator.common.model_source import load_tokenizer
        from orchestrator.core.config import ModelConfig

        tokenizer = load_tokenizer(ModelConfig(**config["model"]))

        # Warm-up (not reported): first-use costs in the workers and both frontends.
        for port in ports.values():
            warm = schedule(10_000, 4, 4.0, 2)
            asyncio.run(
                open_loop(
                    port, model, warm, tenant_prompts(10_000, 2, 20), 8, args.request_timeout_s
                )
            )

        for r in range(1, args.rounds + 1):
            order = modes if r % 2 else modes[::-1]
            requests = schedule(r, args.requests, args.rate, args.tenants)
            for m, mode in enumerate(order):
                fleet.check_alive(f"round {r}")
                prompts = tenant_prompts(100 * r + m, args.tenants, args.prefix_words)
                before = prompt_counters(args.system_ports)
                print(f"== round {r}: {mode}", file=sys.stderr)
                outcomes, span = asyncio.run(
                    asyncio.wait_for(
                        open_loop(
                            ports[mode], model, requests, prompts, args.output_len,
                            args.request_timeout_s,
                        ),
                        args.run_timeout_s,
                    )
                )  # fmt: skip
                time.sleep(1.0)  # the last request's counters
                after = prompt_counters(args.system_ports)
                run = RunResult(
                    mode,
                    r,
                    outcomes,
                    span,
                    [a[0] - b[0] for a, b in zip(after, before, strict=True)],
                    [a[1] - b[1] for a, b in zip(after, before, strict=True)],
                )
                ids = [chat_token_ids(tokenizer, prompts[q.tenant], q.question) for q in requests]
                for name in ("prefix_aware", "round_robin"):
                    run.predicted[name] = predict_hit_rate(
                        name, ids, [q.at for q in requests], args.output_len, block_size,
                        args.num_blocks, args.sim_service_s,
                    )  # fmt: skip
                results.append(run)
    except FleetError as err:
        sys.exit(str(err))
    finally:
        fleet.stop()

    rows = {
        mode: [figures(x, ttft_target_s, tpot_target_s) for x in results if x.mode == mode]
        for mode in modes
    }
    (out / "results.json").write_text(
        json.dumps({"rows": rows, "args": {k: str(v) for k, v in vars(args).items()}}, indent=1)
    )
    prompt_lens = [o.prompt_tokens for x in results for o in x.outcomes if o.prompt_tokens] or [0]
    print(
        f"Dynamo 1.6.1 frontend, round-robin vs kv router (one frontend per kv overlap "
        f"credit: {', '.join(credits)}); 2 workers ({model}, CPU, {args.num_threads} thread "
        f"each, KV pool {args.num_blocks} blocks x {block_size} tokens)"
    )
    print(
        f"workload: {args.tenants} tenants, system prompt + short question "
        f"({min(prompt_lens)}-{max(prompt_lens)} prompt tokens), {args.output_len} output tokens "
        f"(EOS ignored), Poisson {args.rate:g} req/s, {args.requests} requests per mode per round"
    )
    print(
        f"medians over {args.rounds} rounds, modes alternating; figures from a shared 2-core "
        f"machine (other work ran beside it; every mode saw it alike)"
    )
    print(
        f"goodput: requests with TTFT <= {ttft_target_s * 1e3:.0f} ms and TPOT <= "
        f"{tpot_target_s * 1e3:.0f} ms (interactive class of {args.slo_config.name}) per second"
    )
    report(rows, tuple(credits))
    return 0


def kv_mode(credit: float) -> str:
    """The name of the kv-router mode with overlap credit ``credit``."""
    return f"kv@{credit:g}"


REPORT_COLUMNS = (
    ("prefix hit", "hit_rate", "{:.3f}"),
    ("client hit", "client_hit_rate", "{:.3f}"),
    ("TTFT p50 ms", "ttft_p50_ms", "{:.0f}"),
    ("TTFT p99 ms", "ttft_p99_ms", "{:.0f}"),
    ("TPOT p50 ms", "tpot_p50_ms", "{:.1f}"),
    ("out tok/s", "output_tok_s", "{:.1f}"),
    ("goodput r/s", "goodput_req_s", "{:.3f}"),
    ("in SLO", "goodput_frac", "{:.0%}"),
    ("errors", "errors", "{:.0f}"),
    ("busier wkr", "worker_share", "{:.0%}"),
)


def report(rows: dict[str, list[dict[str, float]]], kv_modes: Sequence[str]) -> None:
    """The table of medians per mode, then each kv mode against round-robin (PASS/MISS
    against the targets: hit rate >= 1.5x, TTFT p50 lower) and against the simulator's
    routers replaying the same prompts."""
    med = {mode: {k: median_of(r, k) for k in r[0]} for mode, r in rows.items()}
    print(f"{'mode':12}" + "".join(f"{c[0]:>13}" for c in REPORT_COLUMNS))
    for mode in rows:
        cells = "".join(f"{fmt.format(med[mode][key]):>13}" for _, key, fmt in REPORT_COLUMNS)
        print(f"{mode:12}{cells}")
    print("per round (hit rate, TTFT p50 ms):")
    for mode in rows:
        cells = ", ".join(f"{x['hit_rate']:.3f} / {x['ttft_p50_ms']:.0f}" for x in rows[mode])
        print(f"  {mode:12} {cells}")
    rr = med[ROUND_ROBIN]
    predicted_rr = median_of(rows[ROUND_ROBIN], "pred_round_robin")
    for mode in kv_modes:
        kv = med[mode]
        hit_ratio = kv["hit_rate"] / rr["hit_rate"] if rr["hit_rate"] > 0 else float("inf")
        ttft_ratio = kv["ttft_p50_ms"] / rr["ttft_p50_ms"]
        print(f"{mode} / round-robin: prefix hit rate {hit_ratio:.2f}x (target >= 1.5x), "
              f"TTFT p50 {ttft_ratio:.2f}x (target < 1)")  # fmt: skip
        print(f"  {'PASS' if hit_ratio >= 1.5 else 'MISS'}: prefix hit rate >= 1.5x round-robin's")
        print(f"  {'PASS' if ttft_ratio < 1 else 'MISS'}: TTFT p50 lower than round-robin's")
        predicted = median_of(rows[mode], "pred_prefix_aware")
        print(
            f"  simulator (orchestrator/sim routers replaying the same prompts; no CPU cost "
            f"model, so hit rates only): prefix_aware predicted {predicted:.3f} vs measured "
            f"{kv['hit_rate']:.3f} ({kv['hit_rate'] - predicted:+.3f}); round_robin predicted "
            f"{predicted_rr:.3f} vs measured {rr['hit_rate']:.3f} "
            f"({rr['hit_rate'] - predicted_rr:+.3f}); predicted ratio "
            f"{predicted / predicted_rr if predicted_rr > 0 else float('inf'):.2f}x vs "
            f"measured {hit_ratio:.2f}x"
        )


if __name__ == "__main__":
    sys.exit(main())
