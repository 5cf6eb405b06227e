"""Facts and refusals between the serving process and rank 0's worker process.

With more than one tensor-parallel rank TensorRT-LLM runs every rank, rank 0 included,
in MPI worker processes (``workers``), so the in-process ``FactsChannel`` and
``RefusalChannel`` cannot reach the scheduler. Here the serving process hosts a
``multiprocessing.connection.Listener`` on an AF_UNIX socket in a private temporary
directory (``tempfile.mkdtemp``: mode 0700) with a random 32-byte authkey (the
connection's HMAC challenge: only a process given the key connects, so what arrives
may be unpickled); rank 0's scheduler connects with ``Client``. Messages (pickled
tuples):

- serving process to rank 0: ``("facts", {request_id: RequestFacts})``, one per
  ``submitting()`` block;
- rank 0 to the serving process: ``("hello", rank)`` once connected, and
  ``("refused", request_id, reason)`` for each refusal.

Across processes the facts cannot be guaranteed to arrive before the request (the
request reaches the worker through TensorRT-LLM's own queue, the facts through this
socket), so ``WorkerLink.facts_wait_s`` tells the adapter how long to hold a request
whose facts have not arrived. A broken or closed connection never raises into
TensorRT-LLM's loop: it is logged, further facts are not awaited (the wait drops to
0, so requests take the defaults at once) and refusals go unheard (logged).
"""

from __future__ import annotations

import logging
import os
import secrets
import shutil
import socket
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from multiprocessing.connection import Client, Connection, Listener
from typing import Any

from plugins.trtllm.in_executor.facts import RequestFacts
from plugins.trtllm.in_executor.refusals import RefusalChannel

logger = logging.getLogger(__name__)

FAMILY = "AF_UNIX"
POLL_S = 0.1  # how often a reader checks whether its channel was closed
JOIN_S = 5.0  # the longest wait for a reader or the accept thread at close
# The longest a request whose facts have not reached rank 0 is held out of the schedule
# before it is admitted with the defaults (seconds). Facts are sent right after
# generate_async returns, so they normally arrive within milliseconds of the request.
FACTS_WAIT_S = 1.0
MAX_PENDING = 10_000  # facts kept for a worker not yet connected (oldest dropped first)


@dataclass(frozen=True)
class ChannelAddress:
    """Where rank 0 connects: the socket path and the authkey (picklable: it travels
    to the worker inside ``workers.WorkerSetup``)."""

    path: str
    authkey: bytes


class ChannelHost:
    """The serving process's end: accepts rank 0's connection (a rebuilt executor may
    connect again: the newest connection is the live one), sends each ``submitting()``
    block's facts, and hands refusals to ``refusals`` (a ``RefusalChannel`` the backend
    listens to). Thread-safe. ``close()`` closes everything and removes the directory."""

    def __init__(self) -> None:
        self._dir = tempfile.mkdtemp(prefix="orchestrator-in-executor-")
        self.address = ChannelAddress(
            os.path.join(self._dir, "channel.sock"), secrets.token_bytes(32)
        )
        try:
            self._listener = Listener(
                self.address.path, family=FAMILY, authkey=self.address.authkey
            )
        except BaseException:
            shutil.rmtree(self._dir, ignore_errors=True)
            raise
        self.refusals = RefusalChannel()
        self._lock = threading.Lock()  # guards _conn, _pending and every send
        self._conn: Connection | None = None
        self._pending: dict[int, RequestFacts] = {}
        self._closed = threading.Event()
        self._hello = threading.Event()
        self._threads: list[threading.Thread] = []
        self._start(self._accept, "in-executor-accept")

    @property
    def directory(self) -> str:
        return self._dir

    def _start(self, target: Any, name: str, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                conn = self._listener.accept()
            except OSError:  # the listener was closed
                return
            except Exception:  # a peer without the key (or close()'s wake-up): refused
                if self._closed.is_set():
                    return
                logger.warning("in-executor channel: refused a connection", exc_info=True)
                continue
            if self._closed.is_set():
                conn.close()  # close()'s own wake-up connection
                return
            with self._lock:
                if self._conn is not None:
                    self._conn.close()
                self._conn = conn
                pending, self._pending = self._pending, {}
                if pending:
                    self._send_locked(pending)
            self._start(self._read, "in-executor-refusals", conn)

    def _read(self, conn: Connection) -> None:
        try:
            while not self._closed.is_set():
                if not conn.poll(POLL_S):
                    continue
                message = conn.recv()
                if message[0] == "hello":
                    logger.info("in-executor channel: rank %d connected", message[1])
                    self._hello.set()
                elif message[0] == "refused":
                    self.refusals.refuse(int(message[1]), str(message[2]))
        except (EOFError, OSError):
            if not self._closed.is_set():
                logger.warning("in-executor channel: rank 0's connection closed")

    def wait_connected(self, timeout_s: float) -> bool:
        """Whether rank 0's scheduler has connected, waiting up to ``timeout_s``."""
        return self._hello.wait(timeout_s)

    @contextmanager
    def submitting(self) -> Iterator[dict[int, RequestFacts]]:
        """As ``FactsChannel.submitting``: put ``{request_id: facts}`` into the yielded
        map; they are sent when the block ends (kept, up to ``MAX_PENDING``, until rank 0
        connects; dropped with a log line if the connection is broken or closed)."""
        staged: dict[int, RequestFacts] = {}
        try:
            yield staged
        finally:
            if staged:
                with self._lock:
                    if self._closed.is_set():
                        logger.warning(
                            "in-executor channel closed: facts of %d requests dropped",
                            len(staged),
                        )
                    elif self._conn is None:
                        self._pending.update(staged)
                        while len(self._pending) > MAX_PENDING:
                            self._pending.pop(next(iter(self._pending)))
                    else:
                        self._send_locked(staged)

    def _send_locked(self, facts: dict[int, RequestFacts]) -> None:
        assert self._conn is not None
        try:
            self._conn.send(("facts", facts))
        except (OSError, ValueError):
            logger.warning(
                "in-executor channel: rank 0 unreachable, facts of %d requests dropped",
                len(facts),
                exc_info=True,
            )
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        """Close the listener and the connection, wait for the threads (bounded) and
        remove the directory; safe to call twice."""
        if self._closed.is_set():
            return
        self._closed.set()
        # Wakes the accept thread (closing a listening socket does not, on Linux) with a
        # bare connection: its handshake fails there, and it sees the channel closed. Not
        # multiprocessing's Client, whose handshake would wait forever for an accept
        # thread that already saw the channel closed and left.
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as wake:
                wake.connect(self.address.path)
        except OSError:
            logger.debug("in-executor channel: no wake-up connection", exc_info=True)
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
        for thread in self._threads:
            thread.join(JOIN_S)
        self._listener.close()
        shutil.rmtree(self._dir, ignore_errors=True)


class WorkerLink:
    """Rank 0's end, in its worker process: a facts source and a refusal sink for the
    adapter (``take``, ``facts_wait_s``; ``refuse``). Connects at construction; if it
    cannot, or the connection breaks later, it logs once and stays usable: ``take``
    finds only what arrived, ``facts_wait_s`` is 0 and ``refuse`` returns ``False``.
    Never raises into the caller (TensorRT-LLM's executor loop)."""

    def __init__(self, address: ChannelAddress, rank: int, wait_s: float = FACTS_WAIT_S) -> None:
        self._wait_s = wait_s
        self._lock = threading.Lock()
        self._facts: dict[int, RequestFacts] = {}
        self._closed = threading.Event()
        self._broken = threading.Event()
        self._arrived = threading.Event()
        self._send_lock = threading.Lock()
        self._conn: Connection | None = None
        self._reader: threading.Thread | None = None
        try:
            self._conn = Client(address.path, family=FAMILY, authkey=address.authkey)
            self._conn.send(("hello", rank))
        except Exception:
            logger.exception(
                "in-executor channel: rank %d cannot reach the serving process; requests "
                "take the default facts and refusals go unheard",
                rank,
            )
            self._broken.set()
            return
        self._reader = threading.Thread(target=self._read, name="in-executor-facts", daemon=True)
        self._reader.start()

    @property
    def connected(self) -> bool:
        return not self._broken.is_set()

    @property
    def facts_wait_s(self) -> float:
        """How long the adapter holds a request whose facts have not arrived (seconds):
        ``wait_s`` while connected, 0 once the connection is gone (none will come)."""
        return 0.0 if self._broken.is_set() else self._wait_s

    def _read(self) -> None:
        assert self._conn is not None
        try:
            while not self._closed.is_set():
                if not self._conn.poll(POLL_S):
                    continue
                kind, facts = self._conn.recv()
                if kind == "facts":
                    with self._lock:
                        self._facts.update(facts)
                    self._arrived.set()
        except (EOFError, OSError):
            if not self._closed.is_set():
                logger.warning(
                    "in-executor channel: the serving process's connection closed; "
                    "requests from now on take the default facts"
                )
        finally:
            self._broken.set()
            self._arrived.set()  # an idle wait for facts that will not come ends now

    def take(self, request_id: int) -> RequestFacts | None:
        """The facts that arrived for ``request_id``, removed; ``None`` if none yet."""
        with self._lock:
            return self._facts.pop(request_id, None)

    def wait_for_facts(self, timeout_s: float) -> bool:
        """Block up to ``timeout_s`` seconds for facts from the serving process (or the
        connection's end); whether either came (see ``facts.FactsSource``)."""
        arrived = self._arrived.wait(timeout_s)
        self._arrived.clear()
        return arrived

    def __len__(self) -> int:
        with self._lock:
            return len(self._facts)

    def refuse(self, request_id: int, reason: str) -> bool:
        """Send a refusal to the serving process; whether it was sent. Never raises."""
        if self._conn is None or self._broken.is_set():
            return False
        try:
            with self._send_lock:
                self._conn.send(("refused", request_id, reason))
        except Exception:
            logger.warning("the refusal of request %d could not be sent", request_id)
            self._broken.set()
            return False
        return True

    def close(self) -> None:
        self._closed.set()
        if self._reader is not None:
            self._reader.join(JOIN_S)
        if self._conn is not None:
            self._conn.close()
