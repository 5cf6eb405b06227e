"""Dynamo frontends and our workers as processes on this machine, every plane on
127.0.0.1: file discovery, the TCP request plane and the ZMQ event plane, so no etcd or
NATS. What the fleet lane (``tests/fleet``) and ``benchmarks/fleet_routing.py`` start.

It imports no Dynamo: it runs Dynamo's frontend and ``orchestrator dynamo-worker`` from
``.venv-dynamo``. A worker with KV routing still opens ZMQ sockets on 0.0.0.0, so callers
run it inside a private network namespace (docs/fleet.md). Failures raise ``FleetError``
with the processes' last log lines; ``stop()`` ends every process started, whatever
happened.
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import httpx

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_BIN = ROOT / ".venv-dynamo" / "bin"
PLANES = ("--discovery-backend", "file", "--request-plane", "tcp", "--event-plane", "zmq")
# The hosts Dynamo binds its HTTP, RPC, response-stream, event and system planes on.
LOOPBACK_HOSTS = (
    "DYN_HTTP_HOST",
    "DYN_TCP_RPC_HOST",
    "DYN_TCP_RESPONSE_STREAM_HOST",
    "DYN_EVENT_PLANE_HOST",
    "DYN_SYSTEM_HOST",
)
POLL_S = 0.5


class FleetError(RuntimeError):
    """A fleet process exited early, or the fleet did not come up in time."""


@dataclass
class Process:
    name: str
    popen: subprocess.Popen[bytes]
    log_path: Path
    log: IO[bytes]

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]


class LocalFleet:
    """Processes started into ``folder`` (one log each, and ``discovery/``, Dynamo's file
    discovery). They stay in the caller's process group, so a script's own clean-up
    reaches them even if the caller is killed outright."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.kv_dir = folder / "discovery"
        self.processes: list[Process] = []
        self.env = dict(os.environ)
        self.env.update({name: "127.0.0.1" for name in LOOPBACK_HOSTS})
        self.env["DYN_FILE_KV"] = str(self.kv_dir)
        self.env["PYTHONUNBUFFERED"] = "1"

    def start(self, name: str, argv: Sequence[str], **env: str) -> Process:
        log_path = self.folder / f"{name}.log"
        log = log_path.open("wb")
        popen = subprocess.Popen(
            list(argv), stdout=log, stderr=subprocess.STDOUT, env={**self.env, **env}, cwd=ROOT
        )
        process = Process(name, popen, log_path, log)
        self.processes.append(process)
        return process

    def start_worker(self, name: str, config: Path, system_port: int) -> Process:
        """``orchestrator dynamo-worker --config config``; its metrics on ``system_port``."""
        argv = [str(DYNAMO_BIN / "orchestrator"), "dynamo-worker", "--config", str(config)]
        return self.start(name, [*argv, *PLANES], DYN_SYSTEM_PORT=str(system_port))

    def start_frontend(self, name: str, port: int, router: Sequence[str]) -> Process:
        """Dynamo's OpenAI frontend on ``port`` with the ``router`` flags (e.g.
        ``["--router-mode", "kv"]``)."""
        argv = [str(DYNAMO_BIN / "python"), "-m", "dynamo.frontend", *PLANES, *router]
        return self.start(name, [*argv, "--http-host", "127.0.0.1", "--http-port", str(port)])

    def check_alive(self, what: str) -> None:
        """Raise ``FleetError`` if a process has exited (``what``: what was going on)."""
        for process in self.processes:
            if process.popen.poll() is not None:
                raise FleetError(f"{process.name} exited while {what}:\n{process.tail()}")

    def wait_until(self, condition: Callable[[], bool], what: str, timeout_s: float) -> None:
        """Poll ``condition`` until it holds; ``FleetError`` naming ``what`` after
        ``timeout_s`` seconds, or as soon as a process exits."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive(f"waiting for {what}")
            if condition():
                return
            time.sleep(POLL_S)
        logs = "\n".join(f"--- {p.name}\n{p.tail(1500)}" for p in self.processes)
        raise FleetError(f"timed out after {timeout_s:.0f} s waiting for {what}\n{logs}")

    def registered_workers(self) -> int:
        """Workers registered in file discovery: entries of the ``generate`` endpoint
        (file names are URL-quoted ``namespace/component/endpoint/instance``; with KV
        routing a worker also registers endpoints of its own)."""
        folder = self.kv_dir / "v1" / "instances"
        if not folder.is_dir():
            return 0
        return sum(1 for entry in folder.iterdir() if "%2Fgenerate%2F" in entry.name)

    def stop(self) -> None:
        """SIGTERM every process still running, SIGKILL what is left after 10 s."""
        for process in self.processes:
            if process.popen.poll() is None:
                process.popen.terminate()
        deadline = time.monotonic() + 10
        for process in self.processes:
            try:
                process.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait(timeout=10)
            process.log.close()


def model_listed(port: int, model: str) -> bool:
    """Whether the frontend on ``port`` lists ``model`` (a worker has registered it)."""
    try:
        response = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5)
    except httpx.HTTPError:
        return False
    return response.status_code == 200 and model in response.text


def metric(port: int, name: str) -> float:
    """The sum of a metric's samples on a worker's system port."""
    text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text
    pattern = re.compile(rf"^{re.escape(name)}(?:\{{[^}}]*\}})? (\S+)$", re.MULTILINE)
    return sum(float(value) for value in pattern.findall(text))


def prompt_counters(system_ports: Sequence[int]) -> list[tuple[float, float]]:
    """``(prompt tokens, cached prompt tokens)`` each worker served since it started."""
    return [
        (
            metric(port, "orchestrator_prompt_tokens_total"),
            metric(port, "orchestrator_prompt_tokens_cached_total"),
        )
        for port in system_ports
    ]
