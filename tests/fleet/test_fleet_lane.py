"""The fleet lane: Dynamo's real frontend and two of our workers, driven by the official
``openai`` client (the tests are in ``fleet_inner.py``).

Dynamo's TCP planes bind the machine's outward address unless told otherwise, and a
worker with KV routing on opens ZMQ event-plane sockets on 0.0.0.0, so the lane runs in
a private network namespace (``unshare --net``, loopback up): nothing it opens is
reachable from outside, whatever Dynamo binds. It skips, saying why, where Dynamo's
venv (``.venv-dynamo``, built by ``make install``) or the namespace is missing.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DYNAMO_PYTHON = ROOT / ".venv-dynamo" / "bin" / "python"
INNER = Path(__file__).with_name("fleet_inner.py")
# The lane's own budget (s): two model loads on two cores, then a minute of requests.
LANE_TIMEOUT_S = 330


def _skip_reason() -> str | None:
    if not DYNAMO_PYTHON.exists():
        return f"{DYNAMO_PYTHON} is missing: `make install` builds Dynamo's venv"
    probe = subprocess.run(
        [str(DYNAMO_PYTHON), "-c", "import dynamo.frontend, dynamo.common.backend"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if probe.returncode != 0:
        return f"Dynamo is not importable in .venv-dynamo: {probe.stderr.strip()[-300:]}"
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        return "unshare or ip (util-linux, iproute2) is missing: no private network namespace"
    try:
        trial = subprocess.run(
            ["unshare", "--net", "ip", "link", "set", "lo", "up"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except subprocess.TimeoutExpired:
        return "unshare --net did not answer within 30 s"
    if trial.returncode != 0:
        return f"a private network namespace is refused here: {trial.stderr.strip()}"
    return None


@pytest.mark.slow
@pytest.mark.timeout(LANE_TIMEOUT_S + 60)
def test_the_fleet_lane_passes_in_a_private_network_namespace() -> None:
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    inner = [sys.executable, "-m", "pytest", str(INNER), "-v", "-x", "-p", "no:cacheprovider"]
    command = ["unshare", "--net", "sh", "-c", 'ip link set lo up && exec "$@"', "sh", *inner]
    env = {**os.environ, "ORCHESTRATOR_FLEET_NETNS": "1"}
    # A session of its own, so a timeout kills the lane's every process at once.
    proc = subprocess.Popen(
        command,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    timed_out = False
    try:
        output, _ = proc.communicate(timeout=LANE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        timed_out = True
        os.killpg(proc.pid, signal.SIGKILL)
        output, _ = proc.communicate()
    finally:
        # Whatever the inner run left behind (it kills its own processes; this is for a
        # run that was itself killed) shares the session.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    assert not timed_out, f"the fleet lane ran past {LANE_TIMEOUT_S} s:\n{output[-6000:]}"
    assert proc.returncode == 0, output[-8000:]
    # Inside the namespace nothing may skip: a skipped test there is a lane that did not run.
    summary = output.strip().splitlines()[-1]
    assert "passed" in summary and "skipped" not in summary, output[-4000:]
