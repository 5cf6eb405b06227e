"""The keyword builders of the per-step records pass every field to its own slot, and a
decode's plan entry carries a shared one-token tuple."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any, NamedTuple

import pytest

from orchestrator.core.output import (
    RequestOutput,
    ScheduledRequest,
    request_output,
    scheduled_request,
)
from orchestrator.core.request import Request

PAIRS = [(ScheduledRequest, scheduled_request), (RequestOutput, request_output)]


@pytest.mark.parametrize(("record", "builder"), PAIRS, ids=lambda x: x.__name__)
def test_a_builder_takes_its_records_fields_by_name_only_with_the_same_defaults(
    record: type[NamedTuple], builder: Callable[..., Any]
) -> None:
    params = inspect.signature(builder).parameters
    assert tuple(params) == record._fields
    assert all(p.kind is inspect.Parameter.KEYWORD_ONLY for p in params.values())
    defaults = {name: p.default for name, p in params.items() if p.default is not p.empty}
    assert defaults == record._field_defaults


@pytest.mark.parametrize(("record", "builder"), PAIRS, ids=lambda x: x.__name__)
def test_a_built_record_equals_the_class_built_by_name_field_for_field(
    record: type[NamedTuple], builder: Callable[..., Any]
) -> None:
    # A distinct value per field, so a swapped pair of fields cannot pass.
    values = {name: f"value-{i}" for i, name in enumerate(record._fields)}
    built = builder(**values)
    assert type(built) is record
    assert built == record(**values)
    assert {name: getattr(built, name) for name in record._fields} == values


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
