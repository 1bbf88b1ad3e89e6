"""schema.py: the one key checker every parser's table goes through: what it reports, first found first."""

import pytest

from imgtool.errors import UsageError
from imgtool.schema import Invalid, Key, Table, is_a, one_of, strings


class Reported(Exception):
    pass


def fail(key, problem):
    raise Reported(key, problem)


def positive(value):
    if value <= 0:
        raise Invalid()
    return value


def even(value):
    if value % 2:
        raise Invalid("{key} = {value!r} is odd")
    return value


def port(value):
    if value > 65535:
        raise UsageError(f"invalid port {value}")
    return value


TABLE = Table(
    Key("name", str, required=True, what="a string"),
    Key("count", int, what="an integer", check=positive),
    Key("pairs", int, what="an integer", check=even),
    Key("port", int, what="a port", check=port),
    Key("flag", bool, what="true or false"),
    Key("tags", list, what="a list of strings", check=strings),
    Key("mode", check=one_of(("a", "b"), "invalid mode {value!r}: use {choices}")),
)


@pytest.mark.parametrize("obj, reported", [
    ({"name": "x", "colour": 1}, ("colour", "unknown key 'colour' (expected name, count, pairs, port, flag, tags, mode)")),
    ({"count": 1}, (None, "missing key 'name'")),
    ({"name": 3}, ("name", "name must be a string")),
    ({"name": "x", "count": True}, ("count", "count must be an integer")),  # a bool is not an int
    ({"name": "x", "count": 0}, ("count", "count must be an integer")),  # Invalid: the key's words
    ({"name": "x", "pairs": 3}, ("pairs", "pairs = 3 is odd")),  # Invalid with its own words
    ({"name": "x", "port": 70000}, ("port", "invalid port 70000")),  # a domain parser's UsageError
    ({"name": "x", "flag": 1}, ("flag", "flag must be true or false")),
    ({"name": "x", "tags": ["a", 1]}, ("tags", "tags must be a list of strings")),
    ({"name": "x", "mode": "c"}, ("mode", "invalid mode 'c': use a, b")),
])
def test_the_first_problem_is_reported_at_its_key(obj, reported):
    with pytest.raises(Reported) as e:
        TABLE.check(obj, fail)
    assert e.value.args == reported


def test_values_come_back_checked_and_absent_keys_stay_absent():
    assert TABLE.check({"name": "x", "count": 2, "tags": ["a"], "mode": "b"}, fail) == {
        "name": "x", "count": 2, "tags": ["a"], "mode": "b"}
    assert TABLE.check({"name": "x", "other": 1}, fail, unknown=False) == {"name": "x"}
    assert TABLE.required == ("name",)


def test_templates_name_where_the_table_is():
    table = Table(Key("size", int), wrong="`{where}{key}` is not a size: {value!r}")
    with pytest.raises(Reported) as e:
        table.check({"size": "big"}, fail, where="images[0].")
    assert e.value.args == ("size", "`images[0].size` is not a size: 'big'")


def test_a_bool_is_an_int_only_when_bool_is_named():
    assert not is_a(True, int) and is_a(True, (int, bool)) and is_a(True, object) and is_a(3, int)
