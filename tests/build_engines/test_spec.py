"""Loading build specs: shipped files, errors that name the file and key, hashing."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from build_engines.plan import plan_from_file
from build_engines.spec import load_build_spec
from orchestrator.common.specs import CONFIGS_DIR
from orchestrator.core.config import ConfigError
from tests.build_engines.helpers import TOOLCHAIN, make_spec, spec_data

SHIPPED = sorted((CONFIGS_DIR / "build").glob("*.yaml"))


def test_required_configs_are_shipped() -> None:
    names = {p.name for p in SHIPPED}
    assert {"llama3-70b-fp8-h100-tp2.yaml", "llama3-8b-fp8-h100.yaml"} <= names
    backends = {load_build_spec(p).spec.backend for p in SHIPPED}
    assert backends == {"engine", "pytorch"}


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_spec_plans_without_errors(path: Path) -> None:
    plan = plan_from_file(path, TOOLCHAIN, cwd=Path("/builds"))
    assert plan.errors == [], [str(f) for f in plan.errors]


def test_shipped_spec_reads_shared_model_and_gpu_specs() -> None:
    loaded = load_build_spec(CONFIGS_DIR / "build" / "llama3-70b-fp8-h100-tp2.yaml")
    assert loaded.model.name == "Llama-3-70B" and loaded.model.num_kv_heads == 8
    assert loaded.gpu.name == "H100-SXM" and loaded.gpu.memory_bytes == 80e9


def write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_key_names_file_and_key(tmp_path: Path) -> None:
    data = spec_data()
    data["plugins"]["reduce_fusoin"] = True
    path = write(tmp_path, data)
    with pytest.raises(ConfigError, match=rf"{path}: plugins.reduce_fusoin: unknown key"):
        load_build_spec(path)


def test_bad_value_names_key(tmp_path: Path) -> None:
    path = write(tmp_path, spec_data({"quantization": {"weights": "int4"}}))
    with pytest.raises(ConfigError, match=r"quantization.weights: Input should be"):
        load_build_spec(path)


@pytest.mark.parametrize(
    ("overrides", "key", "name"),
    [
        ({"model": {"spec": "llama9-1t"}}, "model.spec", "llama9-1t"),
        ({"target": {"gpu": "tpu-v5"}}, "target.gpu", "tpu-v5"),
    ],
)
def test_unknown_shared_spec_names_key(
    tmp_path: Path, overrides: dict, key: str, name: str
) -> None:
    path = write(tmp_path, spec_data(overrides))
    with pytest.raises(ConfigError, match=rf"{path}: {key}: unknown .* spec '{name}'; known: "):
        load_build_spec(path)


def test_spec_hash_ignores_output_dir_only() -> None:
    base = make_spec()
    assert make_spec({"output_dir": "elsewhere"}).spec_hash == base.spec_hash
    assert make_spec({"limits": {"max_batch_size": 32}}).spec_hash != base.spec_hash
    assert len(base.spec_hash) == 64


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_build_spec(tmp_path / "nope.yaml")
