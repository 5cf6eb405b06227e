"""Soak test of the real server: ``orchestrator serve`` on the embedded model
(``configs/serve/smollm2-cpu.yaml``) on 127.0.0.1, under Poisson load at about 80% of its
capacity for a given time, with clients that disconnect mid-request and a few bad
requests mixed in.

Phases:

1. start the server and wait for ``/ready``;
2. touch the KV pool: distinct long prompts whose tokens add up to the pool's size, so
   its pages are resident before the first RSS reading and do not show as growth;
3. measure capacity: closed-loop clients sending the soak's request mix (without the
   bad and abandoned ones) for a while; capacity is requests completed per second
   within that window. Then fill the running batch to ``scheduler.max_batch_size``
   once, so the largest step's memory is in the RSS baseline too;
4. warm up: the soak's traffic in 30-second windows until the server's RSS grows by
   less than 1% a minute (at most ``--warmup-max-minutes``): the executor's caches keyed
   by step shape fill over the first few hundred requests; the RSS baseline is read
   after this, once the server is idle;
5. soak: Poisson arrivals at ``--load`` times that rate for ``--minutes``; about 8% of
   requests disconnect early (streams after a few chunks, whole responses by a short
   client timeout) and about 4% are bad (malformed JSON, a lone surrogate, an overflowing
   priority, a string for an integer, an unknown field, a prompt over the context...);
6. wait for the server to go idle, read ``/metrics`` and the process's RSS, stop it with
   SIGTERM.

A request is *lost* when it was sent and got neither a complete answer (a whole response
with every choice finished, or a stream ending in ``data: [DONE]`` with no error event)
nor a clear refusal (a 4xx; 429 counts as a refusal): a connection error, a timeout, a
truncated stream or a 5xx. Requests this script abandons on purpose are not lost; bad
requests must be refused with a 4xx, and one that is not counts as lost too. Losses and
5xx count the warm-up's requests as well; ``<N>`` is the soak phase's requests.

Prints the phases' figures and, last, exactly:

    soak <minutes> min: <N> requests, lost <L>, 5xx <S>, leaked blocks <B>, RSS growth <X>%

and exits 1 unless lost, 5xx and leaked blocks are 0 and RSS grew by less than 5%.

Run: ``.venv/bin/python benchmarks/soak.py --minutes 10`` (plus up to about ten minutes
of start-up, pool touching, capacity measurement and warm-up on two cores).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import random
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml

from orchestrator.common.corpus import corpus_text

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_CONFIG = ROOT / "configs" / "serve" / "smollm2-cpu.yaml"
READY_TIMEOUT_S = 600
REQUEST_TIMEOUT_S = 600  # one request's bound; on a loaded 2-core machine a queue is slow
MAX_IN_FLIGHT = 160  # concurrent soak requests at most (the server queues 256)
IDLE_TIMEOUT_S = 300
RSS_LIMIT_PCT = 5.0
DISCONNECT_SHARE = 0.08
BAD_SHARE = 0.04
# Warm-up ends once RSS grows by less than this per minute (%) over two windows: the
# executor's shape-keyed caches (oneDNN kernels for each step size) fill during the first
# few hundred requests, which is a plateau being reached, not a leak.
WARMUP_WINDOW_S = 30.0
SETTLED_PCT_PER_MIN = 1.0
TOUCH_PROMPT_WORDS = 600  # under 1500 tokens even for code: inside the 2048-token context


# ---------------------------------------------------------------------- the server


@dataclass
class Server:
    process: subprocess.Popen[bytes]
    base: str
    log: Path

    def rss_bytes(self) -> int:
        """Resident set size of the server process, from /proc (Linux)."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        raise RuntimeError("no VmRSS in /proc status")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def start_server(config: Path, workdir: Path) -> Server:
    port = free_port()
    log = workdir / "server.log"
    with log.open("wb") as out:
        serve = [sys.executable, "-m", "orchestrator.cli", "serve", "--config", str(config)]
        process = subprocess.Popen(
            [*serve, "--host", "127.0.0.1", "--port", str(port)],
            cwd=ROOT,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + READY_TIMEOUT_S
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the server exited with {process.returncode}; see {log}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{base}/ready", timeout=5).status_code == 200:
                return Server(process, base, log)
        time.sleep(0.5)
    process.kill()
    raise TimeoutError(f"the server was not ready after {READY_TIMEOUT_S} s")


def stop_server(server: Server) -> int:
    server.process.send_signal(signal.SIGTERM)
    try:
        return server.process.wait(timeout=120)
    except subprocess.TimeoutExpired:
        server.process.kill()
        return server.process.wait()


def scrape(base: str) -> dict[str, float]:
    """Unlabelled samples of ``/metrics`` by name."""
    samples: dict[str, float] = {}
    for line in httpx.get(f"{base}/metrics", timeout=30).text.splitlines():
        if line and not line.startswith("#") and "{" not in line:
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


# ---------------------------------------------------------------------- requests


class Words:
    """Text windows of the offline corpus, by word count."""

    def __init__(self, rng: random.Random) -> None:
        self.words = corpus_text().split()
        self.rng = rng

    def text(self, n: int) -> str:
        start = self.rng.randrange(0, len(self.words) - n)
        return " ".join(self.words[start : start + n])


@dataclass(frozen=True)
class Job:
    """One request to send. ``abandon_after``: close a stream after that many events;
    ``abandon_timeout_s``: give up on a whole response after that long. ``bad``: it must
    be refused with a 4xx."""

    path: str
    body: dict[str, Any] | bytes
    stream: bool
    headers: dict[str, str] = field(default_factory=dict)
    abandon_after: int | None = None
    abandon_timeout_s: float | None = None
    bad: bool = False


def good_job(words: Words, model: str) -> Job:
    rng = words.rng
    stream = rng.random() < 0.6
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": rng.randint(8, 48),
        "temperature": rng.choice([0.0, 0.7, 1.0]),
        "stream": stream,
    }
    if rng.random() < 0.3:
        common["seed"] = rng.randrange(2**31)
    if rng.random() < 0.2:
        common["priority"] = rng.randint(-5, 5)
    if stream and rng.random() < 0.5:
        common["stream_options"] = {"include_usage": True}
    if rng.random() < 0.1:
        common["n"] = 2
    if rng.random() < 0.5:
        body = {**common, "prompt": words.text(rng.randint(12, 150))}
        if rng.random() < 0.2:
            body["logprobs"] = 2
        if rng.random() < 0.2:
            body["ignore_eos"] = True
        return Job("/v1/completions", body, stream)
    messages = [{"role": "user", "content": words.text(rng.randint(12, 150))}]
    if rng.random() < 0.3:
        messages.insert(0, {"role": "system", "content": "Answer briefly."})
    body = {**common, "messages": messages}
    if rng.random() < 0.2:
        body["stop"] = ["\n\n"]
    return Job("/v1/chat/completions", body, stream)


def bad_job(words: Words, model: str) -> Job:
    """A request the API must refuse with a 4xx."""
    prompt = words.text(20)
    kinds: list[Job] = [
        Job("/v1/completions", b'{"prompt": "unterminated', False, bad=True),
        Job("/v1/completions", b'{"prompt": "half a pair \\ud800 here"}', False, bad=True),
        Job("/v1/completions", {"prompt": prompt, "priority": 10**30}, False, bad=True),
        Job(
            "/v1/completions",
            {"prompt": prompt},
            False,
            headers={"X-Priority": str(10**30)},
            bad=True,
        ),
        Job("/v1/completions", {"prompt": prompt, "max_tokens": "8"}, False, bad=True),
        Job("/v1/completions", {"prompt": prompt, "temperatur": 1}, False, bad=True),
        Job("/v1/completions", {"prompt": prompt, "max_tokens": 100_000}, False, bad=True),
        Job("/v1/completions", {"prompt": prompt, "model": "gpt-9"}, False, bad=True),
        Job(
            "/v1/chat/completions",
            {"model": model, "messages": [{"role": "user", "content": "x"}], "top_logprobs": 3},
            False,
            bad=True,
        ),
        Job("/v1/chat/completions", b"\xff\xfe not utf-8", False, bad=True),
    ]
    return words.rng.choice(kinds)


def soak_job(words: Words, model: str) -> Job:
    rng = words.rng
    roll = rng.random()
    if roll < BAD_SHARE:
        return bad_job(words, model)
    job = good_job(words, model)
    if roll < BAD_SHARE + DISCONNECT_SHARE:
        if job.stream:
            return Job(job.path, job.body, True, abandon_after=rng.randint(1, 4))
        return Job(job.path, job.body, False, abandon_timeout_s=rng.uniform(0.2, 3.0))
    return job


@dataclass
class Tally:
    """Outcomes by kind."""

    outcomes: Counter[str] = field(default_factory=Counter)
    statuses: Counter[int] = field(default_factory=Counter)
    examples: dict[str, str] = field(default_factory=dict)

    def add(self, outcome: str, status: int | None, note: str = "") -> None:
        self.outcomes[outcome] += 1
        if status is not None:
            self.statuses[status] += 1
        if note and outcome not in self.examples:
            self.examples[outcome] = note[:300]

    def merge(self, other: Tally) -> None:
        self.outcomes.update(other.outcomes)
        self.statuses.update(other.statuses)
        for outcome, note in other.examples.items():
            self.examples.setdefault(outcome, note)

    @property
    def lost(self) -> int:
        return sum(v for k, v in self.outcomes.items() if k.startswith("lost"))

    @property
    def server_errors(self) -> int:
        return (
            sum(v for k, v in self.statuses.items() if k >= 500) + self.outcomes["lost: 5xx event"]
        )


async def send(http: httpx.AsyncClient, job: Job, tally: Tally) -> None:
    kwargs: dict[str, Any] = {"headers": job.headers}
    if isinstance(job.body, bytes):
        kwargs["content"] = job.body
        kwargs["headers"] = {**job.headers, "content-type": "application/json"}
    else:
        kwargs["json"] = job.body
    try:
        if job.stream:
            await send_stream(http, job, kwargs, tally)
        else:
            timeout = job.abandon_timeout_s or REQUEST_TIMEOUT_S
            try:
                r = await http.post(job.path, timeout=timeout, **kwargs)
            except httpx.TimeoutException:
                if job.abandon_timeout_s is not None:
                    tally.add("abandoned", None)
                    return
                raise
            judge_whole(job, r, tally)
    except httpx.HTTPError as err:
        tally.add("lost: transport", None, f"{type(err).__name__}: {err}")


def judge_whole(job: Job, r: httpx.Response, tally: Tally) -> None:
    if job.bad:
        outcome = "refused (bad)" if 400 <= r.status_code < 500 else "lost: bad not refused"
        tally.add(outcome, r.status_code, r.text)
    elif r.status_code == 200:
        choices = r.json()["choices"]
        finished = choices and all(c.get("finish_reason") for c in choices)
        tally.add("ok" if finished else "lost: unfinished", 200, r.text)
    elif r.status_code == 429:
        tally.add("refused (429)", 429)
    elif r.status_code >= 500:
        tally.add("lost: 5xx", r.status_code, r.text)
    else:
        tally.add("lost: unexpected 4xx", r.status_code, r.text)


async def send_stream(
    http: httpx.AsyncClient, job: Job, kwargs: dict[str, Any], tally: Tally
) -> None:
    async with http.stream("POST", job.path, timeout=REQUEST_TIMEOUT_S, **kwargs) as r:
        if r.status_code != 200:
            await r.aread()
            judge_whole(job, r, tally)
            return
        events = 0
        async for line in r.aiter_lines():
            if not line.startswith("data: "):
                continue
            events += 1
            data = line[len("data: ") :]
            if data == "[DONE]":
                tally.add("ok", 200)
                return
            chunk = json.loads(data)
            if "error" in chunk:  # the server failed the request after its first chunk
                tally.add("lost: 5xx event", None, data)
                return
            if job.abandon_after is not None and events >= job.abandon_after:
                tally.add("abandoned", 200)
                return  # leaving the block closes the connection mid-stream
    tally.add("lost: truncated stream", 200)


# ---------------------------------------------------------------------- phases


async def touch_kv_pool(base: str, words: Words, model: str, pool_tokens: int) -> int:
    """Distinct long prompts (one output token each) adding up to the pool's tokens.
    Returns how many were sent."""
    n = max(1, pool_tokens // TOUCH_PROMPT_WORDS)  # a word is at least one token
    jobs = [
        Job(
            "/v1/completions",
            {"model": model, "prompt": words.text(TOUCH_PROMPT_WORDS), "max_tokens": 1},
            False,
        )
        for _ in range(n)
    ]
    tally = Tally()
    async with httpx.AsyncClient(base_url=base, timeout=REQUEST_TIMEOUT_S) as http:
        sem = asyncio.Semaphore(4)

        async def one(job: Job) -> None:
            async with sem:
                await send(http, job, tally)

        await asyncio.gather(*(one(j) for j in jobs))
    if tally.lost:
        raise RuntimeError(f"touching the KV pool lost requests: {tally.outcomes} {tally.examples}")
    return n


async def fill_batch(base: str, words: Words, model: str, batch: int) -> None:
    """One request per slot of the running batch and as many again waiting, all at once,
    each long enough to overlap: the server reaches its largest batch (and its largest
    step's memory) before the RSS baseline is read, so that high-water mark does not
    count as growth later."""
    tally = Tally()
    jobs = [
        Job(
            "/v1/completions",
            {"model": model, "prompt": words.text(150), "max_tokens": 48, "ignore_eos": True},
            False,
        )
        for _ in range(2 * batch)
    ]
    limits = httpx.Limits(max_connections=2 * batch)
    async with httpx.AsyncClient(base_url=base, limits=limits) as http:
        await asyncio.gather(*(send(http, job, tally) for job in jobs))
    if tally.lost:
        raise RuntimeError(f"filling the batch lost requests: {tally.outcomes} {tally.examples}")


async def measure_capacity(
    base: str, words: Words, model: str, duration_s: float, concurrency: int
) -> float:
    """Completed requests per second with ``concurrency`` closed-loop clients: the
    completions within the window over its length (the tail of requests still running
    at its end is waited for, not counted). The window lasts ``duration_s`` and at least
    until ``3 * concurrency`` requests completed (at most ``4 * duration_s``), so slow
    requests on a busy machine do not leave it empty."""
    tally = Tally()
    done = 0
    started = time.monotonic()
    hard_stop = started + 4 * duration_s
    window_end: float | None = None

    def open_window() -> bool:
        nonlocal window_end
        now = time.monotonic()
        if window_end is None and (
            now >= hard_stop or (now - started >= duration_s and done >= 3 * concurrency)
        ):
            window_end = now
        return window_end is None

    async with httpx.AsyncClient(
        base_url=base, limits=httpx.Limits(max_connections=concurrency)
    ) as http:

        async def client() -> None:
            nonlocal done
            while open_window():
                await send(http, good_job(words, model), tally)
                if open_window():
                    done += 1

        await asyncio.gather(*(client() for _ in range(concurrency)))
    if tally.lost:
        raise RuntimeError(f"requests lost while measuring capacity: {tally.outcomes}")
    assert window_end is not None
    return done / (window_end - started)


async def soak(
    base: str,
    words: Words,
    model: str,
    rate: float,
    duration_s: float,
    on_tick: Callable[[], Awaitable[None]] | None,
) -> tuple[int, Tally]:
    """Poisson arrivals at ``rate`` per second for ``duration_s``; waits for every
    request. Returns (requests sent, outcomes)."""
    tally = Tally()
    sent = 0
    tasks: set[asyncio.Task[None]] = set()
    sem = asyncio.Semaphore(MAX_IN_FLIGHT)
    limits = httpx.Limits(max_connections=MAX_IN_FLIGHT + 8, max_keepalive_connections=32)
    async with httpx.AsyncClient(base_url=base, limits=limits) as http:

        async def one(job: Job) -> None:
            try:
                await send(http, job, tally)
            finally:
                sem.release()

        start = time.monotonic()
        next_at = start
        next_tick = start + 30
        while True:
            next_at += words.rng.expovariate(rate)
            if next_at - start >= duration_s:
                break
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))
            await sem.acquire()  # bounded in flight: a stalled server cannot pile up tasks
            task = asyncio.create_task(one(soak_job(words, model)))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            sent += 1
            if on_tick is not None and time.monotonic() >= next_tick:
                next_tick += 30
                await on_tick()
        await asyncio.gather(*tasks)
    return sent, tally


def wait_idle(base: str) -> dict[str, float]:
    deadline = time.monotonic() + IDLE_TIMEOUT_S
    while True:
        m = scrape(base)
        if (
            m["orchestrator_num_requests_running"] == 0
            and m["orchestrator_num_requests_waiting"] == 0
        ):
            return m
        if time.monotonic() > deadline:
            return m
        time.sleep(0.5)


def warm_up(
    server: Server, words: Words, model: str, rate: float, max_s: float, tally: Tally
) -> tuple[int, list[int]]:
    """Soak traffic in ``WARMUP_WINDOW_S`` windows until the server's RSS has settled
    (grew under ``SETTLED_PCT_PER_MIN`` over the last two windows) or ``max_s`` passed.
    Returns the requests sent and the RSS after each window (bytes)."""
    sent, history = 0, [server.rss_bytes()]
    started = time.monotonic()
    while True:
        n, window = asyncio.run(soak(server.base, words, model, rate, WARMUP_WINDOW_S, None))
        sent += n
        tally.merge(window)
        history.append(server.rss_bytes())
        if len(history) >= 3:
            minutes = 2 * WARMUP_WINDOW_S / 60
            per_min = 100.0 * (history[-1] - history[-3]) / history[-3] / minutes
            if per_min < SETTLED_PCT_PER_MIN:
                return sent, history
        if time.monotonic() - started >= max_s:
            return sent, history


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=10.0, help="soak duration (default 10)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    parser.add_argument("--load", type=float, default=0.8, help="fraction of capacity offered")
    parser.add_argument("--capacity-s", type=float, default=None, help="capacity phase (s)")
    parser.add_argument("--concurrency", type=int, default=16, help="capacity-phase clients")
    parser.add_argument(
        "--warmup-max-minutes", type=float, default=5.0, help="longest warm-up (default 5)"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.minutes <= 0 or not 0 < args.load <= 1:
        parser.error("--minutes must be positive and --load in (0, 1]")
    duration_s = args.minutes * 60
    capacity_s = args.capacity_s or min(90.0, max(30.0, duration_s / 4))
    words = Words(random.Random(args.seed))
    config = yaml.safe_load(args.config.read_text())
    model = config.get("model", {}).get("name", "SmolLM2-135M-Instruct")
    block_size = config.get("cache", {}).get("block_size", 16)
    max_batch = config.get("scheduler", {}).get("max_batch_size", 64)
    mib = 2**20

    with tempfile.TemporaryDirectory(prefix="soak-") as tmp:
        t0 = time.monotonic()
        server = start_server(args.config, Path(tmp))
        warm_tally, tally = Tally(), Tally()
        try:
            print(f"server ready on {server.base} in {time.monotonic() - t0:.0f} s", flush=True)
            pool_blocks = int(scrape(server.base)["orchestrator_kv_blocks_total"])
            n = asyncio.run(touch_kv_pool(server.base, words, model, pool_blocks * block_size))
            print(f"KV pool touched: {pool_blocks} blocks, {n} prompts", flush=True)
            capacity = asyncio.run(
                measure_capacity(server.base, words, model, capacity_s, args.concurrency)
            )
            rate = args.load * capacity
            print(
                f"capacity: {capacity:.3f} requests/s ({args.concurrency} clients); "
                f"offering {rate:.3f}/s",
                flush=True,
            )
            asyncio.run(fill_batch(server.base, words, model, max_batch))
            print(f"largest batch reached: {max_batch} running, {max_batch} waiting", flush=True)
            warm_sent, history = warm_up(
                server, words, model, rate, 60 * args.warmup_max_minutes, warm_tally
            )
            print(
                f"warm-up: {warm_sent} requests; RSS by {WARMUP_WINDOW_S:.0f} s window "
                + " ".join(f"{r / mib:.0f}" for r in history)
                + " MiB",
                flush=True,
            )
            wait_idle(server.base)
            rss_start = server.rss_bytes()
            print(f"RSS after warm-up: {rss_start / mib:.1f} MiB", flush=True)
            soak_start = time.monotonic()

            async def tick() -> None:
                m = scrape(server.base)
                print(
                    f"  t+{time.monotonic() - soak_start:.0f} s: "
                    f"running {m['orchestrator_num_requests_running']:.0f}, "
                    f"waiting {m['orchestrator_num_requests_waiting']:.0f}, "
                    f"RSS {server.rss_bytes() / mib:.1f} MiB",
                    flush=True,
                )

            sent, tally = asyncio.run(soak(server.base, words, model, rate, duration_s, tick))
            elapsed = time.monotonic() - soak_start
            idle = wait_idle(server.base)
            rss_end = server.rss_bytes()
        finally:
            exit_code = stop_server(server)
        leaked = int(idle["orchestrator_kv_blocks_used"])
        growth = 100.0 * (rss_end - rss_start) / rss_start
        print(f"soak phase: {sent} requests in {elapsed:.0f} s ({sent / elapsed:.3f}/s)")
        for outcome, count in sorted(tally.outcomes.items()):
            print(f"  {outcome}: {count}")
        print(f"  statuses: {dict(sorted(tally.statuses.items()))}")
        tally.merge(warm_tally)  # a request lost while warming up is lost all the same
        for outcome, example in tally.examples.items():
            if outcome.startswith("lost"):
                print(f"  e.g. {outcome}: {example}")
        print(
            f"KV blocks used when idle: {leaked}; RSS {rss_start / mib:.1f} -> {rss_end / mib:.1f} MiB"
        )
        print(f"server exit code after SIGTERM: {exit_code}")
        if tally.lost or tally.server_errors or exit_code != 0:
            print("server log tail:\n" + "\n".join(server.log.read_text().splitlines()[-30:]))
        print(
            f"soak {args.minutes:g} min: {sent} requests, lost {tally.lost}, "
            f"5xx {tally.server_errors}, leaked blocks {leaked}, RSS growth {growth:.1f}%"
        )
    passed = not tally.lost and not tally.server_errors and leaked == 0 and growth < RSS_LIMIT_PCT
    return 0 if passed and exit_code == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
