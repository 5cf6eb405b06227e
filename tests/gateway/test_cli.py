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
