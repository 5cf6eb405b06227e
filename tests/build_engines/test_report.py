"""The progress display shows each step's state."""

from __future__ import annotations

import io

from rich.console import Console

from build_engines.report import RichStepReporter


def test_progress_shows_each_state() -> None:
    buf = io.StringIO()
    console = Console(file=buf, width=160, force_terminal=False)
    with RichStepReporter(console, ["download", "quantize", "build", "verify"]) as reporter:
        reporter.skipped("download", "output up to date")
        reporter.started("quantize", "python quantize.py --qformat fp8")
        reporter.finished("quantize", 1234.5)
        reporter.started("build", "trtllm-build --workers 2")
        reporter.failed("build", "trtllm-build exited with status 1\nlast lines ...")
    out = buf.getvalue()
    assert "quantize: python quantize.py --qformat fp8" in out  # the command is echoed
    assert "skipped: output up to date" in out
    assert "done in 1,234.5 s" in out
    assert "failed: trtllm-build exited with status 1" in out
    assert "last lines" not in out.split("failed:")[1].splitlines()[0]
    assert "verify" in out and "pending" in out
