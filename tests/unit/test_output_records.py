"""The keyword builders of the per-step records pass every field to its own slot."""

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
