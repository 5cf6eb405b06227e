"""Verification against a hand-written engine config.json in TensorRT-LLM 1.2.x layout."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from build_engines.commands import Layout
from build_engines.verify import compare, verify_artifact, verify_checkpoint, verify_engine
from tests.build_engines.helpers import PYTORCH, make_spec

DATA = Path(__file__).parent / "data" / "engine_config_llama3_70b_fp8_tp2.json"
DELETE = object()  # edit() value that removes the key


@pytest.fixture
def layout(tmp_path: Path) -> Layout:
    layout = Layout(tmp_path)
    layout.engine_dir.mkdir()
    shutil.copy(DATA, layout.engine_dir / "config.json")
    for rank in (0, 1):
        (layout.engine_dir / f"rank{rank}.engine").write_bytes(b"\0")
    return layout


def edit(layout: Layout, key: str, value: Any) -> None:
    path = layout.engine_dir / "config.json"
    config = json.loads(path.read_text())
    *parents, leaf = key.split(".")
    node = config
    for part in parents:
        node = node[part]
    if value is DELETE:
        del node[leaf]
    else:
        node[leaf] = value
    path.write_text(json.dumps(config))


def test_matching_engine_passes(layout: Layout) -> None:
    result = verify_engine(make_spec(), layout)
    assert result.passed, result.differences
    assert "build_config.plugin_config.use_fp8_context_fmha" in result.checked
    assert "rank1.engine" in result.checked


@pytest.mark.parametrize(
    ("key", "value", "expected"),
    [
        # trtllm-build's silent overrides, as they would show up in the engine.
        (
            "build_config.plugin_config.reduce_fusion",
            False,
            "build_config.plugin_config.reduce_fusion: asked True, config.json has False",
        ),
        (
            "build_config.max_num_tokens",
            4096,
            "build_config.max_num_tokens: asked 8192, config.json has 4096",
        ),
        (
            "build_config.plugin_config.use_paged_context_fmha",
            False,
            "build_config.plugin_config.use_paged_context_fmha: asked True, config.json has False",
        ),
        (
            "pretrained_config.quantization.kv_cache_quant_algo",
            None,
            "pretrained_config.quantization.kv_cache_quant_algo: asked 'FP8', config.json has None",
        ),
        (
            "pretrained_config.mapping.tp_size",
            1,
            "pretrained_config.mapping.tp_size: asked 2, config.json has 1",
        ),
        # A flag that came back as a number is not the boolean asked for.
        (
            "build_config.plugin_config.multiple_profiles",
            1,
            "build_config.plugin_config.multiple_profiles: asked True, config.json has 1",
        ),
        (
            "build_config.plugin_config.tokens_per_block",
            DELETE,
            "build_config.plugin_config.tokens_per_block: missing from config.json",
        ),
    ],
)
def test_each_difference_is_named(layout: Layout, key: str, value: Any, expected: str) -> None:
    edit(layout, key, value)
    result = verify_engine(make_spec(), layout)
    assert not result.passed
    assert result.differences == [expected]


def test_enum_case_is_not_a_difference(layout: Layout) -> None:
    edit(layout, "build_config.kv_cache_type", "paged")
    assert verify_engine(make_spec(), layout).passed


def test_missing_rank_file(layout: Layout) -> None:
    (layout.engine_dir / "rank1.engine").unlink()
    result = verify_engine(make_spec(), layout)
    assert result.differences == [f"rank1.engine: missing from {layout.engine_dir}"]


def test_missing_or_broken_config(layout: Layout) -> None:
    path = layout.engine_dir / "config.json"
    path.write_text("{not json")
    assert "not valid JSON" in verify_engine(make_spec(), layout).differences[0]
    path.unlink()
    assert "cannot read" in verify_engine(make_spec(), layout).differences[0]


def test_compare_reports_every_key() -> None:
    expected = {"a.b": 1, "a.c": True, "d": "x"}
    actual = {"a": {"b": 2, "c": True}}
    assert compare(expected, actual, "f.json") == [
        "a.b: asked 1, f.json has 2",
        "d: missing from f.json",
    ]


def write_checkpoint(layout: Layout, quant: dict[str, Any] | None) -> None:
    layout.checkpoint_dir.mkdir(parents=True)
    (layout.checkpoint_dir / "config.json").write_text("{}")
    (layout.checkpoint_dir / "model-00001-of-00002.safetensors").write_bytes(b"\0")
    if quant is not None:
        (layout.checkpoint_dir / "hf_quant_config.json").write_text(
            json.dumps({"producer": {"name": "modelopt"}, "quantization": quant})
        )


def test_pytorch_checkpoint_passes(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    write_checkpoint(layout, {"quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})
    result = verify_artifact(make_spec(PYTORCH), layout)
    assert result.passed, result.differences


def test_pytorch_checkpoint_without_fp8_kv_fails(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    write_checkpoint(layout, {"quant_algo": "FP8", "kv_cache_quant_algo": None})
    result = verify_checkpoint(make_spec(PYTORCH), layout)
    assert result.differences == [
        "quantization.kv_cache_quant_algo: asked 'FP8', hf_quant_config.json has None"
    ]


def test_pytorch_checkpoint_without_quant_config_fails(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    write_checkpoint(layout, None)
    result = verify_checkpoint(make_spec(PYTORCH), layout)
    assert not result.passed
    assert "hf_quant_config.json: cannot read" in result.differences[0]
