"""The name checker, run here against the fake bindings (and broken copies of them)."""

from __future__ import annotations

import io
import types
from pathlib import Path
from typing import Any

from plugins.trtllm import check_names
from plugins.trtllm.names import BINDINGS, MODULE
from tests.trtllm import fake_tensorrt_llm
from tests.trtllm.builds import write_build


def run(module: Any, *argv: str) -> tuple[int, str]:
    out = io.StringIO()

    def import_module(name: str) -> Any:
        assert name == MODULE
        return module

    return check_names.main(list(argv), import_module=import_module, out=out), out.getvalue()


def copy_of_fake(**replaced: Any) -> types.SimpleNamespace:
    names = {n: getattr(fake_tensorrt_llm, n) for n in fake_tensorrt_llm.__all__}
    names.update(replaced)
    return types.SimpleNamespace(**{k: v for k, v in names.items() if v is not None})


def test_every_check_passes_on_the_fake() -> None:
    status, text = run(fake_tensorrt_llm)
    assert status == 0, text
    assert "MISSING" not in text
    ok = [line for line in text.splitlines() if line.startswith("OK ")]
    names = sum(1 + len(b.members) + len(b.attributes) for b in BINDINGS)
    constructions = len(check_names.representative_settings()) + len(
        check_names.REPRESENTATIVE_SAMPLING
    )
    assert len(ok) == names + constructions + 1  # + the keyword coverage check
    assert "OK       every listed constructor keyword was exercised" in text


def test_a_missing_class_is_reported() -> None:
    status, text = run(copy_of_fake(KvCacheStats=None))
    assert status == 1
    assert "MISSING  KvCacheStats: tensorrt_llm.bindings.executor has no KvCacheStats" in text
    assert "MISSING  KvCacheStats.max_num_blocks" in text


def test_a_renamed_constructor_keyword_is_reported() -> None:
    real = fake_tensorrt_llm.OutputConfig

    def output_config(*, return_log_probs: bool = False, exclude_input: bool = False) -> Any:
        return real(return_log_probs=return_log_probs, exclude_input_from_output=exclude_input)

    status, text = run(copy_of_fake(OutputConfig=output_config))
    assert status == 1
    assert "MISSING  Request (greedy): TypeError" in text
    assert "exclude_input_from_output" in text


def test_a_missing_method_is_reported() -> None:
    status, text = run(copy_of_fake(Executor=type("Executor", (), {"shutdown": None})))
    assert status == 1
    assert "MISSING  Executor.cancel_request: Executor has no 'cancel_request'" in text


def test_a_keyword_no_case_passes_is_reported() -> None:
    recorder = check_names.Recorder(fake_tensorrt_llm)
    for check in check_names.construction_checks(recorder)[:1]:  # executor config only
        assert check.run() is None
    reason = check_names.coverage_check(recorder).run()
    assert reason is not None and "Request(input_token_ids=)" in reason


def test_unimportable_bindings_exit_2() -> None:
    out = io.StringIO()

    def missing(name: str) -> Any:
        raise ImportError(f"No module named {name!r}")

    assert check_names.main([], import_module=missing, out=out) == 2
    assert "run this inside the NGC TensorRT-LLM container" in out.getvalue()


def test_live_run_generates_on_an_engine(tmp_path: Path) -> None:
    build = write_build(tmp_path / "build")
    status, text = run(fake_tensorrt_llm, "--engine-dir", str(build))
    assert status == 0, text
    assert f"OK       live run on {build}" in text
    assert "greedy tokens: [" in text


def test_live_run_reports_a_bad_folder(tmp_path: Path) -> None:
    status, text = run(fake_tensorrt_llm, "--engine-dir", str(tmp_path))
    assert status == 1
    assert f"MISSING  live run on {tmp_path}: could not start: ConfigError" in text
