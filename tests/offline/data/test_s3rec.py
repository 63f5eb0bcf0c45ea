import json

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
    [("1 2 3\n2\n", 2, "no items"), ("1 2 3\n2 4\n1 5\n", 3, "appears again"), (b"1 2\n2 \xff\n", 2, "utf-8")],
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
