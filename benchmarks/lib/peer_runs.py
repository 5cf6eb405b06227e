"""What the peer benchmarks (``vs_llamacpp.sh``, ``vs_vllm_cpu.sh``) read back from their
``orchestrator bench`` result folders, ``OUT/<load>-<side>/``: each load's run and
summary, the check that both servers did the same work, a line of a server's log, and
the CPU the figures come from."""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

import torch


class PeerRuns:
    """The result folders of one peer benchmark under ``out``; ``tag`` names the
    benchmark in its error messages."""

    def __init__(self, out: Path, tag: str) -> None:
        self.out, self.tag = out, tag

    def run_of(self, load: str, side: str) -> dict:
        doc = json.loads((self.out / f"{load}-{side}" / "summary.json").read_text())
        return doc["runs"][0]

    def summary(self, load: str, side: str) -> dict:
        return self.run_of(load, side)["summary"]

    def require_same_work(self, loads: Iterable[str], sides: Mapping[str, str]) -> None:
        """Exit unless, for every load, each side (a key of ``sides``, whose value names
        it) got the same workload and answered every request to its max_tokens: ratios
        mean something only then (a server that ignored ignore_eos would stop early)."""
        for load in loads:
            workloads = {
                s: (self.out / f"{load}-{s}" / "workload.jsonl").read_text() for s in sides
            }
            if len(set(workloads.values())) != 1:
                sys.exit(f"{self.tag}: the {load} workloads differ between the servers")
            first = next(iter(workloads.values()))
            want = sum(json.loads(line)["max_tokens"] for line in first.splitlines())
            for side, name in sides.items():
                s = self.summary(load, side)
                if s["num_errors"] or s["output_tokens"] != want:
                    sys.exit(
                        f"{self.tag}: {name} {load}: {s['num_errors']} errors, "
                        f"{s['output_tokens']} output tokens of {want}; "
                        f"see {self.out}/{load}-{side}.log"
                    )


def log_line(log: Path, pattern: str) -> str:
    """The first group of ``pattern``'s first match in ``log``, or where it was not found."""
    text = log.read_text(errors="replace") if log.exists() else ""
    found = re.search(pattern, text)
    return found.group(1).strip() if found else f"(not in {log})"


def cpu_line(threads: str) -> str:
    """The CPU model and the instruction set torch reads from CPUID, for the header."""
    cpu = "unknown CPU"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    return (
        f"CPU: {cpu}; instruction set (CPUID, as torch reads it): "
        f"{torch.backends.cpu.get_cpu_capability()}; {threads} threads each"
    )
