from __future__ import annotations

import pytest

from queueing.exceptions import InvalidKey
from queueing.keys import KeyFormat, validate_key

STAGE = KeyFormat(parts=("stage", "tenant", "anfrage"))


def test_build_joins_validated_parts_in_declared_order():
    assert STAGE.build(tenant="acme", anfrage=42, stage="extract") == "extract:acme:42"


def test_prefix_is_the_first_part():
    assert KeyFormat(prefix="sweep", parts=("name",)).build(name="trim") == "sweep:trim"


@pytest.mark.parametrize(
    "value",
    ["", "a:b", "a/b", "with space", "x" * 65, "tab\t", "ü"],
)
def test_bad_parts_raise_a_clear_value_error(value):
    with pytest.raises(ValueError, match="key part 'tenant'"):
        STAGE.build(stage="extract", tenant=value, anfrage=1)


def test_invalid_key_is_a_value_error():
    assert issubclass(InvalidKey, ValueError)


def test_missing_and_extra_parts_are_named():
    with pytest.raises(InvalidKey, match=r"missing=\['anfrage'\] unexpected=\['user'\]"):
        STAGE.build(stage="extract", tenant="t", user="u")


def test_parse_round_trips():
    key = STAGE.build(stage="calculate", tenant="t-1", anfrage="99")
    assert STAGE.parse(key) == {"stage": "calculate", "tenant": "t-1", "anfrage": "99"}


def test_validate_key_checks_every_part():
    assert validate_key("a:b:c") == "a:b:c"
    with pytest.raises(InvalidKey):
        validate_key("a::c")
