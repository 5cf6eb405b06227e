"""KV event sinks for routers outside the engine. ``zmq``: vLLM's ZMQ publisher, byte for
byte (``zmq_publisher``), which llm-d's precise prefix-cache scorer subscribes to. pyzmq
and msgpack (the ``kv-events`` extra) load only when a sink is built, so a config that
names one validates without them."""

from plugins.kv_events.zmq_publisher import ZmqKVEventPublisher

__all__ = ["ZmqKVEventPublisher"]
