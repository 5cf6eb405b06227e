"""Workloads: length specs, synthetic prompts of exact token lengths from real text,
and workload files that replay the very same requests."""

from __future__ import annotations

import json
import re

import pytest

from orchestrator.bench.bench_requests import (
    BenchRequest,
    parse_length,
    read_workload,
    synthetic_workload,
    write_workload,
)
from orchestrator.bench.errors import BenchError
from orchestrator.common.workloads import (
    ClosedLoop,
    FixedLength,
    LogNormalLength,
    UniformLength,
    WorkloadConfig,
    build_workload,
)
from tests.bench.helpers import UnusableTokenizer, run


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ("128", FixedLength(value=128)),
        ("fixed:7", FixedLength(value=7)),
        ("uniform:10:20", UniformLength(low=10, high=20)),
        ("lognormal:128:0.5", LogNormalLength(median=128, sigma=0.5)),
        ("lognormal:128:0.5:512", LogNormalLength(median=128, sigma=0.5, high=512)),
    ],
)
def test_parse_length(spec, expected):
    assert parse_length(spec) == expected


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("uniform:20:10", "low (20) exceeds high (10)"),
        ("fixed:0", "value: Input should be greater than or equal to 1"),
        ("uniform:a:b", "numbers expected"),
        ("poisson:3", "use N, fixed:N"),
        ("", "use N, fixed:N"),
    ],
)
def test_bad_length_specs_name_the_spec(spec, message):
    with pytest.raises(
        BenchError, match=rf"length {re.escape(repr(spec))}: .*{re.escape(message)}"
    ):
        parse_length(spec)


def test_synthetic_prompts_have_the_drawn_token_lengths(word_tokenizer):
    prompt_len, output_len = UniformLength(low=5, high=50), UniformLength(low=1, high=9)
    requests = synthetic_workload(word_tokenizer, 40, prompt_len, output_len, seed=3)
    # The same lengths the simulator draws for this seed.
    specs = build_workload(
        WorkloadConfig(num_requests=40, prompt_len=prompt_len, output_len=output_len, seed=3)
    ).requests
    assert [r.num_prompt_tokens for r in requests] == [s.prompt_len for s in specs]
    assert [r.max_tokens for r in requests] == [s.output_len for s in specs]
    assert [len(word_tokenizer.encode(r.prompt)) for r in requests] == [s.prompt_len for s in specs]
    assert len({r.request_id for r in requests}) == 40
    assert len({r.prompt for r in requests}) == 40  # windows at different places


def test_synthetic_workload_is_fixed_by_its_seed(word_tokenizer):
    def draw(seed: int) -> list[BenchRequest]:
        return synthetic_workload(
            word_tokenizer, 10, FixedLength(value=20), FixedLength(value=4), seed
        )

    assert draw(1) == draw(1)
    assert [r.prompt for r in draw(1)] != [r.prompt for r in draw(2)]


def test_prompt_longer_than_the_corpus_is_a_clear_error(word_tokenizer):
    with pytest.raises(BenchError, match="prompt lengths: prompt length 10000000 outside"):
        synthetic_workload(
            word_tokenizer, 1, FixedLength(value=10_000_000), FixedLength(value=1), 0
        )


def test_workload_file_round_trips_exactly(tmp_path, word_tokenizer):
    requests = synthetic_workload(
        word_tokenizer, 25, UniformLength(low=1, high=30), FixedLength(value=3), 0
    )
    path = tmp_path / "workload.jsonl"
    write_workload(path, requests)
    assert read_workload(path, UnusableTokenizer(), FixedLength(value=99), seed=5) == requests


def test_replayed_workload_sends_identical_requests(tmp_path, sse_server, word_tokenizer):
    requests = synthetic_workload(
        word_tokenizer, 8, UniformLength(low=3, high=12), UniformLength(low=1, high=5), 0
    )
    path = tmp_path / "workload.jsonl"
    write_workload(path, requests)
    first, second = sse_server(), sse_server()
    run(first.url, requests, ClosedLoop(concurrency=1))
    run(
        second.url,
        read_workload(path, UnusableTokenizer(), FixedLength(value=1), 0),
        ClosedLoop(concurrency=1),
    )
    assert len(first.state.bodies) == 8
    assert first.state.bodies == second.state.bodies


def test_user_prompts_file_fills_in_missing_fields(tmp_path, word_tokenizer):
    path = tmp_path / "prompts.jsonl"
    lines = [
        {"prompt": "a b c d", "max_tokens": 5},
        {"prompt": "e f", "num_prompt_tokens": 9, "request_id": "mine"},
        {"prompt": "g h i"},
    ]
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n\n")
    first = read_workload(path, word_tokenizer, UniformLength(low=1, high=1000), seed=7)
    again = read_workload(path, word_tokenizer, UniformLength(low=1, high=1000), seed=7)
    assert first == again  # missing lengths are drawn from the seed
    assert [(r.request_id, r.num_prompt_tokens) for r in first] == [
        ("req-000000", 4),
        ("mine", 9),
        ("req-000002", 3),
    ]
    assert first[0].max_tokens == 5
    assert all(1 <= r.max_tokens <= 1000 for r in first)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ('{"prompt": "x", "max_token": 3}\n', r":1: unknown key\(s\) max_token"),
        ('{"prompt": "x"}\nnot json\n', r":2: not JSON"),
        ('{"prompt": ""}\n', r":1: 'prompt' must be non-empty text"),
        ('{"prompt": "x", "max_tokens": 0}\n', r":1: 'max_tokens' must be an integer >= 1, got 0"),
        ('{"prompt": "x", "max_tokens": true}\n', r":1: 'max_tokens' must be an integer >= 1"),
        ('["x"]\n', r":1: expected a JSON object"),
        (
            '{"prompt": "x", "request_id": "a"}\n{"prompt": "y", "request_id": "a"}\n',
            r":2: 'request_id' must be unique",
        ),
        ("\n", r"the workload has no requests"),
    ],
)
def test_bad_workload_files_name_file_and_line(tmp_path, content, message, word_tokenizer):
    path = tmp_path / "w.jsonl"
    path.write_text(content)
    with pytest.raises(BenchError, match=rf"{path}:? ?{message}"):
        read_workload(path, word_tokenizer, FixedLength(value=1), 0)


def test_missing_workload_file_is_a_clear_error(tmp_path):
    with pytest.raises(BenchError, match="cannot read workload: No such file"):
        read_workload(tmp_path / "nope.jsonl", UnusableTokenizer(), FixedLength(value=1), 0)
