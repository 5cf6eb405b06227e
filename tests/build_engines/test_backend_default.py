"""A spec without ``backend`` builds for the backend the installed TensorRT-LLM supports,
and the plan says which and why; an engine build on a release without engines is named
as what the machine lacks."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest
import yaml
from rich.console import Console

from build_engines.cli import EXIT_OK, EXIT_UNAVAILABLE, main
from build_engines.environment import Environment, default_backend, has_engine_backend
from orchestrator.common.specs import load_gpu_spec
from tests.build_engines.helpers import TOOLCHAIN, make_spec, ready_environment, spec_data

H100 = load_gpu_spec("h100-sxm")


@pytest.mark.parametrize(
    ("version", "engine"),
    [
        ("1.2.1", True),
        ("1.2.0rc6.post3", True),
        ("1.3.0rc20", True),
        ("1.3.0rc20.post1", True),
        ("1.3.0rc21", False),
        ("1.3.0", False),
        ("1.4.0rc4", False),
        ("0.21.0", True),
        ("nightly", None),
    ],
)
def test_which_releases_have_the_engine_backend(version: str, engine: bool | None) -> None:
    assert has_engine_backend(version) is engine


def test_the_default_follows_the_installed_release() -> None:
    assert default_backend("1.2.1").backend == "engine"
    assert default_backend("1.4.0rc4").backend == "pytorch"
    assert "has no engine backend" in default_backend("1.4.0rc4").reason
    none = default_backend(None)
    assert none.backend == "engine" and "not installed here" in none.reason


def write_spec_without_backend(tmp_path: Path) -> str:
    # Valid for both backends: no trtllm-build plugin section, no engine graph cache size.
    data: dict[str, Any] = spec_data(
        {"plugins": None, "runtime": {"cuda_graph_cache_size": None}, "output_dir": "out"}
    )
    del data["backend"]
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def plan_output(spec: str, version: str | None) -> str:
    buf = io.StringIO()
    code = main(
        ["plan", spec], console=Console(file=buf, width=250), trtllm_version=lambda: version
    )
    assert code == EXIT_OK, buf.getvalue()
    return buf.getvalue()


def test_the_plan_says_which_backend_a_spec_without_one_gets(tmp_path: Path) -> None:
    spec = write_spec_without_backend(tmp_path)
    newer = plan_output(spec, "1.4.0rc4")
    assert "pytorch (default: the installed TensorRT-LLM 1.4.0rc4 has no engine backend" in newer
    assert "trtllm-build --checkpoint_dir" not in newer  # no engine step
    older = plan_output(spec, "1.2.1")
    assert "engine (default: the installed TensorRT-LLM 1.2.1 has the engine backend)" in older
    assert "trtllm-build --checkpoint_dir" in older


def test_a_spec_that_names_its_backend_keeps_it(tmp_path: Path) -> None:
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(spec_data({"output_dir": "out"})))
    out = plan_output(str(path), "1.4.0rc4")
    assert "default:" not in out  # nothing was chosen for it
    assert "trtllm-build --checkpoint_dir" in out  # still an engine build


def test_an_engine_build_on_a_release_without_engines_is_refused(tmp_path: Path) -> None:
    newer = ready_environment()
    env = Environment(
        newer.has_tensorrt_llm,
        newer.trtllm_build,
        newer.quantize_script,
        newer.gpus,
        {"tensorrt_llm": "1.3.0rc24"},
    )
    (item,) = env.missing_for(make_spec(), H100, TOOLCHAIN)
    assert item.startswith("TensorRT-LLM 1.2.x for backend: engine (the installed 1.3.0rc24")
    assert (
        env.missing_for(
            make_spec(
                {"backend": "pytorch", "plugins": None, "runtime": {"cuda_graph_cache_size": None}}
            ),
            H100,
            TOOLCHAIN,
        )
        == []
    )
    path = tmp_path / "engine.yaml"
    path.write_text(yaml.safe_dump(spec_data({"output_dir": str(tmp_path / "out")})))
    buf = io.StringIO()
    code = main(
        ["build", str(path)], console=Console(file=buf, width=250), environment=lambda _: env
    )
    assert code == EXIT_UNAVAILABLE
    assert "has no engine backend; build with backend: pytorch" in buf.getvalue()
