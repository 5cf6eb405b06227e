"""The real runners, exercised offline: subprocess logging and the Hub error paths."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError, RevisionNotFoundError

from build_engines.errors import BuildError
from build_engines.runners import HubDownloader, run_logged
from build_engines.spec import ModelSection

HUB = ModelSection(spec="llama3-8b", source="meta-llama/Meta-Llama-3-8B-Instruct", revision="main")
COMMIT = "c" * 40


def test_run_logged_writes_the_log(tmp_path: Path) -> None:
    log = tmp_path / "logs" / "step.log"
    run_logged(
        [sys.executable, "-c", "print('hello'); import sys; print('err', file=sys.stderr)"], log
    )
    assert log.read_text().split() == ["hello", "err"]


def test_run_logged_failure_quotes_the_log_tail(tmp_path: Path) -> None:
    log = tmp_path / "step.log"
    code = "import sys\nfor i in range(40): print('line', i)\nsys.exit(3)"
    with pytest.raises(BuildError) as err:
        run_logged([sys.executable, "-c", code], log)
    message = str(err.value)
    assert "exited with status 3" in message and str(log) in message
    assert "line 39" in message and "line 14\n" not in message  # only the last 25 lines


def test_run_logged_missing_command(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match="no-such-trtllm-build: command not found"):
        run_logged(["no-such-trtllm-build", "--help"], tmp_path / "x.log")


class FakeHub:
    def __init__(self, error: Exception | None = None, token: str | None = None) -> None:
        self.error = error
        self.token = token
        self.downloads: list[dict[str, Any]] = []

    def model_info(self, repo: str, revision: str | None = None) -> Any:
        return type("Info", (), {"sha": COMMIT})()

    def snapshot_download(self, repo: str, **kwargs: Any) -> str:
        if self.error is not None:
            raise self.error
        self.downloads.append({"repo": repo, **kwargs})
        return str(kwargs["local_dir"])

    def downloader(self) -> HubDownloader:
        return HubDownloader(self.snapshot_download, self.model_info, lambda: self.token)


def hub_error(cls: type[Exception]) -> Exception:
    # The Hub's HTTP errors need a live response to construct; none is needed here.
    err = cls.__new__(cls)
    Exception.__init__(err, "HTTP error")
    return err


def test_download_pins_the_resolved_commit(tmp_path: Path) -> None:
    hub = FakeHub()
    result = hub.downloader()(HUB, tmp_path / "hf")
    assert result.revision == COMMIT and result.path == tmp_path / "hf"
    (call,) = hub.downloads
    assert call["revision"] == COMMIT  # the commit, not the moving branch name
    assert call["allow_patterns"] == ["*.json", "*.safetensors", "tokenizer*"]


def test_gated_without_token(tmp_path: Path) -> None:
    hub = FakeHub(hub_error(GatedRepoError), token=None)
    with pytest.raises(BuildError, match=r"is gated: set HF_TOKEN .* accepted its licence"):
        hub.downloader()(HUB, tmp_path)


def test_gated_with_token_of_wrong_account(tmp_path: Path) -> None:
    hub = FakeHub(hub_error(GatedRepoError), token="hf_x")
    with pytest.raises(BuildError, match="token in use belongs to an account that has not"):
        hub.downloader()(HUB, tmp_path)


def test_unknown_repo_and_revision(tmp_path: Path) -> None:
    with pytest.raises(BuildError, match=r"model\.source: .* is not a Hub repository"):
        FakeHub(hub_error(RepositoryNotFoundError)).downloader()(HUB, tmp_path)
    with pytest.raises(BuildError, match=r"model\.revision: 'main' does not exist"):
        FakeHub(hub_error(RevisionNotFoundError)).downloader()(HUB, tmp_path)


def test_local_folder_is_checked_not_downloaded(tmp_path: Path) -> None:
    model = ModelSection(spec="llama3-8b", source=str(tmp_path))
    hub = FakeHub()
    with pytest.raises(BuildError, match=r"has no config\.json"):
        hub.downloader()(model, tmp_path / "unused")
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(BuildError, match=r"has no \*\.safetensors"):
        hub.downloader()(model, tmp_path / "unused")
    (tmp_path / "model.safetensors").write_bytes(b"\0")
    result = hub.downloader()(model, tmp_path / "unused")
    assert result.path == tmp_path and result.revision is None
    assert hub.downloads == []
