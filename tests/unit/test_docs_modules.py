"""Every module of the project that docs/*.md and README.md name exists where they say:
file paths (``plugins/torch_executor/native.py``) and dotted names
(``orchestrator.common.build_manifest.load_manifest``: the longest prefix that is a
module, then a name that module defines)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOPS = "orchestrator|plugins|build_engines"
PATH = re.compile(rf"\b((?:{TOPS})/[\w/]*\w\.py)\b")
DOTTED = re.compile(rf"\b((?:{TOPS})(?:\.\w+)+)")
# Dotted names the docs use that are not modules: an entry-point group and a logger.
NOT_MODULES = {"orchestrator.executors", "orchestrator.gateway.requests"}


def documents() -> list[Path]:
    return [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]


def module_source(parts: list[str]) -> Path | None:
    base = ROOT.joinpath(*parts)
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def missing_dotted(name: str) -> str | None:
    """Why ``name`` names nothing, or ``None`` when it does."""
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        source = module_source(parts[:i])
        if source is None:
            continue
        rest = parts[i:]
        if rest and not re.search(rf"\b{re.escape(rest[0])}\b", source.read_text()):
            return f"{'.'.join(parts[:i])} defines no {rest[0]}"
        return None
    return "no such module"


def test_every_module_the_docs_name_exists() -> None:
    stale = []
    for doc in documents():
        text = doc.read_text()
        where = doc.relative_to(ROOT)
        stale += [f"{where}: {p}" for p in PATH.findall(text) if not (ROOT / p).is_file()]
        for name in set(DOTTED.findall(text)) - NOT_MODULES:
            why = missing_dotted(name)
            if why:
                stale.append(f"{where}: {name} ({why})")
    assert stale == []


def test_the_check_refuses_a_moved_module() -> None:
    assert missing_dotted("build_engines.manifest.load_manifest") == "no such module"
    assert missing_dotted("orchestrator.common.build_manifest.load_manifest") is None
    assert missing_dotted("orchestrator.common.build_manifest.no_such_name")
