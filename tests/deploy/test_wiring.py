"""The manifests agree with each other and with the code they deploy: probes hit routes
the gateway has and behave as the probes expect, the grace period outlasts the drain,
the serve ConfigMap is the repository's serve config, and every metric name the endpoint
picker and the autoscaler use is one deploy/metrics.yaml lists."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from orchestrator.gateway.app import create_app
from orchestrator.gateway.config import ServeConfig, load_serve_config
from orchestrator.gateway.lifecycle import LoadedModel
from orchestrator.gateway.routes import router
from orchestrator.sim.router import PrefixAwareWeights
from tests.deploy.manifests import (
    DEPLOY,
    REPO,
    VARIANTS,
    container,
    epp_config,
    flags,
    metric_names,
    model_server,
    one,
    serve_yaml,
)

GPU, CPU = "gpu-trtllm", "cpu"


def engine_config(name: str, tmp_path: Path) -> ServeConfig:
    """The ConfigMap's serve.yaml through the same loader `orchestrator serve` uses."""
    path = tmp_path / f"{name}-serve.yaml"
    path.write_text(yaml.safe_dump(serve_yaml(name)))
    return load_serve_config(path)


def pod_spec(name: str) -> dict[str, Any]:
    spec: dict[str, Any] = model_server(name)["spec"]["template"]["spec"]
    return spec


def pod_labels(name: str) -> dict[str, str]:
    labels: dict[str, str] = model_server(name)["spec"]["template"]["metadata"]["labels"]
    return labels


def named_port(c: dict[str, Any], port: Any) -> int:
    if isinstance(port, int):
        return port
    (number,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(number)


# ---------------------------------------------------------------- serve config


@pytest.mark.parametrize("name", VARIANTS)
def test_the_configmap_is_the_repository_serve_config_reachable_from_the_pod(
    name: str, tmp_path: Path
) -> None:
    shipped = engine_config(name, tmp_path)
    repo = load_serve_config(VARIANTS[name])
    assert shipped.model == repo.model
    assert shipped.scheduler == repo.scheduler
    assert shipped.cache == repo.cache
    assert shipped.executor.type == repo.executor.type
    assert shipped.server.host == "0.0.0.0"  # the probes and the Service come from outside
    assert shipped.server.drain_timeout_s == repo.server.drain_timeout_s
    c = container(model_server(name))
    assert named_port(c, "http") == shipped.server.port
    mount = next(m for m in c["volumeMounts"] if m["name"] == "serve-config")
    assert c["args"] == ["--config", f"{mount['mountPath']}/serve.yaml"]


def test_the_gpu_engine_dir_lies_on_the_mounted_artefact_volume(tmp_path: Path) -> None:
    engine_dir = str(engine_config(GPU, tmp_path).executor.options.engine_dir)
    c = container(model_server(GPU))
    mounts = {m["mountPath"]: m for m in c["volumeMounts"]}
    assert any(engine_dir.startswith(p + "/") and mounts[p]["readOnly"] for p in mounts)


@pytest.mark.parametrize("name", VARIANTS)
def test_api_keys_come_from_a_secret_in_the_variable_the_config_names(
    name: str, tmp_path: Path
) -> None:
    env_name = engine_config(name, tmp_path).server.api_keys_env
    env = {e["name"]: e for e in container(model_server(name))["env"]}
    ref = env[env_name]["valueFrom"]["secretKeyRef"]
    assert ref["name"] and ref["key"]
    # The GPU replica must not start open to anyone: the Secret is required there.
    assert ref.get("optional", False) is (name == CPU)


# ---------------------------------------------------------------- probes and shutdown


def gateway_routes() -> dict[str, set[str]]:
    return {r.path: set(r.methods) for r in router.routes}  # type: ignore[attr-defined]


@pytest.mark.parametrize("name", VARIANTS)
def test_probes_hit_the_gateways_health_and_readiness_routes(name: str) -> None:
    routes = gateway_routes()
    c = container(model_server(name))
    expected = {"startupProbe": "/ready", "readinessProbe": "/ready", "livenessProbe": "/health"}
    for probe, path in expected.items():
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert "GET" in routes[path], probe
        assert named_port(c, get["port"]) == 8000


def test_the_gpu_startup_probe_waits_over_half_an_hour_for_a_70b_load() -> None:
    startup = container(model_server(GPU))["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 30 * 60


@pytest.fixture
def loading_app(tmp_path: Path) -> Iterator[TestClient]:
    """The gateway built from the GPU ConfigMap, with API keys set, still loading its
    model (the loader blocks until the test ends, then fails)."""
    config = engine_config(GPU, tmp_path)
    release = threading.Event()

    def loader() -> LoadedModel:
        release.wait(30)
        raise RuntimeError("the test is over")

    app = create_app(config, loader, environ={config.server.api_keys_env: "k1"})
    try:
        with TestClient(app) as client:
            yield client
    finally:
        release.set()


def test_while_loading_liveness_passes_readiness_fails_and_probes_need_no_key(
    loading_app: TestClient,
) -> None:
    assert loading_app.get("/health").status_code == 200
    ready = loading_app.get("/ready")
    assert ready.status_code == 503 and ready.json()["status"] == "loading"
    assert loading_app.get("/metrics").status_code == 200  # the picker scrapes it unauthenticated
    assert loading_app.get("/v1/models").status_code == 401  # but the API needs the key


@pytest.mark.parametrize("name", VARIANTS)
def test_the_grace_period_outlasts_the_pre_stop_wait_and_the_drain(
    name: str, tmp_path: Path
) -> None:
    drain = engine_config(name, tmp_path).server.drain_timeout_s
    command = container(model_server(name))["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    grace = pod_spec(name)["terminationGracePeriodSeconds"]
    assert grace > pre_stop + drain, (grace, pre_stop, drain)


# ---------------------------------------------------------------- resources


def test_the_gpu_pod_holds_the_engines_gpus_and_a_memory_backed_shm() -> None:
    build = yaml.safe_load((REPO / "configs/build/llama3-70b-fp8-h100-tp2.yaml").read_text())
    world = build["parallelism"]["tp"] * build["parallelism"].get("pp", 1)
    resources = container(model_server(GPU))["resources"]
    assert resources["limits"]["nvidia.com/gpu"] == world == 2
    assert resources["requests"]["nvidia.com/gpu"] == world
    volumes = {v["name"]: v for v in pod_spec(GPU)["volumes"]}
    mounts = {m["mountPath"]: m["name"] for m in container(model_server(GPU))["volumeMounts"]}
    assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory"


def test_the_cpu_pod_has_cpu_requests_and_limits_and_no_gpu() -> None:
    resources = container(model_server(CPU))["resources"]
    assert resources["requests"]["cpu"] and resources["limits"]["cpu"]
    assert resources["requests"]["memory"] and resources["limits"]["memory"]
    assert "nvidia.com/gpu" not in resources.get("limits", {})


@pytest.mark.parametrize("name", VARIANTS)
def test_the_service_pdb_hpa_and_pool_all_select_the_model_server(name: str) -> None:
    labels = pod_labels(name)
    deployment = model_server(name)
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    service = one(name, "Service", lambda o: not o["metadata"]["name"].endswith("-epp"))
    assert service["spec"]["selector"].items() <= labels.items()
    pdb = one(name, "PodDisruptionBudget")
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()
    hpa = one(name, "HorizontalPodAutoscaler")
    assert hpa["spec"]["scaleTargetRef"]["name"] == deployment["metadata"]["name"]
    pool = one(name, "InferencePool")
    assert pool["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [8000]


# ---------------------------------------------------------------- endpoint picker


def epp_deployment(name: str) -> dict[str, Any]:
    return one(name, "Deployment", lambda o: o["metadata"]["name"].endswith("-epp"))


@pytest.mark.parametrize("name", VARIANTS)
def test_the_pool_points_at_the_picker_service_and_the_picker_at_the_pool(name: str) -> None:
    pool = one(name, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = one(name, "Service", lambda o: o["metadata"]["name"] == ref["name"])
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    epp = epp_deployment(name)
    assert (
        service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    )
    args = flags(container(epp, "epp")["args"])
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args["pool-namespace"] == pool["metadata"]["namespace"]
    # The config file the picker reads is the ConfigMap key it mounts.
    c = container(epp, "epp")
    mount = next(m for m in c["volumeMounts"] if args["config-file"].startswith(m["mountPath"]))
    volume = next(
        v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    cm = one(name, "ConfigMap", lambda o: o["metadata"]["name"] == volume["configMap"]["name"])
    assert args["config-file"].removeprefix(mount["mountPath"] + "/") in cm["data"]
    # The service account the picker runs as is the one its Role is bound to.
    binding = one(name, "RoleBinding")
    assert binding["subjects"][0]["name"] == epp["spec"]["template"]["spec"]["serviceAccountName"]


@pytest.mark.parametrize("name", VARIANTS)
def test_the_picker_scores_as_the_simulator_models_it(name: str, tmp_path: Path) -> None:
    config = epp_config(name)
    assert config["apiVersion"] == "inference.networking.x-k8s.io/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p.get("name", p["type"]): p for p in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    refs = {r["pluginRef"]: r.get("weight") for r in profile["plugins"]}
    assert set(refs) <= set(plugins), "a profile names an undeclared plugin"
    weights = PrefixAwareWeights()  # the simulator's prefix_aware router
    assert refs["prefix-cache-scorer"] == weights.prefix
    assert refs["queue-scorer"] == weights.queue
    assert refs["kv-cache-utilization-scorer"] == weights.kv
    # The picker hashes text at ~4 characters a token: its blocks are the engine's.
    block = engine_config(name, tmp_path).cache.block_size
    assert plugins["prefix-cache-scorer"]["parameters"]["hashBlockSize"] == 4 * block


# ---------------------------------------------------------------- metric names


@pytest.mark.parametrize("name", VARIANTS)
def test_every_metric_the_picker_and_the_autoscaler_name_is_listed(name: str) -> None:
    known = metric_names()
    args = flags(container(epp_deployment(name), "epp")["args"])
    metric_flags = {k: v for k, v in args.items() if k.endswith("-metric")}
    assert metric_flags["total-queued-requests-metric"] in known
    assert metric_flags["kv-cache-usage-percentage-metric"] in known
    for flag, value in metric_flags.items():
        assert value == "" or value in known, f"--{flag}={value} is not in deploy/metrics.yaml"
    # Left at its default, the running-requests gauge is read under the vLLM name.
    assert "total-running-requests-metric" in metric_flags or "vllm:num_requests_running" in known
    hpa = one(name, "HorizontalPodAutoscaler")
    for metric in hpa["spec"]["metrics"]:
        assert metric["type"] == "Pods"
        assert metric["pods"]["metric"]["name"] in known


def test_the_adapter_serves_the_metric_the_autoscalers_ask_for() -> None:
    values = yaml.safe_load((DEPLOY / "prometheus-adapter-values.yaml").read_text())
    served = {rule["name"]["as"] for rule in values["rules"]["custom"]}
    for rule in values["rules"]["custom"]:
        series = rule["seriesQuery"].split("{", 1)[0]
        assert series in metric_names()
        assert set(rule["resources"]["overrides"]) == {"namespace", "pod"}  # a Pods metric
    for name in VARIANTS:
        hpa = one(name, "HorizontalPodAutoscaler")
        asked = {m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]}
        assert asked <= served, f"{name}: the adapter serves {served}, the HPA asks {asked}"


def test_the_metric_list_holds_both_name_sets() -> None:
    names = metric_names()
    ours = {n for n in names if n.startswith("orchestrator_")}
    vllm = {n for n in names if n.startswith("vllm:")}
    # Each of our three gauges under its vLLM name too, and vLLM's cache info gauge.
    assert len(ours) == 3 and len(vllm) == 4 and ours | vllm == names
    assert "vllm:cache_config_info" in vllm
