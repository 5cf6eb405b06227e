"""The streaming client against the local SSE server: timings equal the injected
delays, token counts come from usage or the tokenizer, and every failure is counted
with a clear error."""

from __future__ import annotations

import asyncio
import socket

import pytest

from orchestrator.bench.client import (
    Api,
    NotOpenAIError,
    ServerStreamError,
    StreamClient,
    normalize_base_url,
    parse_chunk,
)
from orchestrator.bench.errors import BenchError
from orchestrator.bench.load import BurstArrivals
from orchestrator.common.metrics import percentile, summarize
from orchestrator.common.workloads import ClosedLoop
from tests.bench.helpers import UnusableTokenizer, make_requests, records

TTFT_S = 0.2
ITL_S = 0.03
# Measured = injected + loopback, scheduling and parsing. The upper allowances are wide
# enough for two busy shared cores, and still far below what a wrong start time, a
# missed chunk or a client that falls behind would add.
TTFT_SLACK_S = 0.1
GAP_FACTOR = 1.4


@pytest.mark.parametrize("api", [Api.COMPLETIONS, Api.CHAT])
def test_measured_ttft_and_tpot_equal_injected_delays(sse_server, api):
    server = sse_server(ttft_s=TTFT_S, itl_s=ITL_S)
    _, recs = records(
        server.url, make_requests(4, max_tokens=10), BurstArrivals(), UnusableTokenizer(), api=api
    )
    for r in recs:
        assert r.ok, r.error
        assert r.num_output_tokens == 10 and len(r.token_times) == 10
        # The server waits at least this long after it has read the request.
        assert r.ttft >= TTFT_S - 0.002
    # Medians over requests and gaps: one late wake-up on a busy machine moves a
    # single value (and shortens the gap after it), not these.
    assert percentile([r.ttft for r in recs], 50) <= TTFT_S + TTFT_SLACK_S
    assert ITL_S - 0.002 <= percentile([r.tpot for r in recs], 50) <= ITL_S * GAP_FACTOR
    assert ITL_S - 0.002 <= percentile([g for r in recs for g in r.itls], 50) <= ITL_S * GAP_FACTOR


def test_usage_counts_tokens_when_chunks_carry_several(sse_server):
    server = sse_server(itl_s=ITL_S, tokens_per_chunk=4)
    _, recs = records(
        server.url, make_requests(4, max_tokens=32), BurstArrivals(), UnusableTokenizer()
    )
    assert [(len(r.token_times), r.num_output_tokens) for r in recs] == [(8, 32)] * 4
    # 7 chunk gaps spread over 31 token gaps.
    tpot = percentile([r.tpot for r in recs], 50)
    assert 7 * (ITL_S - 0.002) / 31 <= tpot <= 7 * ITL_S * GAP_FACTOR / 31


def test_tokenizer_counts_output_when_server_sends_no_usage(sse_server, word_tokenizer):
    server = sse_server(send_usage=False)
    _, recs = records(server.url, make_requests(3, max_tokens=7), BurstArrivals(), word_tokenizer)
    assert [r.num_output_tokens for r in recs] == [7, 7, 7]
    # Prompt tokens then come from the workload.
    assert [r.num_prompt_tokens for r in recs] == [3, 3, 3]


def test_http_errors_are_counted_by_status(sse_server):
    server = sse_server(error_status=429, fail_every=2)
    _, recs = records(server.url, make_requests(6), ClosedLoop(concurrency=1), UnusableTokenizer())
    assert len(recs) == 6
    failed = [r for r in recs if not r.ok]
    assert [r.status_code for r in failed] == [429, 429, 429]
    assert all(r.error == "injected failure" for r in failed)
    summary = summarize(recs, duration_s=1.0)
    assert summary.num_completed == 3
    assert summary.errors_by_status == {"429": 3}


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("json", "non-OpenAI response: expected an SSE stream, got application/json"),
        ("garbage", "non-OpenAI response: event has no 'choices' list"),
        ("error_event", "error event in stream: engine stopped"),
        ("drop", "RemoteProtocolError"),
    ],
)
def test_broken_responses_are_counted_errors(sse_server, mode, expected):
    server = sse_server(mode=mode)
    _, recs = records(
        server.url, make_requests(3, max_tokens=6), ClosedLoop(concurrency=1), UnusableTokenizer()
    )
    assert len(recs) == 3
    for r in recs:
        assert not r.ok
        assert r.error is not None and r.error.startswith(expected), r.error
        # A failure after a 200 is grouped by its message, not as "200".
        assert r.status_code is None
    assert summarize(recs, 1.0).num_errors == 3


def test_ignore_eos_runs_outputs_to_max_tokens_and_can_be_left_out(sse_server):
    server = sse_server(eos_after=3)
    _, with_flag = records(
        server.url, make_requests(2, max_tokens=9), BurstArrivals(), UnusableTokenizer()
    )
    _, without = records(
        server.url,
        make_requests(2, max_tokens=9),
        BurstArrivals(),
        UnusableTokenizer(),
        ignore_eos=False,
    )
    assert [r.num_output_tokens for r in with_flag] == [9, 9]
    assert [r.num_output_tokens for r in without] == [3, 3]
    assert [("ignore_eos" in b, b["max_tokens"]) for b in server.state.bodies] == [
        (True, 9),
        (True, 9),
        (False, 9),
        (False, 9),
    ]


def test_request_bodies_follow_the_openai_schema(sse_server):
    server = sse_server()
    records(server.url, make_requests(1, max_tokens=5), BurstArrivals(), UnusableTokenizer())
    records(
        server.url,
        make_requests(1, max_tokens=5),
        BurstArrivals(),
        UnusableTokenizer(),
        api=Api.CHAT,
    )
    completion, chat = server.state.bodies
    common = {
        "model": "test-model",
        "max_tokens": 5,
        "stream": True,
        "stream_options": {"include_usage": True},
        "ignore_eos": True,
    }
    assert completion == {**common, "prompt": "one two three"}
    assert chat == {**common, "messages": [{"role": "user", "content": "one two three"}]}


def _prepare(
    url: str, model: str | None = None, ignore_eos: bool = True
) -> tuple[StreamClient, list[str]]:
    async def go() -> tuple[StreamClient, list[str]]:
        async with StreamClient(url, Api.COMPLETIONS, model, ignore_eos=ignore_eos) as client:
            return client, await client.prepare()

    return asyncio.run(go())


def test_prepare_discovers_the_served_model(sse_server):
    server = sse_server(model="served-model")
    client, notes = _prepare(server.url)
    assert client.model == "served-model"
    assert client.ignore_eos
    assert notes == []
    assert server.state.bodies[0]["max_tokens"] == 1  # the probe


def test_prepare_drops_ignore_eos_when_the_server_rejects_it(sse_server):
    server = sse_server(reject_ignore_eos=True)
    client, notes = _prepare(server.url)
    assert not client.ignore_eos
    assert len(notes) == 1 and "ignore_eos" in notes[0]
    assert "ignore_eos" not in client.body(make_requests(1)[0])


def test_unreachable_server_is_a_clear_error():
    with socket.socket() as s:  # a port nobody listens on once closed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(BenchError, match=rf"cannot reach http://127.0.0.1:{port}: ConnectError"):
        _prepare(f"http://127.0.0.1:{port}")


def test_non_openai_models_listing_is_a_clear_error(sse_server):
    server = sse_server(models_body=b"<html>hello</html>")
    with pytest.raises(BenchError, match=r"/v1/models answered non-OpenAI JSON .*<html>hello"):
        _prepare(server.url)


def test_rejected_api_key_says_how_to_pass_one(sse_server):
    server = sse_server(models_status=401)
    with pytest.raises(BenchError, match=r"HTTP 401.*--api-key"):
        _prepare(server.url)


def test_unknown_model_name_lists_the_served_ones(sse_server):
    server = sse_server(model="served-model")
    with pytest.raises(BenchError, match=r"'other' is not served .* it serves: served-model"):
        _prepare(server.url, model="other")


def test_probe_failure_stops_before_measuring(sse_server):
    server = sse_server(mode="json")
    with pytest.raises(BenchError, match=r"probe request to .*/v1/completions failed: non-OpenAI"):
        _prepare(server.url)


def test_parse_chunk_reads_text_finish_and_usage():
    chat = {"choices": [{"delta": {"content": "hi"}, "finish_reason": None}]}
    assert parse_chunk(chat, Api.CHAT).text == "hi"
    done = {
        "choices": [{"text": "", "finish_reason": "length"}],
        "usage": {"prompt_tokens": 3, "completion_tokens": 5},
    }
    chunk = parse_chunk(done, Api.COMPLETIONS)
    assert (chunk.text, chunk.finished, chunk.prompt_tokens, chunk.completion_tokens) == (
        "",
        True,
        3,
        5,
    )
    with pytest.raises(ServerStreamError, match="boom"):
        parse_chunk({"error": {"message": "boom"}}, Api.COMPLETIONS)
    with pytest.raises(NotOpenAIError, match="choices"):
        parse_chunk({"data": 1}, Api.COMPLETIONS)
    with pytest.raises(NotOpenAIError, match="not a string"):
        parse_chunk({"choices": [{"text": 5}]}, Api.COMPLETIONS)


def test_base_url_accepts_v1_and_rejects_other_schemes():
    assert normalize_base_url("http://127.0.0.1:8000/v1/") == "http://127.0.0.1:8000"
    assert normalize_base_url("https://host") == "https://host"
    with pytest.raises(BenchError, match="--url 'localhost:8000'"):
        normalize_base_url("localhost:8000")
