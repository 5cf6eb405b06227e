"""Named checks and their report: the form both TensorRT-LLM name checkers
(``build_engines.check_trtllm_names`` for the build pipeline, ``plugins.trtllm.check_names``
for the executors) print their findings in, one ``OK`` or ``MISSING`` line per check."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO


@dataclass(frozen=True)
class NameCheck:
    """``run`` returns ``None`` when the name exists, else why it does not."""

    label: str
    run: Callable[[], str | None]


def run_checks(checks: Sequence[NameCheck], out: TextIO) -> int:
    """Print each check; return how many failed."""
    missing = 0
    for check in checks:
        reason = check.run()
        if reason is None:
            print(f"OK       {check.label}", file=out)
        else:
            missing += 1
            print(f"MISSING  {check.label}: {reason}", file=out)
    print(f"{len(checks)} checks, {missing} missing", file=out)
    return missing
