"""The gauges the manifests rely on (deploy/metrics.yaml) are what a gateway's /metrics
actually exports: every listed name, with a value in its unit's range."""

from __future__ import annotations

from pathlib import Path

import yaml

from tests.gateway.support import client_for, fake_core

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def samples(text: str) -> dict[str, float]:
    """First sample of each metric in Prometheus text format, by name (labels dropped)."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name = line.split("{", 1)[0].split(" ", 1)[0]
            found.setdefault(name, float(line.rsplit(" ", 1)[1]))
    return found


def test_every_gauge_the_manifests_name_is_exported() -> None:
    gauges = yaml.safe_load((DEPLOY / "metrics.yaml").read_text())["gauges"]
    core, _ = fake_core()
    with client_for(core) as client:
        exported = samples(client.get("/metrics").text)
    missing = [g["name"] for g in gauges if g["name"] not in exported]
    assert missing == []
    for gauge in gauges:
        value = exported[gauge["name"]]
        if gauge["unit"].startswith("fraction"):
            assert 0.0 <= value <= 1.0, gauge["name"]
        else:
            assert value >= 0 and value == int(value), gauge["name"]
