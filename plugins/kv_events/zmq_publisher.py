"""The engine's KV events on ZMQ, in vLLM's wire format (vLLM 0.32,
``vllm/distributed/kv_events.py``), for llm-d's precise prefix-cache scorer and any other
consumer of vLLM's KV events.

The wire format, as vLLM's ``ZmqEventPublisher`` sends it:

- a PUB socket sends one multipart message per batch: ``topic`` (UTF-8), the batch's
  sequence number (8 bytes, big-endian, from 0, one per batch) and the msgpack payload;
- the payload is vLLM's ``KVEventBatch``, an array ``[ts, events, data_parallel_rank]``
  (``ts``: wall-clock seconds, float64);
- each event is a map tagged by ``type``, fields in vLLM's order, ``None``-valued
  optional fields left out (msgspec ``tag=True, omit_defaults=True``):
  ``{type: "BlockStored", block_hashes, parent_block_hash, token_ids, block_size,
  lora_id: None, medium: "GPU", lora_name: None, extra_keys: [None per block],
  group_idx: 0}``, ``{type: "BlockRemoved", block_hashes, medium: "GPU", group_idx: 0}``
  and ``{type: "AllBlocksCleared"}``;
- block hashes are vLLM's external hashes (``maybe_convert_block_hash``): with
  ``int_block_hashes`` (vLLM's default, ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=1``) the
  digest's last 8 bytes as an unsigned big-endian integer, else the digest's bytes;
- a ROUTER socket (``replay_endpoint``) answers a client's request ``[b"", start]``
  (``start``: 8 bytes, big-endian) with every buffered batch whose sequence number is at
  least ``start``, each as ``[b"", topic, seq, payload]``, then the end marker
  ``[b"", b"", (-1 as 8 signed big-endian bytes), b""]``.

The hashes are only vLLM's if the engine hashes blocks as vLLM does
(``cache.prefix_hash: vllm_sha256_cbor``, with the consumer's block size and seed).
"""

from __future__ import annotations

import logging
import queue
import socket
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from pydantic import Field

from orchestrator.core import (
    AllBlocksCleared,
    BlockHash,
    BlockRemoved,
    BlockStored,
    EngineConfig,
    KVEvent,
    StrictModel,
)

logger = logging.getLogger(__name__)

# vLLM's MEDIUM_GPU: the engine's own KV cache, the tier a vLLM block pool reports
# whatever the device (vLLM's CPU build says "GPU" too).
MEDIUM = "GPU"
# The replay's end marker in the sequence-number frame: -1 as 8 signed big-endian bytes.
END_SEQ = (-1).to_bytes(8, "big", signed=True)
# Longest wait (s) of the publisher thread for a batch: it bounds how long a replay
# request waits while no batch arrives.
POLL_S = 0.05
# How long (s) ``close`` waits for the queue to take its stop marker, and then for the
# thread to send what is queued and end.
CLOSE_TIMEOUT_S = 2.0
# How long (ms) the PUB socket may take, once closed, to hand sent batches to the network.
LINGER_MS = 200
_INT_HASH_MASK = (1 << 64) - 1


def external_hash(digest: BlockHash, as_int: bool) -> int | bytes:
    """vLLM's ``maybe_convert_block_hash``: the digest's last 8 bytes as an unsigned
    big-endian integer when ``as_int``, else the digest itself."""
    return int.from_bytes(digest, "big") & _INT_HASH_MASK if as_int else digest


def vllm_event(event: KVEvent, int_hashes: bool) -> dict[str, Any]:
    """One of our events as vLLM's msgspec struct encodes it (a map, keys in order)."""
    if isinstance(event, BlockStored):
        parent = event.parent_block_hash
        return {
            "type": "BlockStored",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "parent_block_hash": None if parent is None else external_hash(parent, int_hashes),
            "token_ids": list(event.token_ids),
            "block_size": event.block_size,
            "lora_id": None,
            "medium": MEDIUM,
            "lora_name": None,
            # vLLM publishes one entry per block; a plain-text block has no extra keys.
            "extra_keys": [None] * len(event.block_hashes),
            "group_idx": 0,
        }
    if isinstance(event, BlockRemoved):
        return {
            "type": "BlockRemoved",
            "block_hashes": [external_hash(h, int_hashes) for h in event.block_hashes],
            "medium": MEDIUM,
            "group_idx": 0,
        }
    if isinstance(event, AllBlocksCleared):
        return {"type": "AllBlocksCleared"}
    raise TypeError(f"not a KV event: {type(event).__name__}")


def encode_batch(
    ts: float, events: Sequence[KVEvent], data_parallel_rank: int, int_hashes: bool
) -> bytes:
    """vLLM's ``KVEventBatch`` payload: msgpack of ``[ts, events, data_parallel_rank]``."""
    import msgpack

    batch = [ts, [vllm_event(e, int_hashes) for e in events], data_parallel_rank]
    payload: bytes = msgpack.packb(batch, use_bin_type=True)
    return payload


def default_host() -> str:
    """This host's IP address as its name resolves (in a Kubernetes pod: the pod's IP,
    which llm-d matches against its endpoints), or the host name if it does not."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError:
        return name


def _is_bind_endpoint(endpoint: str) -> bool:
    """vLLM's rule: bind a wildcard, ``ipc://`` or ``inproc://`` endpoint; connect to the
    rest (llm-d's scorer binds its SUB socket and each replica connects to it)."""
    return "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://"))


def _power_of_two(n: int) -> bool:
    # Log the 1st, 2nd, 4th... occurrence: a lasting fault neither floods the log nor
    # goes silent after its first line.
    return n & (n - 1) == 0


class ZmqKVEventPublisher:
    """A ``KVEventSink`` that sends batches in vLLM's ZMQ wire format (module docstring).

    ``publish`` only enqueues (a bounded queue of ``max_queue_size`` batches); a
    background thread encodes and sends, keeps the last ``buffer_steps`` batches for
    replay and answers replay requests. When the queue is full the batch is dropped and
    counted (``num_dropped``), and a subscriber's index of this replica is stale until it
    replays. ``endpoint`` and ``replay_endpoint`` are the endpoints as bound (a
    ``tcp://127.0.0.1:*`` endpoint gets a free port; read it here).
    """

    class Config(StrictModel):
        """``kv_events: {type: zmq, ...}``. ``endpoint``: the PUB socket (bound when it
        has a wildcard, e.g. ``tcp://*:5557``, or is ``ipc://``/``inproc://``; else
        connected, as a replica connects to llm-d's scorer). ``replay_endpoint``: the
        ROUTER socket for replay requests (bound; ``None``: no replay). ``topic``: the
        first frame of every message; ``None`` gives llm-d's ``kv@<host>@<model>``, with
        ``host`` (``None``: this host's IP address) and ``model.name``.
        ``buffer_steps``: batches kept for replay. ``hwm``: the PUB socket's high-water
        mark (messages). ``max_queue_size``: batches waiting for the publisher thread.
        ``data_parallel_rank``: the last field of every batch. ``int_block_hashes``:
        vLLM's ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` (on by default there too)."""

        endpoint: str = "tcp://*:5557"
        replay_endpoint: str | None = None
        topic: str | None = None
        host: str | None = None
        buffer_steps: int = Field(10_000, ge=1)
        hwm: int = Field(100_000, ge=0)
        max_queue_size: int = Field(100_000, ge=1)
        data_parallel_rank: int = Field(0, ge=0)
        int_block_hashes: bool = True

    @classmethod
    def from_config(cls, config: Config, engine: EngineConfig) -> ZmqKVEventPublisher:
        topic = config.topic
        if topic is None:
            topic = f"kv@{config.host or default_host()}@{engine.model.name}"
        return cls(
            config.endpoint,
            replay_endpoint=config.replay_endpoint,
            topic=topic,
            buffer_steps=config.buffer_steps,
            hwm=config.hwm,
            max_queue_size=config.max_queue_size,
            data_parallel_rank=config.data_parallel_rank,
            int_block_hashes=config.int_block_hashes,
        )

    def __init__(
        self,
        endpoint: str,
        *,
        replay_endpoint: str | None = None,
        topic: str = "",
        buffer_steps: int = 10_000,
        hwm: int = 100_000,
        max_queue_size: int = 100_000,
        data_parallel_rank: int = 0,
        int_block_hashes: bool = True,
    ) -> None:
        try:
            # msgpack is used on the publisher thread; a missing one must fail here.
            import msgpack  # noqa: F401
            import zmq
        except ImportError as err:
            raise ImportError(
                f"kv_events type zmq needs pyzmq and msgpack (the kv-events extra: pip "
                f"install 'trtllm-orchestrator[kv-events]'): {err}"
            ) from err

        self.topic = topic
        self._topic = topic.encode()
        self._rank = data_parallel_rank
        self._int_hashes = int_block_hashes
        self._ctx = zmq.Context()
        self._pub = self._ctx.socket(zmq.PUB)
        self._replay: Any = None
        try:
            self._pub.set_hwm(hwm)
            self.endpoint = self._open(self._pub, endpoint, _is_bind_endpoint(endpoint))
            self.replay_endpoint: str | None = None
            if replay_endpoint is not None:
                self._replay = self._ctx.socket(zmq.ROUTER)
                self.replay_endpoint = self._open(self._replay, replay_endpoint, True)
        except zmq.ZMQError:
            self._close_sockets()
            self._ctx.term()
            raise
        # Sockets are used by the publisher thread only from here on (zmq sockets are
        # not thread-safe); the thread's start orders these writes before its reads.
        self._queue: queue.Queue[tuple[float, Sequence[KVEvent]] | None] = queue.Queue(
            max_queue_size
        )
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self._next_seq = 0
        self._closed = False
        self._stop = threading.Event()
        self.num_dropped = 0
        self.num_send_errors = 0
        self._thread = threading.Thread(target=self._run, name="kv-events-zmq", daemon=True)
        self._thread.start()
        logger.info(
            "KV events: publishing on %s (replay %s), topic %r",
            self.endpoint,
            self.replay_endpoint or "off",
            topic,
        )

    @staticmethod
    def _open(sock: Any, endpoint: str, bind: bool) -> str:
        import zmq

        if not bind:
            sock.connect(endpoint)
            return endpoint
        sock.bind(endpoint)
        bound: str = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        return bound

    def publish(self, events: Sequence[KVEvent]) -> None:
        """Queue one batch, stamped now (wall clock); never blocks or raises."""
        if not self._closed:
            try:
                self._queue.put_nowait((time.time(), events))
                return
            except queue.Full:
                pass
        self.num_dropped += 1
        if _power_of_two(self.num_dropped):
            logger.warning(
                "KV events: dropped %d batches so far (queue full or publisher closed); "
                "subscribers' view of this replica is stale until they replay",
                self.num_dropped,
            )

    def close(self) -> None:
        """Send what is queued, stop the thread and release the sockets, within about
        ``2 * CLOSE_TIMEOUT_S`` seconds. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        try:
            self._queue.put(None, timeout=CLOSE_TIMEOUT_S)
        except queue.Full:
            self._stop.set()  # the queue did not drain in time: abandon what is left
        self._thread.join(CLOSE_TIMEOUT_S)
        if self._thread.is_alive():
            self._stop.set()
            logger.warning("KV events: the publisher thread did not stop in time")
            return
        self._ctx.term()

    def _run(self) -> None:
        try:
            while not self._stop.is_set():
                if self._replay is not None and self._replay.poll(0):
                    self._guarded(self._serve_replay)
                try:
                    item = self._queue.get(timeout=POLL_S)
                except queue.Empty:
                    continue
                if item is None:
                    return
                self._guarded(self._send, *item)
        finally:
            self._close_sockets()

    def _guarded(self, fn: Callable[..., None], *args: Any) -> None:
        """Run ``fn``; log and count an exception instead of ending the thread."""
        try:
            fn(*args)
        except Exception:
            self.num_send_errors += 1
            if _power_of_two(self.num_send_errors):
                logger.exception("KV events: sending failed (%d times)", self.num_send_errors)

    def _send(self, ts: float, events: Sequence[KVEvent]) -> None:
        seq = self._next_seq
        self._next_seq += 1
        payload = encode_batch(ts, events, self._rank, self._int_hashes)
        self._pub.send_multipart((self._topic, seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))

    def _serve_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3:
            logger.warning("KV events: ignored a replay request of %d frames", len(frames))
            return
        client, _, start_bytes = frames
        start = int.from_bytes(start_bytes, "big")
        for seq, payload in self._buffer:
            if seq >= start:
                self._replay.send_multipart(
                    (client, b"", self._topic, seq.to_bytes(8, "big"), payload)
                )
        self._replay.send_multipart((client, b"", b"", END_SEQ, b""))

    def _close_sockets(self) -> None:
        self._pub.close(linger=LINGER_MS)
        if self._replay is not None:
            self._replay.close(linger=0)
