import json
import re

import pytest

from offline.data.errors import DataError
from offline.data.readers.s3rec import read_s3rec


def test_lines_become_ordered_interactions_with_attributes(write, tmp_path):
    write("Toy.txt", "1 5 3 5\n2 3 1\n")
    write("Toy_item2attributes.json", json.dumps({"5": [7, 8], "3": [8]}))
    raw = read_s3rec(tmp_path)
    assert raw.interactions.to_pydict() == {
        "user_id": ["1", "1", "1", "2", "2"],
        "item_id": ["5", "3", "5", "3", "1"],
        "timestamp": [0, 1, 2, 0, 1],
    }
    assert not raw.has_timestamps
    assert raw.items.to_pylist() == [
        {"item_id": "1", "attributes": []},
        {"item_id": "3", "attributes": ["8"]},
        {"item_id": "5", "attributes": ["7", "8"]},
    ]
    assert [p.name for p in raw.files] == ["Toy.txt", "Toy_item2attributes.json"]


def test_attributes_are_optional(write):
    raw = read_s3rec(write("Toy.txt", "1 2 3\n"))
    assert raw.items is None


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [("1 2 3\n2\n", 2, "no items"), ("1 2 3\n2 4\n1 5\n", 3, "appears again"), (b"1 2\n2 \xff\n", 2, "utf-8"),
     # one item '10,20,30' before, the user then dropped as too short: exit 0 with the data gone
     ("2 10 30 20\n1 10,20,30\n", 2, "separated by spaces, found '10,20,30'"),
     ("1 10;20\n", 1, "separated by spaces, found '10;20'"), ("1,10,20\n", 1, "separated by spaces")],
)
def test_bad_lines(write, text, line, reason):
    path = write("Toy.txt", text)
    with pytest.raises(DataError, match=reason) as info:
        read_s3rec(path)
    assert info.value.line == line
    assert info.value.path == str(path)


def test_bad_attributes_json(write, tmp_path):
    write("Toy.txt", "1 2 3\n")
    write("Toy_item2attributes.json", "{not json")
    with pytest.raises(DataError, match="not valid JSON"):
        read_s3rec(tmp_path)


@pytest.mark.parametrize(("values", "found"), [
    ([1, [2, 3]], "list [2, 3]"), ([1.0], "float 1.0"), ([True], "bool true"), ([None], "NoneType null"),
    ([{"a": 1}], 'dict {"a": 1}'),
])
def test_attribute_ids_are_integers_or_strings(write, tmp_path, values, found):
    """str() stored '[2, 3]', 'True', 'None' as attribute ids."""
    write("Toy.txt", "1 2 3\n")
    write("Toy_item2attributes.json", json.dumps({"2": ["a", 7], "3": values}))
    with pytest.raises(DataError, match=re.escape(f"item '3': attribute ids are integers or strings, found {found}")):
        read_s3rec(tmp_path)


def test_attributes_that_match_no_item_are_reported(write, tmp_path, caplog):
    write("Toy.txt", "1 2 3\n")
    write("Toy_item2attributes.json", json.dumps({"2": [7], "a1": [1], "a2": [2]}))
    raw = read_s3rec(tmp_path)
    assert raw.items is not None
    assert raw.items.column("attributes").to_pylist() == [["7"], []]
    assert "1 of 2 items have no entry (their attributes are empty); 2 entries name no item" in caplog.text
