"""Where a state holds a value JSON cannot carry: the path to it, what it is, what to give instead."""

from __future__ import annotations

import json
from datetime import date, datetime
from decimal import Decimal
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from airflow_provider_systemzero.protocol.body import compact_json
from airflow_provider_systemzero.protocol.validation import json_fault, not_json_message

JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


@given(JSON)
def test_a_json_value_has_no_fault(value: Any) -> None:
    compact_json(value)
    assert json_fault(value) is None


@given(JSON, st.lists(st.sampled_from(["k", 0]), max_size=4))
def test_the_path_leads_to_the_one_value_json_refuses(value: Any, route: list[Any]) -> None:
    """Put a date somewhere in a JSON value: the path named is where it is."""
    holder: Any = {"k": value} if not route or route[0] == "k" else [value]
    root = holder
    path = "state"
    for step in route:
        key = step if isinstance(holder, dict) else 0
        path += f"[{key!r}]"
        child: Any = {"k": None} if step == "k" else [None]
        holder[key] = child
        holder = child
    key = "k" if isinstance(holder, dict) else 0
    holder[key] = date(2026, 1, 1)
    path += f"[{key!r}]"
    with pytest.raises(TypeError):
        json.dumps(root)
    assert json_fault(root) == (path, "a datetime.date", "its text: str(value), or value.isoformat()")


@pytest.mark.parametrize(
    ("state", "said"),
    [
        (
            {"a": [1, float("inf")]},
            "state['a'][1] is the number inf, which JSON cannot carry: give a finite number, or None",
        ),
        ({"a": {1.5, 2}}, "state['a'] is a set, which JSON cannot carry: give a list: sorted(value)"),
        (
            {"a": Decimal("1.10")},
            "state['a'] is a decimal.Decimal, which JSON cannot carry: give float(value)",
        ),
        (
            {("x", 1): "v"},
            "state is an object with a key of type tuple, which JSON cannot carry: give string keys",
        ),
        ([b"raw"], "state[0] is a bytes, which JSON cannot carry: give text: value.decode()"),
    ],
)
def test_the_message_names_the_value_and_the_fix(state: Any, said: str) -> None:
    with pytest.raises((TypeError, ValueError)) as refused:
        compact_json(state)
    message = not_json_message(state, "state", refused.value)
    assert message.startswith(said) and message.endswith("; nothing was sent")


def test_a_state_that_holds_itself_is_named_where_it_loops() -> None:
    state: dict[str, Any] = {"steps": []}
    state["steps"].append(state)
    assert json_fault(state) == (
        "state['steps'][0]",
        "the dict that holds it",
        "a copy that does not refer back to itself",
    )


def test_a_template_is_offered_only_for_a_templated_argument() -> None:
    state = {"deploy": {"started": datetime(2026, 1, 1)}}
    error = TypeError("Object of type datetime is not JSON serializable")
    assert "a template that renders it as text" in not_json_message(state, "state", error, templated=True)
    assert "template" not in not_json_message(state, "state", error)
    # where the value has another name than the path's root, the message gives both
    assert not_json_message(state, "the callable source 'm.f'", error).startswith(
        "state['deploy']['started'] is a datetime.datetime, which JSON cannot carry (the callable source 'm.f'):"
    )
