"""Every shipped manifest against the schemas of its API: Kubernetes' own (through
kubernetes-validate's bundled copies, strict, so an unknown field fails) and, for the
InferencePool and llm-d's InferenceObjective, the published CRDs vendored in data/."""

from __future__ import annotations

import copy
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from kubernetes_validate.utils import SchemaNotFoundError, ValidationError

from tests.deploy.manifests import DATA, KUBERNETES_VERSION, VARIANTS, Manifest, all_manifests
from tests.deploy.manifests import variant as load_variant

CRD_KINDS = {"InferencePool", "InferenceObjective"}


def core_manifests() -> list[Manifest]:
    return [m for m in all_manifests() if m.kind not in CRD_KINDS]


def test_every_variant_ships_the_objects_a_deployment_needs() -> None:
    needed = {
        "Namespace",
        "ConfigMap",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "HorizontalPodAutoscaler",
        "InferencePool",
        "ServiceAccount",
        "Role",
        "RoleBinding",
    }
    for name in VARIANTS:
        kinds = {m.kind for m in load_variant(name)}
        assert needed <= kinds, f"{name} lacks {needed - kinds}"


@pytest.mark.parametrize("manifest", core_manifests(), ids=str)
def test_manifest_is_valid_for_the_pinned_kubernetes(manifest: Manifest) -> None:
    try:
        kubernetes_validate.validate(manifest.obj, KUBERNETES_VERSION, strict=True)
    except ValidationError as err:
        path = ".".join(str(p) for p in err.path)
        pytest.fail(f"{manifest}: {path}: {err.message}")
    except SchemaNotFoundError as err:
        pytest.fail(f"{manifest}: no schema to check it against: {err.message}")


def deployment(name: str) -> dict[str, Any]:
    (m,) = [m for m in load_variant(name) if m.kind == "Deployment" and "epp" not in m.name]
    return copy.deepcopy(m.obj)


def test_strict_validation_rejects_a_misspelt_field_and_a_wrong_type() -> None:
    misspelt = deployment("cpu")
    misspelt["spec"]["template"]["spec"]["terminationGracePeriod"] = 60
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(misspelt, KUBERNETES_VERSION, strict=True)
    wrong_type = deployment("cpu")
    wrong_type["spec"]["replicas"] = "two"
    with pytest.raises(ValidationError):
        kubernetes_validate.validate(wrong_type, KUBERNETES_VERSION, strict=True)


# ---------------------------------------------------------------- the InferencePool CRD


def closed(schema: Any) -> Any:
    """The schema with every object that lists its properties closed to others: the API
    server drops unknown fields and kubectl's strict field validation refuses them, so a
    misspelt field must fail here too."""
    if isinstance(schema, dict):
        out = {k: closed(v) for k, v in schema.items()}
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out
    if isinstance(schema, list):
        return [closed(v) for v in schema]
    return schema


def crd_schema(file: str, group: str, version: str) -> Any:
    """The closed schema of ``version`` in the CRD vendored as ``data/<file>``."""
    crd = yaml.safe_load((DATA / file).read_text())
    assert crd["spec"]["group"] == group
    (v,) = [v for v in crd["spec"]["versions"] if v["name"] == version]
    return closed(v["schema"]["openAPIV3Schema"])


def inferencepool_schema(version: str = "v1") -> Any:
    return crd_schema(
        "inference.networking.k8s.io_inferencepools.yaml", "inference.networking.k8s.io", version
    )


def check_inferencepool(obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` or ``AssertionError`` for an invalid pool."""
    assert obj["apiVersion"] == "inference.networking.k8s.io/v1"
    assert obj["kind"] == "InferencePool"
    jsonschema.Draft7Validator(inferencepool_schema()).validate(obj)
    # The CRD's two CEL rules (x-kubernetes-validations), which jsonschema cannot run.
    ref = obj["spec"]["endpointPickerRef"]
    assert ref.get("kind", "Service") != "Service" or "port" in ref, "Service ref needs a port"
    numbers = [p["number"] for p in obj["spec"]["targetPorts"]]
    assert len(set(numbers)) == len(numbers), "port number must be unique"


def check_inferenceobjective(obj: dict[str, Any]) -> None:
    """Raise ``jsonschema.ValidationError`` or ``AssertionError`` for an invalid
    InferenceObjective of llm-d's router (``llm-d.ai/v1alpha2``)."""
    assert obj["apiVersion"] == "llm-d.ai/v1alpha2"
    assert obj["kind"] == "InferenceObjective"
    schema = crd_schema("llm-d.ai_inferenceobjectives.yaml", "llm-d.ai", "v1alpha2")
    jsonschema.Draft7Validator(schema).validate(obj)
    # format: int32, which jsonschema does not enforce.
    priority = obj["spec"].get("priority", 0)
    assert -(2**31) <= priority < 2**31, "priority must be an int32"


CRD_CHECKS = {"InferencePool": check_inferencepool, "InferenceObjective": check_inferenceobjective}


@pytest.mark.parametrize("manifest", [m for m in all_manifests() if m.kind in CRD_KINDS], ids=str)
def test_custom_resources_are_valid_against_the_published_crds(manifest: Manifest) -> None:
    CRD_CHECKS[manifest.kind](manifest.obj)


def test_the_objective_check_rejects_a_misspelt_field_and_a_wrong_type() -> None:
    (m, *_) = [m for m in load_variant("llm-d") if m.kind == "InferenceObjective"]
    misspelt = copy.deepcopy(m.obj)
    misspelt["spec"]["priorty"] = 1
    with pytest.raises(jsonschema.ValidationError):
        check_inferenceobjective(misspelt)
    no_pool = copy.deepcopy(m.obj)
    del no_pool["spec"]["poolRef"]
    with pytest.raises(jsonschema.ValidationError):
        check_inferenceobjective(no_pool)
    text_priority = copy.deepcopy(m.obj)
    text_priority["spec"]["priority"] = "high"
    with pytest.raises(jsonschema.ValidationError):
        check_inferenceobjective(text_priority)


def pool(name: str = "gpu-trtllm") -> dict[str, Any]:
    (m,) = [m for m in load_variant(name) if m.kind == "InferencePool"]
    return copy.deepcopy(m.obj)


def test_the_crd_check_rejects_pre_v1_shapes_and_broken_refs() -> None:
    old = pool()
    old["spec"]["extensionRef"] = old["spec"].pop("endpointPickerRef")  # v1alpha2 name
    with pytest.raises(jsonschema.ValidationError):
        check_inferencepool(old)
    flat_selector = pool()
    flat_selector["spec"]["selector"] = {"app": "x"}  # v1alpha2 map, not matchLabels
    with pytest.raises(jsonschema.ValidationError):
        check_inferencepool(flat_selector)
    bad_mode = pool()
    bad_mode["spec"]["endpointPickerRef"]["failureMode"] = "Open"
    with pytest.raises(jsonschema.ValidationError):
        check_inferencepool(bad_mode)
    no_port = pool()
    del no_port["spec"]["endpointPickerRef"]["port"]
    with pytest.raises(AssertionError, match="needs a port"):
        check_inferencepool(no_port)
