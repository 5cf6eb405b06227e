"""Token streams: what an update does to its stream, in both modes."""

from __future__ import annotations

from plugins.trtllm.streams import Streams, Update


def test_a_stream_takes_no_update_after_its_final_one() -> None:
    streams = Streams()
    stream = streams.add("r", 7, wants_logprobs=False)
    streams.route(Update(7, tokens=[11]))
    streams.route(Update(7, final=True, error="refused inside the loop"))
    # TensorRT-LLM's own ending of the aborted request comes after ours.
    streams.route(Update(7, tokens=[12], final=True, finish_reason="cancelled"))
    assert [t for t, _ in stream.pending] == [11]
    assert (stream.final, stream.error, stream.finish_reason) == (
        True,
        "refused inside the loop",
        None,
    )
    streams.route(Update(99, tokens=[1]))  # a submission nobody holds: ignored
    assert streams.get("r") is stream
