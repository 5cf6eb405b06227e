"""The shipped Kubernetes manifests, loaded once, and lookups over them."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
DATA = Path(__file__).resolve().parent / "data"
# The Kubernetes release the manifests are checked against (kubernetes-validate's bundled
# schemas); the oldest minor the manifests are meant for.
KUBERNETES_VERSION = "1.33"
# Each variant and the repository serve config its ConfigMap is derived from.
VARIANTS = {
    "gpu-trtllm": REPO / "configs" / "serve" / "llama3-70b-fp8-h100-trtllm.yaml",
    "cpu": REPO / "configs" / "serve" / "smollm2-cpu.yaml",
}
# The llm-d variant (model servers, pool, llm-d's picker, objectives): a folder of its
# own shape, checked by test_llmd.py, and the serve config its ConfigMap extends.
LLMD = "llm-d"
LLMD_SERVE = REPO / "configs" / "serve" / "smollm2-cpu-slo.yaml"
FOLDERS = (*VARIANTS, LLMD)

Obj = dict[str, Any]


@dataclass(frozen=True)
class Manifest:
    """One object and the file it came from."""

    path: Path
    obj: Obj

    @property
    def kind(self) -> str:
        return str(self.obj["kind"])

    @property
    def name(self) -> str:
        return str(self.obj["metadata"]["name"])

    def __str__(self) -> str:
        return f"{self.path.relative_to(REPO)}: {self.kind}/{self.name}"


@functools.cache
def variant(name: str) -> tuple[Manifest, ...]:
    """Every object in ``deploy/<name>/*.yaml``, in file then document order."""
    out = []
    for path in sorted((DEPLOY / name).glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                out.append(Manifest(path, doc))
    return tuple(out)


def all_manifests() -> list[Manifest]:
    return [m for name in FOLDERS for m in variant(name)]


def one(name: str, kind: str, where: Any = None) -> Obj:
    """The single object of ``kind`` in the variant (matching ``where`` if given)."""
    found = [m.obj for m in variant(name) if m.kind == kind and (where is None or where(m.obj))]
    assert len(found) == 1, f"{name}: expected one {kind}, found {len(found)}"
    return found[0]


def model_server(name: str) -> Obj:
    """The Deployment of the model server (not the endpoint picker)."""
    return one(
        name,
        "Deployment",
        lambda o: (
            o["spec"]["template"]["metadata"]["labels"].get("app.kubernetes.io/component")
            == "model-server"
        ),
    )


def container(deployment: Obj, name: str | None = None) -> Obj:
    containers = deployment["spec"]["template"]["spec"]["containers"]
    if name is None:
        assert len(containers) == 1
        return dict(containers[0])
    (c,) = [c for c in containers if c["name"] == name]
    return dict(c)


def serve_yaml(name: str) -> Obj:
    """The serve config inside the variant's ConfigMap, parsed."""
    cm = one(name, "ConfigMap", lambda o: "serve.yaml" in o.get("data", {}))
    parsed: Obj = yaml.safe_load(cm["data"]["serve.yaml"])
    return parsed


def epp_config(name: str) -> Obj:
    cm = one(name, "ConfigMap", lambda o: "epp-config.yaml" in o.get("data", {}))
    parsed: Obj = yaml.safe_load(cm["data"]["epp-config.yaml"])
    return parsed


def flags(args: list[str]) -> dict[str, str]:
    """``--name=value`` arguments as a mapping (every picker flag is written that way)."""
    out = {}
    for arg in args:
        assert arg.startswith("--") and "=" in arg, f"write flags as --name=value: {arg!r}"
        key, value = arg[2:].split("=", 1)
        out[key] = value
    return out


@functools.cache
def metric_names() -> frozenset[str]:
    """The gauges deploy/metrics.yaml lists."""
    data = yaml.safe_load((DEPLOY / "metrics.yaml").read_text())
    return frozenset(g["name"] for g in data["gauges"])
