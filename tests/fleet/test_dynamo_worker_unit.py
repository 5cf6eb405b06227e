"""The Dynamo worker's pieces without Dynamo: the request mapping (every field we honour,
refusals naming the field), the error mapping, the model folder Dynamo's frontend
loads, the KV-event translation, and the command's registration.

Fakes follow Dynamo 1.6.1's own definitions: ``FakeExceptions`` the classes of
``dynamo/llm/exceptions.py`` (``HttpError(code, message)`` and the typed exceptions of
``dynamo._core``), ``FakePublisher`` the ``KvEventPublisher`` methods of
``dynamo/_core.pyi``. Request dicts are the ``PreprocessedRequest`` shape Dynamo's
frontend sends a worker (recorded from a running frontend; see ``dynamo_request``).
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest

from orchestrator.common.async_engine import (
    AsyncEngine,
    InvalidConstraintError,
    RequestAbortedError,
    RequestFailedError,
    RequestShedError,
    RequestStream,
    SubmissionFailedError,
)
from orchestrator.core import (
    AdmissionError,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ConfigError,
    ConstraintKind,
    EngineDeadError,
    EngineError,
    FinishReason,
    ModelConfig,
    OverloadedError,
    RequestOutput,
    SamplingParams,
    Submission,
    TokenLogprobs,
)
from plugins.dynamo.kv_events import DynamoKVEventSink, dynamo_hash
from plugins.dynamo.model_folder import (
    REQUIRED_FILES,
    ModelFolderError,
    config_json,
    ensure_model_folder,
    folder_key,
    tokenizer_config_json,
    write_model_folder,
)
from plugins.dynamo.protocol import (
    HTTP_STATUS,
    DynamoErrorKind,
    RequestLimits,
    UnsupportedFieldError,
    map_error,
    to_chunk,
    to_exception,
    to_submission,
)
from plugins.dynamo.settings import load_worker_config
from tests.factories import make_engine, run_to_completion

ROOT = Path(__file__).resolve().parents[2]
LIMITS = RequestLimits(max_model_len=1024)


def dynamo_request(**sections: dict[str, Any]) -> dict[str, Any]:
    """A request as Dynamo 1.6.1's frontend sends it for a plain chat completion (every
    option present and null), with ``sections`` merged into its parts."""
    request: dict[str, Any] = {
        "model": "SmolLM2-135M-Instruct",
        "token_ids": [1, 9690, 198, 2683],
        "stop_conditions": {
            "max_tokens": 20,
            "stop": None,
            "stop_token_ids": None,
            "stop_token_ids_visible": None,
            "stop_token_ids_hidden": [2],
            "min_tokens": None,
            "ignore_eos": None,
            "max_thinking_tokens": None,
        },
        "sampling_options": {
            "n": None,
            "best_of": None,
            "presence_penalty": None,
            "frequency_penalty": None,
            "repetition_penalty": None,
            "temperature": None,
            "top_p": None,
            "top_k": None,
            "min_p": None,
            "use_beam_search": None,
            "length_penalty": None,
            "seed": None,
            "include_stop_str_in_output": None,
            "guided_decoding": None,
        },
        "output_options": {
            "logprobs": None,
            "prompt_logprobs": None,
            "skip_special_tokens": None,
            "formatted_prompt": None,
            "return_tokens_as_token_ids": None,
        },
        "eos_token_ids": [2],
        "mdc_sum": "4a5104b5",
        "annotations": [],
        "routing": {},
        "router_config_override": None,
    }
    for name, values in sections.items():
        if isinstance(request.get(name), dict):
            request[name] = {**request[name], **values}
        else:
            request[name] = values
    return request


# ---------------------------------------------------------------- request mapping


def test_a_plain_request_maps_to_defaults_with_eos_as_stop() -> None:
    sub = to_submission(dynamo_request(), "r1", 12.5, LIMITS)
    assert sub.request_id == "r1"
    assert sub.arrival_time == 12.5
    assert sub.prompt_token_ids == (1, 9690, 198, 2683)
    assert sub.sampling.max_tokens == 20
    assert sub.sampling.stop_token_ids == (2,)
    assert sub.sampling.logprobs is None
    assert (sub.priority, sub.slo_class, sub.tenant, sub.constraint) == (0, None, None, None)


def test_every_honoured_field_reaches_the_submission() -> None:
    request = dynamo_request(
        sampling_options={"temperature": 0.3, "top_p": 0.9, "top_k": 5, "seed": 7, "n": 1},
        stop_conditions={"stop_token_ids": [7, 8], "stop_token_ids_visible": [9]},
        output_options={"logprobs": 2},
        routing={"priority": 4, "priority_jump": 4.0},
        annotations=[
            "slo_class:interactive",
            "tenant:acme",
            "ttft_ms:250",
            "tpot_ms:40",
            "formatted_prompt",
        ],
    )
    sub = to_submission(request, "r", 0.0, LIMITS)
    s = sub.sampling
    assert (s.temperature, s.top_p, s.top_k, s.seed) == (0.3, 0.9, 5, 7)
    assert s.stop_token_ids == (2, 7, 8, 9)
    assert s.logprobs == 2
    # Dynamo's priority is higher-first; ours is lower-first.
    assert sub.priority == -4
    assert (sub.slo_class, sub.tenant) == ("interactive", "acme")
    assert (sub.ttft_target_s, sub.tpot_target_s) == (0.25, 0.04)


def test_ignore_eos_drops_the_eos_ids_and_top_k_minus_one_disables_top_k() -> None:
    request = dynamo_request(
        stop_conditions={"ignore_eos": True, "stop_token_ids_hidden": None},
        sampling_options={"top_k": -1},
    )
    sub = to_submission(request, "r", 0.0, LIMITS)
    assert sub.sampling.stop_token_ids == ()
    assert sub.sampling.top_k == 0


def test_without_max_tokens_a_request_may_fill_the_context_up_to_the_limit() -> None:
    request = dynamo_request(stop_conditions={"max_tokens": None})
    assert to_submission(request, "r", 0.0, LIMITS).sampling.max_tokens == 1024 - 4
    capped = RequestLimits(max_model_len=1024, max_tokens_limit=100)
    assert to_submission(request, "r", 0.0, capped).sampling.max_tokens == 100


def test_a_tenant_gets_its_default_slo_class_unless_the_request_names_one() -> None:
    limits = RequestLimits(max_model_len=1024, tenant_slo_classes={"acme": "batch"})
    sub = to_submission(dynamo_request(annotations=["tenant:acme"]), "r", 0.0, limits)
    assert sub.slo_class == "batch"
    named = dynamo_request(annotations=["tenant:acme", "slo_class:interactive"])
    assert to_submission(named, "r", 0.0, limits).slo_class == "interactive"


@pytest.mark.parametrize(
    ("guided", "kind", "value"),
    [
        ({"json": {"type": "object"}}, ConstraintKind.JSON_SCHEMA, '{"type": "object"}'),
        ({"json": '{"type": "integer"}'}, ConstraintKind.JSON_SCHEMA, '{"type": "integer"}'),
        ({"regex": "[a-z]+"}, ConstraintKind.REGEX, "[a-z]+"),
        ({"choice": ["yes", "no"]}, ConstraintKind.CHOICE, '["yes", "no"]'),
        ({"grammar": 'start: "a"'}, ConstraintKind.GRAMMAR, 'start: "a"'),
    ],
)
def test_guided_decoding_becomes_the_constraint(
    guided: dict[str, Any], kind: ConstraintKind, value: str
) -> None:
    request = dynamo_request(sampling_options={"guided_decoding": guided})
    constraint = to_submission(request, "r", 0.0, LIMITS).constraint
    assert constraint is not None
    assert (constraint.kind, constraint.value) == (kind, value)
    assert constraint.source.startswith("sampling_options.guided_decoding.")


@pytest.mark.parametrize(
    ("sections", "field"),
    [
        ({"sampling_options": {"n": 2}}, "sampling_options.n"),
        ({"sampling_options": {"best_of": 3}}, "sampling_options.best_of"),
        ({"sampling_options": {"presence_penalty": 0.1}}, "sampling_options.presence_penalty"),
        ({"sampling_options": {"frequency_penalty": 0.5}}, "sampling_options.frequency_penalty"),
        (
            {"sampling_options": {"repetition_penalty": 1.2}},
            "sampling_options.repetition_penalty",
        ),
        ({"sampling_options": {"min_p": 0.05}}, "sampling_options.min_p"),
        ({"sampling_options": {"use_beam_search": True}}, "sampling_options.use_beam_search"),
        ({"sampling_options": {"length_penalty": 0.8}}, "sampling_options.length_penalty"),
        ({"stop_conditions": {"min_tokens": 3}}, "stop_conditions.min_tokens"),
        ({"stop_conditions": {"max_thinking_tokens": 64}}, "stop_conditions.max_thinking_tokens"),
        ({"output_options": {"prompt_logprobs": 1}}, "output_options.prompt_logprobs"),
        ({"routing": {"cache_salt": "abc"}}, "routing.cache_salt"),
        ({"multi_modal_data": {"image_url": ["x"]}}, "multi_modal_data"),
        ({"prefill_result": {"disaggregated_params": {}}}, "prefill_result"),
        ({"bootstrap_info": {"host": "h"}}, "bootstrap_info"),
        ({"token_ids": []}, "token_ids"),
        ({"annotations": ["ttft_ms:soon"]}, "annotations"),
        ({"annotations": ["tpot_ms:0"]}, "annotations"),
        ({"stop_conditions": {"max_tokens": 2.5}}, "stop_conditions.max_tokens"),
        (
            {"sampling_options": {"guided_decoding": {"structural_tag": {"x": 1}}}},
            "sampling_options.guided_decoding.structural_tag",
        ),
        (
            {"sampling_options": {"guided_decoding": {"json": {}, "regex": "a"}}},
            "sampling_options.guided_decoding",
        ),
        (
            {"sampling_options": {"guided_decoding": {"whitespace_pattern": " "}}},
            "sampling_options.guided_decoding.whitespace_pattern",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_naming_the_field(
    sections: dict[str, Any], field: str
) -> None:
    with pytest.raises(UnsupportedFieldError) as info:
        to_submission(dynamo_request(**sections), "r", 0.0, LIMITS)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}: ")


def test_neutral_values_of_unsupported_options_are_accepted() -> None:
    neutral = {
        "n": 1,
        "best_of": 1,
        "presence_penalty": 0.0,
        "frequency_penalty": 0.0,
        "repetition_penalty": 1.0,
        "min_p": 0.0,
        "use_beam_search": False,
        "length_penalty": 1.0,
    }
    to_submission(dynamo_request(sampling_options=neutral), "r", 0.0, LIMITS)


def test_out_of_range_values_are_refused_with_the_sampling_message() -> None:
    request = dynamo_request(sampling_options={"top_p": 0.0})
    with pytest.raises(UnsupportedFieldError, match="top_p"):
        to_submission(request, "r", 0.0, LIMITS)
    over = RequestLimits(max_model_len=1024, max_tokens_limit=10)
    with pytest.raises(UnsupportedFieldError, match="exceeds this worker's limit of 10"):
        to_submission(dynamo_request(), "r", 0.0, over)


# ---------------------------------------------------------------- response chunks


def _output(**fields: Any) -> RequestOutput:
    base: dict[str, Any] = {
        "request_id": "r",
        "new_token_ids": (42,),
        "new_logprobs": (),
        "finished": False,
        "finish_reason": None,
        "num_prompt_tokens": 40,
        "num_output_tokens": 1,
    }
    return RequestOutput(**{**base, **fields})


def test_a_chunk_carries_the_new_tokens_and_usage_on_the_last() -> None:
    assert to_chunk(_output()) == {"token_ids": [42], "index": 0}
    last = to_chunk(
        _output(
            finished=True,
            finish_reason=FinishReason.LENGTH,
            num_output_tokens=5,
            num_cached_tokens=32,
        )
    )
    assert last["finish_reason"] == "length"
    assert last["completion_usage"] == {
        "prompt_tokens": 40,
        "completion_tokens": 5,
        "total_tokens": 45,
        "prompt_tokens_details": {"cached_tokens": 32},
    }


def test_logprobs_follow_dynamos_wire_format() -> None:
    logprobs = (TokenLogprobs(-0.5, [(42, -0.5), (7, -1.5)]),)
    chunk = to_chunk(_output(new_logprobs=logprobs), token_text=lambda t: f"<{t}>")
    assert chunk["log_probs"] == [-0.5]
    assert chunk["top_logprobs"] == [
        [
            {"rank": 1, "token_id": 42, "token": "<42>", "logprob": -0.5},
            {"rank": 2, "token_id": 7, "token": "<7>", "logprob": -1.5},
        ]
    ]


# ---------------------------------------------------------------- error mapping


class FakeExceptions:
    """``dynamo.llm.exceptions`` (1.6.1): typed exceptions take a message; ``HttpError``
    takes a status code and a message and keeps both as attributes."""

    class DynamoException(Exception):
        pass

    class InvalidArgument(DynamoException):
        pass

    class Unknown(DynamoException):
        pass

    class EngineShutdown(DynamoException):
        pass

    class HttpError(Exception):
        def __init__(self, code: int, message: str) -> None:
            super().__init__(f"HTTP {code}: {message}")
            self.code = code
            self.message = message


@pytest.mark.parametrize(
    ("error", "kind", "status"),
    [
        (UnsupportedFieldError("sampling_options.n", "no"), DynamoErrorKind.INVALID_ARGUMENT, 400),
        (AdmissionError("too long", param="messages"), DynamoErrorKind.INVALID_ARGUMENT, 400),
        (OverloadedError("queue full", 2.2, "queue_full"), DynamoErrorKind.RATE_LIMITED, 429),
        (EngineDeadError("dead"), DynamoErrorKind.ENGINE_SHUTDOWN, 503),
        (SubmissionFailedError("could not"), DynamoErrorKind.INTERNAL, 500),
        (
            InvalidConstraintError("response_format: bad schema"),
            DynamoErrorKind.INVALID_ARGUMENT,
            400,
        ),
        (RequestShedError("too late", "ttft_deadline_passed"), DynamoErrorKind.UNAVAILABLE, 503),
        (RequestFailedError("could not complete"), DynamoErrorKind.INTERNAL, 500),
        (RequestAbortedError("aborted"), DynamoErrorKind.INTERNAL, 500),
        (RuntimeError("secret internals"), DynamoErrorKind.INTERNAL, 500),
    ],
)
def test_each_engine_error_maps_to_one_dynamo_error(
    error: Exception, kind: DynamoErrorKind, status: int
) -> None:
    mapped = map_error(error)
    assert mapped.kind is kind
    assert HTTP_STATUS[kind] == status
    _check_raised(to_exception(mapped, FakeExceptions), kind, status)


def _check_raised(raised: Exception, kind: DynamoErrorKind, status: int) -> None:
    if kind in (DynamoErrorKind.RATE_LIMITED, DynamoErrorKind.UNAVAILABLE):
        assert isinstance(raised, FakeExceptions.HttpError)
        assert raised.code == status
    else:
        assert isinstance(raised, FakeExceptions.DynamoException)


async def _read_one(output: RequestOutput) -> RequestOutput:
    """``output`` as the worker reads it from its request's ``AsyncEngine`` stream."""
    stream = RequestStream(output.request_id, abort=lambda request_id: None)
    stream.put(output)
    return await anext(stream)


@pytest.mark.parametrize(
    ("reason", "code", "kind"),
    [
        (FinishReason.ERROR, "invalid_constraint", DynamoErrorKind.INVALID_ARGUMENT),
        (FinishReason.ERROR, "ttft_deadline_passed", DynamoErrorKind.UNAVAILABLE),
        (FinishReason.ERROR, None, DynamoErrorKind.INTERNAL),
        (FinishReason.ABORT, None, DynamoErrorKind.INTERNAL),
    ],
)
def test_a_request_the_engine_ended_maps_like_the_gateways(
    reason: FinishReason, code: str | None, kind: DynamoErrorKind
) -> None:
    output = _output(finished=True, finish_reason=reason, error="why", error_code=code)
    with pytest.raises(EngineError) as raised:
        asyncio.run(_read_one(output))
    mapped = map_error(raised.value)
    assert mapped.kind is kind
    _check_raised(to_exception(mapped, FakeExceptions), kind, HTTP_STATUS[kind])


def test_requests_that_finished_or_run_on_are_not_failures() -> None:
    for output in (
        _output(),
        _output(finished=True, finish_reason=FinishReason.STOP),
        _output(finished=True, finish_reason=FinishReason.LENGTH),
    ):
        assert asyncio.run(_read_one(output)) == output


def test_the_overload_message_carries_the_computed_retry_after_and_reason() -> None:
    mapped = map_error(OverloadedError("the queue is full", 2.2, "queue_full"))
    assert mapped.message == "the queue is full (queue_full); retry after 3 s"


def test_refusal_messages_name_the_field_and_internals_stay_hidden() -> None:
    assert map_error(AdmissionError("too long", param="messages")).message == "messages: too long"
    assert map_error(RuntimeError("secret internals")).message == "internal error"


# ---------------------------------------------------------------- model folder


def test_config_json_has_architectures_as_a_list_and_no_local_paths() -> None:
    content = config_json(
        {"model_type": "llama", "architectures": None, "_name_or_path": "/home/x"},
        ["LlamaForCausalLM"],
    )
    assert content == {"model_type": "llama", "architectures": ["LlamaForCausalLM"]}
    with pytest.raises(ModelFolderError):
        config_json({}, [])


def test_tokenizer_config_carries_the_chat_template_or_is_refused() -> None:
    out = tokenizer_config_json({"eos_token": "<|im_end|>"}, "{{ messages }}")
    assert out == {"eos_token": "<|im_end|>", "chat_template": "{{ messages }}"}
    with pytest.raises(ModelFolderError, match="no chat template"):
        tokenizer_config_json({}, None)


def _tiny_hf_folder(folder: Path, chat_template: str | None) -> Path:
    """A Hugging Face folder with a word-level tokenizer and a Llama config whose
    ``architectures`` is unset (as a GGUF file's is)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2, "hello": 3, "world": 4}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    if chat_template is not None:
        fast.chat_template = chat_template
    folder.mkdir(parents=True)
    fast.save_pretrained(folder)
    config = LlamaConfig(
        vocab_size=5,
        hidden_size=8,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
    )
    config.architectures = None
    config.save_pretrained(folder)
    return folder


def test_the_model_folder_holds_what_dynamos_frontend_reads(tmp_path: Path) -> None:
    template = "{% for m in messages %}{{ m['content'] }}{% endfor %}"
    source = _tiny_hf_folder(tmp_path / "src", template)
    model = ModelConfig(name="tiny", source=str(source))
    folder = ensure_model_folder(model, tmp_path / "cache")
    assert folder == tmp_path / "cache" / folder_key(model)
    for name in REQUIRED_FILES:
        assert (folder / name).exists(), name
    config = json.loads((folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert "_name_or_path" not in config
    assert json.loads((folder / "tokenizer_config.json").read_text())["chat_template"] == template
    # A complete folder is reused as it is; a rewrite replaces it whole.
    (folder / "marker").write_text("kept")
    assert ensure_model_folder(model, tmp_path / "cache") == folder
    assert (folder / "marker").exists()
    write_model_folder(model, folder)
    assert not (folder / "marker").exists()
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name]


def test_a_model_without_a_chat_template_is_refused(tmp_path: Path) -> None:
    source = _tiny_hf_folder(tmp_path / "src", None)
    model = ModelConfig(name="tiny", source=str(source))
    with pytest.raises(ModelFolderError, match="no chat template"):
        ensure_model_folder(model, tmp_path / "cache")
    assert list((tmp_path / "cache").iterdir()) == []  # no half-written folder left


# ---------------------------------------------------------------- KV events


class FakePublisher:
    """Records calls with ``KvEventPublisher``'s signatures (``dynamo/_core.pyi``)."""

    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple[str, dict[str, Any]]] = []
        self.fail = fail

    def publish_stored(
        self,
        token_ids: list[int],
        num_block_tokens: list[int],
        block_hashes: list[int],
        parent_hash: int | None = None,
    ) -> None:
        if self.fail:
            raise ValueError("refused")
        self.calls.append(
            (
                "stored",
                {
                    "token_ids": token_ids,
                    "num_block_tokens": num_block_tokens,
                    "block_hashes": block_hashes,
                    "parent_hash": parent_hash,
                },
            )
        )

    def publish_removed(self, block_hashes: list[int]) -> None:
        self.calls.append(("removed", {"block_hashes": block_hashes}))


H1, H2, H3 = (bytes([i]) * 32 for i in (1, 2, 3))


def test_hashes_become_signed_64_bit_integers() -> None:
    assert dynamo_hash(b"\xff" * 32) == -1
    assert dynamo_hash(b"\x01" + b"\x00" * 31) == 1
    for digest in (H1, H2, H3):
        assert -(2**63) <= dynamo_hash(digest) < 2**63


def test_stored_removed_and_cleared_events_reach_the_publisher() -> None:
    publisher = FakePublisher()
    sink = DynamoKVEventSink()
    sink.publish([BlockStored((H1,), None, tuple(range(4)), 4)])  # before connect: dropped
    sink.connect(publisher)
    sink.publish(
        [
            BlockStored((H1, H2), None, tuple(range(8)), 4),
            BlockStored((H3,), H2, (8, 9, 10, 11), 4),
            BlockRemoved((H1,)),
        ]
    )
    sink.publish([AllBlocksCleared()])
    assert publisher.calls == [
        (
            "stored",
            {
                "token_ids": list(range(8)),
                "num_block_tokens": [4, 4],
                "block_hashes": [dynamo_hash(H1), dynamo_hash(H2)],
                "parent_hash": None,
            },
        ),
        (
            "stored",
            {
                "token_ids": [8, 9, 10, 11],
                "num_block_tokens": [4],
                "block_hashes": [dynamo_hash(H3)],
                "parent_hash": dynamo_hash(H2),
            },
        ),
        ("removed", {"block_hashes": [dynamo_hash(H1)]}),
        ("removed", {"block_hashes": sorted([dynamo_hash(H2), dynamo_hash(H3)])}),
    ]
    sink.close()
    sink.publish([BlockRemoved((H2,))])
    assert len(publisher.calls) == 4


def test_a_refused_event_is_dropped_not_raised() -> None:
    sink = DynamoKVEventSink()
    sink.connect(FakePublisher(fail=True))
    sink.publish([BlockStored((H1,), None, (1, 2, 3, 4), 4)])


def test_a_sink_attached_to_the_core_publishes_the_blocks_a_request_cached() -> None:
    core, clock = make_engine(block_size=16)
    publisher = FakePublisher()
    sink = DynamoKVEventSink()
    sink.connect(publisher)
    core.attach_kv_event_sink(sink)
    prompt = tuple(range(100, 140))  # two full blocks and a partial one
    core.add_request(Submission("r", prompt, SamplingParams(max_tokens=2)))
    run_to_completion(core, clock)
    stored = [call for kind, call in publisher.calls if kind == "stored"]
    assert stored, publisher.calls
    tokens = [t for call in stored for t in call["token_ids"]]
    assert tokens[:32] == list(prompt[:32])
    assert all(n == 16 for call in stored for n in call["num_block_tokens"])
    assert stored[0]["parent_hash"] is None
    core.shutdown()
    sink.publish([BlockRemoved((H1,))])  # the engine closed it
    assert all(kind == "stored" for kind, _ in publisher.calls)


# ---------------------------------------------------------------- the command


def test_the_command_is_registered_through_the_entry_point_group() -> None:
    from orchestrator import cli

    parser = cli.build_parser()
    args, rest = parser.parse_known_args(
        ["dynamo-worker", "--config", "x.yaml", "--discovery-backend", "file"]
    )
    assert args.passthrough is True
    assert rest == ["--config", "x.yaml", "--discovery-backend", "file"]


def test_other_commands_still_refuse_unknown_flags(capsys: pytest.CaptureFixture[str]) -> None:
    from orchestrator import cli

    with pytest.raises(SystemExit) as info:
        cli.main(["doctor", "--config", "x.yaml", "--no-such-flag"])
    assert info.value.code == 2
    assert "unrecognized arguments: --no-such-flag" in capsys.readouterr().err


# ---------------------------------------------------------------- the engine front
# The worker serves through the gateway's AsyncEngine (orchestrator/common/async_engine.py,
# tested with the gateway); these are the behaviours the worker relies on.

ENGINE_TIMEOUT_S = 10.0


def _submission(request_id: str, max_tokens: int = 3, prompt_len: int = 20) -> Submission:
    return Submission(request_id, tuple(range(1, prompt_len + 1)), SamplingParams(max_tokens))


async def _drain(stream: RequestStream) -> list[RequestOutput | EngineError]:
    """Every output of ``stream``, then the error that ended it, if one did."""
    items: list[RequestOutput | EngineError] = []
    try:
        for _ in range(1000):  # far more than any test request produces
            item = await asyncio.wait_for(anext(stream), ENGINE_TIMEOUT_S)
            items.append(item)
            if item.finished:
                return items
    except EngineError as err:
        return [*items, err]
    raise AssertionError("the request never finished")


def test_the_engine_runs_requests_to_completion_and_refuses_what_the_core_refuses() -> None:
    async def scenario() -> None:
        core, _ = make_engine(max_waiting_requests=2)
        engine = AsyncEngine(core)
        engine.start()
        streams = [await engine.submit(_submission(f"r{i}")) for i in range(2)]
        for stream in streams:
            items = await _drain(stream)
            last = items[-1]
            assert isinstance(last, RequestOutput) and last.finish_reason is FinishReason.LENGTH
            assert sum(len(i.new_token_ids) for i in items if isinstance(i, RequestOutput)) == 3
        with pytest.raises(AdmissionError):
            await engine.submit(_submission("too-long", prompt_len=5000))
        assert engine.num_live_requests == 0
        await engine.shutdown()
        assert core.executor.shut_down  # type: ignore[attr-defined]
        with pytest.raises(EngineDeadError):
            await engine.submit(_submission("late"))

    asyncio.run(scenario())


def test_an_abort_wakes_the_consumer_and_frees_the_blocks_before_the_next_step() -> None:
    """Dynamo's ``abort(context)`` while ``generate`` reads the request's stream: the
    reader gets ``RequestAbortedError`` (it answers with a cancelled chunk)."""

    async def scenario() -> None:
        core, _ = make_engine()
        # The second step waits until the abort is sent, so the request cannot finish
        # first on a fast machine (the fake executor takes no time).
        released = threading.Event()
        core.executor.hold_after(1, released)  # type: ignore[attr-defined]
        engine = AsyncEngine(core)
        engine.start()
        stream = await engine.submit(_submission("long", max_tokens=500))
        first = await asyncio.wait_for(anext(stream), ENGINE_TIMEOUT_S)
        assert isinstance(first, RequestOutput)
        executor = core.executor
        plans_at_abort = len(executor.plans)  # type: ignore[attr-defined]
        engine.abort("long", RequestAbortedError("request long was aborted"))
        released.set()
        items = await _drain(stream)
        assert isinstance(items[-1], RequestAbortedError)
        await _drain(await engine.submit(_submission("next")))
        # At most the step in flight when it was aborted still ran it.
        later = executor.plans[plans_at_abort + 1 :]  # type: ignore[attr-defined]
        assert later and all(s.request_id != "long" for p in later for s in p.scheduled)
        assert core.scheduler.kv.num_used_blocks == 0
        core.scheduler.kv.integrity_check()
        await engine.shutdown()

    asyncio.run(scenario())


def test_a_failing_step_fails_every_live_request_and_marks_the_engine_dead() -> None:
    async def scenario() -> None:
        core, _ = make_engine()
        core.executor.crash_after(1)  # type: ignore[attr-defined]
        engine = AsyncEngine(core)
        engine.start()
        stream = await engine.submit(_submission("doomed", max_tokens=50))
        items = await _drain(stream)
        assert isinstance(items[-1], EngineDeadError)
        await asyncio.wait_for(engine.crashed.wait(), ENGINE_TIMEOUT_S)
        assert not engine.is_running
        with pytest.raises(EngineDeadError):
            await engine.submit(_submission("after"))
        await engine.shutdown()

    asyncio.run(scenario())


# ---------------------------------------------------------------- the worker's settings


def _write_config(path: Path, server: str) -> Path:
    base = (ROOT / "configs" / "serve" / "smollm2-cpu.yaml").read_text()
    head = base.split("\nserver:")[0]
    path.write_text(head + "\nserver:\n" + server)
    return path


def test_the_worker_reads_its_server_settings_and_ignores_the_gateways(tmp_path: Path) -> None:
    path = _write_config(
        tmp_path / "c.yaml",
        "  port: 8123\n  api_keys: [k]\n  max_tokens_limit: 64\n  drain_timeout_s: 3\n",
    )
    config, settings = load_worker_config(path)
    assert config.model.name == "SmolLM2-135M-Instruct"
    assert (settings.max_tokens_limit, settings.drain_timeout_s) == (64, 3.0)
    assert settings.tenant_slo_classes == {}


def test_bad_worker_settings_name_the_key(tmp_path: Path) -> None:
    bad = _write_config(tmp_path / "bad.yaml", "  max_tokens_limit: 0\n")
    with pytest.raises(ConfigError, match="server: max_tokens_limit"):
        load_worker_config(bad)
    unknown = _write_config(tmp_path / "u.yaml", "  tenant_slo_classes: {acme: gold}\n")
    with pytest.raises(ConfigError, match=r"class 'gold' is not in scheduler\.slo_classes"):
        load_worker_config(unknown)
