"""The facts and refusal channel between the serving process and rank 0's worker
(plugins/trtllm/in_executor/channel.py), both ends in this process over the real
AF_UNIX socket; and what reaches the workers (workers.py) without starting any."""

from __future__ import annotations

import functools
import os
import pickle
import socket
import stat
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest

from plugins.trtllm.errors import TrtllmError
from plugins.trtllm.in_executor import workers
from plugins.trtllm.in_executor.channel import ChannelAddress, ChannelHost, WorkerLink
from plugins.trtllm.in_executor.facts import RequestFacts
from plugins.trtllm.in_executor.start import InExecutor
from tests.trtllm import fake_mpi
from tests.trtllm.test_in_executor_tp import core_config

WAIT_FOR_S = 10.0


def eventually(done: Callable[[], Any], what: str) -> Any:
    deadline = time.monotonic() + WAIT_FOR_S
    while not (value := done()):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)
    return value


@pytest.fixture
def host() -> Any:
    channel = ChannelHost()
    yield channel
    channel.close()


def test_facts_flow_to_rank_zero_and_refusals_back(host: ChannelHost) -> None:
    mode = os.stat(host.directory).st_mode
    assert stat.S_IMODE(mode) == 0o700, "a private directory"
    with host.submitting() as staged:
        staged[1] = RequestFacts(priority=2, tenant="early")  # before rank 0 connects
    heard: list[tuple[int, str]] = []
    host.refusals.listen(lambda rid, why: heard.append((rid, why)))
    link = WorkerLink(host.address, rank=0, wait_s=0.7)
    try:
        assert host.wait_connected(WAIT_FOR_S) and link.connected
        assert link.facts_wait_s == 0.7
        with host.submitting() as staged:
            staged[2] = RequestFacts(priority=-1, slo_class="chat")
        eventually(lambda: len(link) == 2, "the facts")
        assert link.take(1) == RequestFacts(priority=2, tenant="early")
        assert link.take(2) == RequestFacts(priority=-1, slo_class="chat")
        assert link.take(2) is None, "taken once"
        assert link.refuse(7, "too long") is True
        eventually(lambda: heard, "the refusal")
        assert heard == [(7, "too long")]
    finally:
        link.close()


def test_a_peer_without_the_key_is_refused_and_the_host_keeps_listening(
    host: ChannelHost,
) -> None:
    stranger = WorkerLink(ChannelAddress(host.address.path, b"wrong" * 4), rank=0)
    assert not stranger.connected and stranger.facts_wait_s == 0.0
    assert stranger.refuse(1, "x") is False and stranger.take(1) is None
    link = WorkerLink(host.address, rank=0)
    try:
        assert host.wait_connected(WAIT_FOR_S) and link.connected
    finally:
        link.close()


def test_closing_the_host_breaks_the_link_without_raising_and_removes_the_socket(
    host: ChannelHost,
) -> None:
    link = WorkerLink(host.address, rank=0, wait_s=5.0)
    try:
        assert host.wait_connected(WAIT_FOR_S)
        directory = host.directory
        host.close()
        host.close()  # twice is fine
        assert not os.path.exists(directory)
        eventually(lambda: not link.connected, "the link to notice")
        assert link.facts_wait_s == 0.0, "nothing more is awaited"
        assert link.refuse(3, "no") is False
        with host.submitting() as staged:  # dropped with a log line, never raised
            staged[9] = RequestFacts()
    finally:
        link.close()
    late = WorkerLink(host.address, rank=0)  # nothing listens any more
    assert not late.connected and late.take(9) is None


def test_reach_workers_binds_a_picklable_setup_and_undo_restores() -> None:
    original = fake_mpi.PROXY.worker_main
    host = ChannelHost()
    setup = workers.WorkerSetup(core_config(), 16, host.address, 0.5, fake_mpi.import_fake)
    undo = workers.reach_workers(setup, fake_mpi.import_fake)
    try:
        bound = fake_mpi.PROXY.worker_main
        assert isinstance(bound, functools.partial) and bound.func is workers.worker_main
        copy = pickle.loads(pickle.dumps(bound))  # as mpi4py sends it to every rank
        assert copy.func is workers.worker_main and copy.args[0] == setup
        with pytest.raises(TrtllmError, match="already reaches the workers"):
            workers.reach_workers(setup, fake_mpi.import_fake)
    finally:
        undo()
        host.close()
    assert fake_mpi.PROXY.worker_main is original


def test_start_up_is_refused_when_rank_zero_never_connects(host: ChannelHost) -> None:
    mode = InExecutor(None, host, host.refusals, [], lambda: None, host)  # type: ignore[arg-type]
    with pytest.raises(TrtllmError, match=r"did not connect within 0\.2 s.*RPC and Ray"):
        mode.check_started(0.2)
    link = WorkerLink(host.address, rank=0)
    try:
        mode.check_started(WAIT_FOR_S)  # connected: nothing raised
    finally:
        link.close()
    one_rank = InExecutor(None, host, host.refusals, [], lambda: None)  # type: ignore[arg-type]
    with pytest.raises(TrtllmError, match="built its executor without our scheduler"):
        one_rank.check_started()


def test_close_returns_when_the_accept_thread_has_already_left() -> None:
    """close() right after rank 0 connects can find the accept thread gone: it saw the
    channel closed before calling accept() again. The wake-up connection must not wait
    for an answer then (multiprocessing's Client waited forever for the handshake)."""
    host = ChannelHost()
    accept_thread = host._threads[0]
    host._closed.set()  # the accept thread leaves at its next turn
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as nudge:
        nudge.connect(host.address.path)
    accept_thread.join(WAIT_FOR_S)
    assert not accept_thread.is_alive()
    host._closed.clear()  # as it was when close() was called
    closer = threading.Thread(target=host.close, daemon=True)
    closer.start()
    closer.join(WAIT_FOR_S)
    assert not closer.is_alive(), "close() waited on a wake-up nobody answers"
    assert not os.path.exists(host.directory)


def test_arriving_facts_and_a_closed_channel_end_rank_zeros_idle_wait(host: ChannelHost) -> None:
    link = WorkerLink(host.address, rank=0)
    try:
        assert host.wait_connected(WAIT_FOR_S)
        assert link.wait_for_facts(0.0) is False
        with host.submitting() as staged:
            staged[3] = RequestFacts()
        assert link.wait_for_facts(WAIT_FOR_S) is True, "woken by the facts"
        host.close()
        assert link.wait_for_facts(WAIT_FOR_S) is True, "woken by the connection's end"
        assert not link.connected
    finally:
        link.close()
