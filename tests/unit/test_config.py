"""Config loading: unknown keys and bad values name the key and the file; every YAML
shipped under configs/ loads with the loader for its folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from orchestrator.common.specs import CONFIGS_DIR, load_gpu_spec, load_model_spec
from orchestrator.core.config import ConfigError, EngineConfig, load_engine_config
from tests.factories import make_scheduler
from tests.fakes import FakeExecutor


@pytest.fixture
def fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """Register the fake executor as type ``fake`` for config validation."""
    import orchestrator.core.config as config_module

    real = config_module.registered_class

    def lookup(name: str) -> Any:
        return FakeExecutor if name == "fake" else real(name)

    monkeypatch.setattr(config_module, "registered_class", lookup)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "engine.yaml"
    path.write_text(text)
    return path


def test_unknown_key_names_the_key_and_the_file(tmp_path: Path, fake_registry: None) -> None:
    path = write(tmp_path, "executor: {type: fake}\nscheduler:\n  max_num_tokns: 10\n")
    with pytest.raises(ConfigError) as err:
        load_engine_config(path)
    assert str(path) in str(err.value) and "scheduler.max_num_tokns: unknown key" in str(err.value)


def test_unknown_executor_option_is_named(tmp_path: Path, fake_registry: None) -> None:
    path = write(tmp_path, "executor: {type: fake, num_blockz: 3}\n")
    with pytest.raises(ConfigError, match="num_blockz: unknown key"):
        load_engine_config(path)


def test_unknown_executor_type_lists_the_known_ones(tmp_path: Path) -> None:
    path = write(tmp_path, "executor: {type: warp-drive}\n")
    with pytest.raises(
        ConfigError, match=r"unknown executor type 'warp-drive'; registered: .*torch"
    ):
        load_engine_config(path)


def test_executor_options_are_validated_by_the_executor(
    tmp_path: Path, fake_registry: None
) -> None:
    config = load_engine_config(write(tmp_path, "executor: {type: fake, num_blocks: 7}\n"))
    assert isinstance(config.executor.options, FakeExecutor.Config)
    assert config.executor.options.num_blocks == 7


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("[1, 2]", "expected a mapping"),
        (
            "scheduler: {max_num_tokens: -1}\nexecutor: {type: fake}",
            "max_num_tokens: Input should be greater",
        ),
        (
            "executor: {type: fake}\nscheduler: {max_batch_size: 99, max_num_tokens: 10}",
            "exceeds max_num_tokens",
        ),
        ("executor: {}", "needs a 'type'"),
        ("a: [", "not valid YAML"),
    ],
)
def test_bad_values_are_reported(
    tmp_path: Path, fake_registry: None, text: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match):
        load_engine_config(write(tmp_path, text))


def test_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_engine_config(tmp_path / "nope.yaml")


def test_priority_preemption_defaults_on_for_the_priority_policy() -> None:
    assert make_scheduler(policy="priority").preempt_for_priority
    assert not make_scheduler(policy="fcfs").preempt_for_priority
    assert not make_scheduler(policy="priority", preempt_for_priority=False).preempt_for_priority


def _build_spec_loader() -> Callable[[Path], Any]:
    from build_engines.spec import load_build_spec

    return load_build_spec


def _serve_config_loader() -> Callable[[Path], Any]:
    from orchestrator.gateway.config import load_serve_config

    return load_serve_config


def _sim_config_loader() -> Callable[[Path], Any]:
    from orchestrator.sim.config import load_sim_config

    return load_sim_config


LOADERS: dict[str, Callable[[], Callable[[Path], Any]]] = {
    "models": lambda: load_model_spec,
    "hardware": lambda: load_gpu_spec,
    "serve": _serve_config_loader,
    "build": _build_spec_loader,
    "sim": _sim_config_loader,
}


def test_every_config_folder_has_a_loader() -> None:
    folders = {p.name for p in CONFIGS_DIR.iterdir() if p.is_dir()}
    assert folders == set(LOADERS)


@pytest.mark.parametrize(
    "path",
    sorted(CONFIGS_DIR.glob("*/*.yaml")),
    ids=lambda p: f"{p.parent.name}/{p.name}",
)
def test_shipped_config_loads(path: Path) -> None:
    loaded = LOADERS[path.parent.name]()(path)
    assert loaded is not None
    if isinstance(loaded, EngineConfig):
        assert loaded.scheduler.max_batch_size <= loaded.scheduler.max_num_tokens
