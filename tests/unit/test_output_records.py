"""The per-step records are built by field name only, cannot be changed, and are
invisible to the cyclic collector; a decode's plan entry carries a shared one-token
tuple."""

from __future__ import annotations

import gc
from typing import Any

import msgspec
import pytest

from orchestrator.core.output import RequestOutput, ScheduledRequest
from orchestrator.core.request import Request, SamplingParams

# Every field without a default, with a distinct value each, so a swapped pair of fields
# cannot pass.
REQUIRED: dict[type[msgspec.Struct], dict[str, Any]] = {
    ScheduledRequest: {
        "request_id": "a",
        "token_ids": (5,),
        "start_position": 3,
        "block_table": (0, 1),
        "sample": True,
        "sampling": SamplingParams(max_tokens=4),
    },
    RequestOutput: {
        "request_id": "a",
        "new_token_ids": (5,),
        "new_logprobs": (),
        "finished": False,
        "finish_reason": None,
        "num_prompt_tokens": 7,
        "num_output_tokens": 2,
    },
}
RECORDS = list(REQUIRED)


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_a_record_takes_its_fields_by_name_only(record: type[msgspec.Struct]) -> None:
    fields = REQUIRED[record]
    built = record(**fields)
    assert {name: getattr(built, name) for name in fields} == fields
    with pytest.raises(TypeError):
        record(*fields.values())


@pytest.mark.parametrize("record", RECORDS, ids=lambda r: r.__name__)
def test_a_record_cannot_be_changed_and_the_collector_does_not_track_it(
    record: type[msgspec.Struct],
) -> None:
    built = record(**REQUIRED[record])
    with pytest.raises(AttributeError):
        built.request_id = "b"  # type: ignore[misc]
    # Not tracked, not counted: building one per running request per step never
    # triggers a collection.
    assert not gc.is_tracked(built)
    gc.collect()
    before = gc.get_count()[0]
    kept = [record(**REQUIRED[record]) for _ in range(1000)]  # alive while counted
    assert gc.get_count()[0] - before < 10, "building records counted toward a collection"
    del kept


def test_the_optional_fields_default_to_nothing_happened() -> None:
    plan = ScheduledRequest(**REQUIRED[ScheduledRequest])
    assert (plan.priority, plan.slo_class, plan.tenant, plan.arrival_time) == (0, None, None, 0.0)
    assert plan.constraint is None
    assert plan.num_tokens == 1 and plan.context_len == 4
    output = RequestOutput(**REQUIRED[RequestOutput])
    assert (output.error, output.first_scheduled_time, output.error_code) == (None, None, None)
    assert output.num_cached_tokens == 0


def test_a_decodes_plan_entry_shares_one_immutable_tuple_per_token() -> None:
    a, b = Request("a", [1, 2, 3]), Request("b", [4, 5])
    a.output_token_ids += [7, 9]
    b.output_token_ids += [9]
    # One output position: the same tuple for the same token, whatever the request.
    assert a.token_ids(4, 5) == (9,) and a.token_ids(4, 5) is b.token_ids(2, 3)
    assert a.token_ids(3, 4) == (7,)
    # Longer spans are the tokens as lists, prompt then output.
    assert a.token_ids(2, 5) == [3, 7, 9] and a.token_ids(0, 2) == [1, 2]
    assert a.token_ids(3, 5) == [7, 9]
