"""The step runners: how each step does its work. The pipeline takes them as a
``Runners`` value, so tests drive it with fakes and only these touch the Hub, the
TensorRT-LLM tools and the file system of a real build."""

from __future__ import annotations

import subprocess
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from build_engines.commands import ALLOW_PATTERNS, Layout
from build_engines.errors import BuildError
from build_engines.spec import BuildSpec, ModelSection
from build_engines.verify import verify_artifact
from orchestrator.common.build_manifest import Verification

_LOG_TAIL_LINES = 25


@dataclass(frozen=True)
class DownloadResult:
    """Where the checkpoint is, and the Hub commit it came from (``None`` when local)."""

    path: Path
    revision: str | None


Downloader = Callable[[ModelSection, Path], DownloadResult]
CommandRunner = Callable[[Sequence[str], Path], None]
Verifier = Callable[[BuildSpec, Layout], Verification]


@dataclass(frozen=True)
class Runners:
    """``download(model, target_dir)``; ``quantize(argv, log_path)`` and
    ``build(argv, log_path)`` run a command and raise ``BuildError`` when it fails;
    ``verify(spec, layout)`` inspects the artefact."""

    download: Downloader
    quantize: CommandRunner
    build: CommandRunner
    verify: Verifier


def run_logged(argv: Sequence[str], log_path: Path) -> None:
    """Run ``argv`` with stdout and stderr into ``log_path``; on failure raise a
    ``BuildError`` that quotes the end of the log."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    try:
        with log_path.open("w") as log:
            code = subprocess.run(list(argv), stdout=log, stderr=subprocess.STDOUT).returncode
    except FileNotFoundError:
        raise BuildError(f"{argv[0]}: command not found (is TensorRT-LLM installed?)") from None
    if code != 0:
        with log_path.open() as log:
            tail = "".join(deque(log, maxlen=_LOG_TAIL_LINES))
        raise BuildError(
            f"{Path(argv[0]).name} exited with status {code}; last lines of {log_path}:\n{tail}"
        )


def check_local_checkpoint(path: Path) -> None:
    """A usable HF checkpoint folder has config.json and safetensors weights."""
    if not path.is_dir():
        raise BuildError(f"model.source: {path} is not a folder")
    if not (path / "config.json").is_file():
        raise BuildError(f"model.source: {path} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise BuildError(f"model.source: {path} has no *.safetensors weights")


class HubDownloader:
    """Fetch a Hub checkpoint at a pinned revision, or accept a local folder.

    The branch or tag in the spec is first resolved to a commit, and that exact commit is
    downloaded and reported, so the manifest names what was built even for ``main``.
    The Hub functions are parameters so tests can exercise the error paths offline.
    """

    def __init__(
        self,
        snapshot_download: Callable[..., Any] | None = None,
        model_info: Callable[..., Any] | None = None,
        get_token: Callable[[], str | None] | None = None,
    ) -> None:
        self._snapshot_download = snapshot_download
        self._model_info = model_info
        self._get_token = get_token

    def __call__(self, model: ModelSection, target: Path) -> DownloadResult:
        if model.is_local:
            path = Path(model.source).expanduser()
            check_local_checkpoint(path)
            return DownloadResult(path, None)
        import huggingface_hub
        from huggingface_hub.errors import (
            GatedRepoError,
            RepositoryNotFoundError,
            RevisionNotFoundError,
        )

        snapshot_download = self._snapshot_download or huggingface_hub.snapshot_download
        model_info = self._model_info or huggingface_hub.model_info
        get_token = self._get_token or huggingface_hub.get_token
        repo, revision = model.source, model.revision
        try:
            commit = model_info(repo, revision=revision).sha
            snapshot_download(
                repo, revision=commit, allow_patterns=list(ALLOW_PATTERNS), local_dir=target
            )
        except GatedRepoError:
            if get_token() is None:
                hint = "set HF_TOKEN (or run `hf auth login`) for an account that has"
            else:
                hint = "the Hugging Face token in use belongs to an account that has not"
            raise BuildError(
                f"model.source: {repo} is gated: {hint} accepted its licence on "
                f"https://huggingface.co/{repo}"
            ) from None
        except RevisionNotFoundError:
            raise BuildError(f"model.revision: {revision!r} does not exist in {repo}") from None
        except RepositoryNotFoundError:
            raise BuildError(
                f"model.source: {repo!r} is not a Hub repository you can see (a private "
                "repository also needs HF_TOKEN; a local folder must start with / . or ~)"
            ) from None
        except OSError as err:
            raise BuildError(f"downloading {repo}@{revision} failed: {err}") from err
        return DownloadResult(target, commit)


def default_runners() -> Runners:
    """The runners of a real build."""
    return Runners(
        download=HubDownloader(),
        quantize=run_logged,
        build=run_logged,
        verify=verify_artifact,
    )
