"""The llm-d variant (deploy/llm-d/) is wired together and to the code it deploys: the
pool selects the model servers by llm-d's labels, ports agree from the pool to the
container to the serve config, the picker's precise prefix-cache scorer agrees with the
servers' KV blocks and KV-event publisher, each InferenceObjective means the same on
the picker and on the servers, and the ConfigMap is the repository's SLO serve config
with the publisher on, loadable by the server's own loader."""

from __future__ import annotations

from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import yaml

from orchestrator.gateway.config import load_serve_config
from orchestrator.gateway.routes import router
from tests.deploy.manifests import (
    LLMD,
    LLMD_SERVE,
    container,
    epp_config,
    flags,
    metric_names,
    model_server,
    one,
    serve_yaml,
    variant,
)

POOL_GROUP = "inference.networking.k8s.io"
# The gauges llm-d's picker reads from a vLLM-typed pod by default (its built-in vllm
# engine config, pkg/epp/framework/plugins/datalayer/extractor/metrics/factories.go in
# llm-d/llm-d-router), less vllm:lora_requests_info: no adapters are served.
PICKER_GAUGES = {
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:cache_config_info",
}


def pod_labels() -> dict[str, str]:
    labels: dict[str, str] = model_server(LLMD)["spec"]["template"]["metadata"]["labels"]
    return labels


def port(name: str) -> int:
    (number,) = [
        p["containerPort"] for p in container(model_server(LLMD))["ports"] if p["name"] == name
    ]
    return int(number)


def epp_deployment() -> dict[str, Any]:
    return one(LLMD, "Deployment", lambda o: o["metadata"]["name"].endswith("-epp"))


def precise_scorer() -> dict[str, Any]:
    (plugin,) = [
        p for p in epp_config(LLMD)["plugins"] if p["type"] == "precise-prefix-cache-scorer"
    ]
    parameters: dict[str, Any] = plugin["parameters"]
    return parameters


def objectives() -> list[dict[str, Any]]:
    return [m.obj for m in variant(LLMD) if m.kind == "InferenceObjective"]


# ---------------------------------------------------------------- serve config


def test_the_configmap_loads_through_the_servers_own_loader(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(serve_yaml(LLMD)))
    config = load_serve_config(path)
    assert config.server.host == "0.0.0.0"
    assert config.kv_events is not None and config.kv_events.type == "zmq"


def test_the_configmap_is_the_repositorys_slo_config_with_the_publisher_on() -> None:
    shipped, repo = serve_yaml(LLMD), yaml.safe_load(LLMD_SERVE.read_text())
    assert shipped["model"] == repo["model"]
    assert shipped["scheduler"] == repo["scheduler"]
    assert shipped["executor"]["type"] == repo["executor"]["type"]
    # Only the hashing is added to the cache section: the picker must predict hashes.
    hashing = {"prefix_hash", "prefix_hash_seed"}
    assert {k: v for k, v in shipped["cache"].items() if k not in hashing} == repo["cache"]
    for key in ("objectives", "tenant_slo_classes", "api_keys_env"):
        assert shipped["server"][key] == repo["server"][key], key
    assert shipped["server"]["host"] == "0.0.0.0"


def test_the_container_runs_that_config_on_the_port_the_pool_targets() -> None:
    c = container(model_server(LLMD))
    mount = next(m for m in c["volumeMounts"] if m["name"] == "serve-config")
    assert c["args"] == ["--config", f"{mount['mountPath']}/serve.yaml"]
    volume = next(
        v
        for v in model_server(LLMD)["spec"]["template"]["spec"]["volumes"]
        if v["name"] == "serve-config"
    )
    assert (
        one(LLMD, "ConfigMap", lambda o: "serve.yaml" in o.get("data", {}))["metadata"]["name"]
        == (volume["configMap"]["name"])
    )
    server_port = serve_yaml(LLMD)["server"]["port"]
    assert port("http") == server_port
    pool = one(LLMD, "InferencePool")
    assert [p["number"] for p in pool["spec"]["targetPorts"]] == [server_port]


def test_probes_hit_the_gateways_health_and_readiness_routes() -> None:
    routes = {r.path for r in router.routes}  # type: ignore[attr-defined]
    c = container(model_server(LLMD))
    for probe, path in {
        "startupProbe": "/ready",
        "readinessProbe": "/ready",
        "livenessProbe": "/health",
    }.items():
        assert c[probe]["httpGet"]["path"] == path and path in routes, probe


# ---------------------------------------------------------------- labels and the pool


def test_the_pool_selects_the_model_servers_by_llm_ds_labels() -> None:
    labels = pod_labels()
    assert labels["llm-d.ai/inferenceServing"] == "true"
    assert labels["llm-d.ai/role"] in {"prefill", "decode", "both"}
    assert labels["llm-d.ai/model"]
    deployment = model_server(LLMD)
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    selector = one(LLMD, "InferencePool")["spec"]["selector"]["matchLabels"]
    assert selector.items() <= labels.items()
    assert {"llm-d.ai/inferenceServing", "llm-d.ai/model"} <= selector.keys()
    # The picker's own pods are not in the pool.
    picker = epp_deployment()["spec"]["template"]["metadata"]["labels"]
    assert not selector.items() <= picker.items()


def test_the_pool_points_at_the_picker_and_the_picker_at_the_pool() -> None:
    pool = one(LLMD, "InferencePool")
    ref = pool["spec"]["endpointPickerRef"]
    service = one(LLMD, "Service", lambda o: o["metadata"]["name"] == ref["name"])
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    epp = epp_deployment()
    assert (
        service["spec"]["selector"].items() <= epp["spec"]["template"]["metadata"]["labels"].items()
    )
    c = container(epp, "epp")
    args = flags(c["args"])
    assert args["pool-name"] == pool["metadata"]["name"]
    assert args["pool-namespace"] == pool["metadata"]["namespace"]
    mount = next(m for m in c["volumeMounts"] if args["config-file"].startswith(m["mountPath"]))
    volume = next(
        v for v in epp["spec"]["template"]["spec"]["volumes"] if v["name"] == mount["name"]
    )
    cm = one(LLMD, "ConfigMap", lambda o: o["metadata"]["name"] == volume["configMap"]["name"])
    assert args["config-file"].removeprefix(mount["mountPath"] + "/") in cm["data"]
    binding = one(LLMD, "RoleBinding")
    assert binding["subjects"][0]["name"] == epp["spec"]["template"]["spec"]["serviceAccountName"]
    # No metric flags: the picker reads the vLLM names, which every server exports.
    assert not [k for k in args if k.endswith("-metric")]
    assert metric_names() >= PICKER_GAUGES


# ---------------------------------------------------------------- the picker's scoring


def test_the_picker_config_declares_every_plugin_its_profile_uses() -> None:
    config = epp_config(LLMD)
    assert config["apiVersion"] == "llm-d.ai/v1alpha1"
    assert config["kind"] == "EndpointPickerConfig"
    declared = {p.get("name", p["type"]) for p in config["plugins"]}
    (profile,) = config["schedulingProfiles"]
    assert {r["pluginRef"] for r in profile["plugins"]} <= declared
    assert "precise-prefix-cache-scorer" in {r["pluginRef"] for r in profile["plugins"]}


def test_the_precise_scorer_hashes_the_servers_blocks_and_hears_their_events() -> None:
    scorer, served = precise_scorer(), serve_yaml(LLMD)
    tokens = scorer["tokenProcessorConfig"]
    # The scorer computes vLLM's block hashes: the servers' events must carry them.
    assert served["cache"]["prefix_hash"] == "vllm_sha256_cbor"
    assert tokens["blockSize"] == served["cache"]["block_size"]
    assert tokens["hashSeed"] == served["cache"]["prefix_hash_seed"]
    events = scorer["kvEventsConfig"]
    # The servers bind (tcp://*:PORT); the picker must connect, to each pod's port.
    endpoint = urlsplit(served["kv_events"]["endpoint"])
    assert endpoint.scheme == "tcp" and endpoint.hostname == "*"
    assert events["discoverPods"] is True
    assert events["podDiscoveryConfig"]["socketPort"] == endpoint.port == port("kv-events") == 5557
    # Topics are kv@<pod>@<model>.
    assert events["topicFilter"] == "kv@"
    tokenizer = scorer["indexerConfig"]["tokenizersPoolConfig"]["modelName"]
    assert tokenizer.rsplit("/", 1)[-1] == served["model"]["name"]


# ---------------------------------------------------------------- objectives


def test_each_objective_means_the_same_on_the_picker_and_on_the_servers() -> None:
    served = serve_yaml(LLMD)
    mapping = served["server"]["objectives"]
    classes = served["scheduler"]["slo_classes"]
    pool = one(LLMD, "InferencePool")
    declared = {o["metadata"]["name"]: o for o in objectives()}
    assert declared and set(declared) == set(mapping)
    for name, objective in declared.items():
        ref = objective["spec"]["poolRef"]
        assert (ref["group"], ref["kind"], ref["name"]) == (
            POOL_GROUP,
            "InferencePool",
            pool["metadata"]["name"],
        )
        assert objective["metadata"]["namespace"] == pool["metadata"]["namespace"]
        # Higher spec.priority is more critical there; lower is served first here.
        assert mapping[name]["priority"] == -objective["spec"]["priority"], name
        assert mapping[name]["slo_class"] in classes, name
    # The picker may read the objectives it is given.
    group = objectives()[0]["apiVersion"].split("/")[0]
    rules = one(LLMD, "Role")["rules"]
    assert any(group in r["apiGroups"] and "inferenceobjectives" in r["resources"] for r in rules)
