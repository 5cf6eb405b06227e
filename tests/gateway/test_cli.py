"""The ``serve`` sub-command's registration and its handling of a bad config file."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from orchestrator.gateway import cli


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="orchestrator")
    cli.register(p.add_subparsers(dest="command", required=True))
    return p


def test_serve_parses_its_options() -> None:
    args = parser().parse_args(
        ["serve", "--config", "configs/serve/smollm2-cpu.yaml", "--host", "0.0.0.0", "--port", "9"]
    )
    assert args.func is cli.run
    assert (args.config, args.host, args.port) == (
        Path("configs/serve/smollm2-cpu.yaml"),
        "0.0.0.0",
        9,
    )


def test_serve_requires_a_config() -> None:
    with pytest.raises(SystemExit):
        parser().parse_args(["serve"])


def test_a_bad_config_exits_2_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("executor: {type: torch}\nserver: {prot: 1}\n")
    args = parser().parse_args(["serve", "--config", str(bad)])
    assert args.func(args) == 2
    assert "server.prot: unknown key" in capsys.readouterr().err


def test_doctor_reports_what_this_machine_would_run(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator.cli import main

    assert main(["doctor", "--config", "configs/serve/smollm2-cpu.yaml"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("orchestrator ")
    for key in ("cpu:", "cpu_features:", "kernels:", "dtype:", "weights:"):
        assert f"  {key}" in out
    assert main(["doctor", "--config", "configs/serve/llama3-70b-fp8-h100-trtllm.yaml"]) == 0
    assert "no platform report" in capsys.readouterr().out


def test_doctor_names_an_override_this_cpu_cannot_run(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    from orchestrator.cli import main

    monkeypatch.setenv("ORCHESTRATOR_CPU_ISA", "no-such-isa")
    assert main(["doctor", "--config", "configs/serve/smollm2-cpu.yaml"]) == 2
    assert "no CPU kernel variant 'no-such-isa'" in capsys.readouterr().err
