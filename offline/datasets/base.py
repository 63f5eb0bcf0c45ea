"""What every dataset reader returns, and the columns it must hold."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa

# Columns of RawDataset.interactions, in file order (the order matters: ties on
# timestamp keep it).
USER, ITEM, TIME = "user_id", "item_id", "timestamp"


@dataclass
class RawDataset:
    """Interactions as read from the source, before sorting, filtering or id mapping.

    interactions: ``user_id`` (string), ``item_id`` (string), ``timestamp`` (int64 or
        float64; null where the source has no clock, see ``has_timestamps``), optionally
        ``rating`` (float64). Rows are in the source file's order.
    items: ``item_id`` (string) plus metadata columns (``title``, ``year``, ``genres`` or
        ``attributes`` lists, ...), or None when the source has no item metadata.
    users: ``user_id`` (string) plus metadata columns, or None.
    has_timestamps: False when the source gives only an order (S3-Rec lines); then the
        ``timestamp`` column holds each interaction's position in its user's line.
    files: the source files read, for the manifest's fingerprint.
    """

    source: str
    interactions: pa.Table
    items: pa.Table | None = None
    users: pa.Table | None = None
    has_timestamps: bool = True
    files: list[Path] = field(default_factory=list)

    def __post_init__(self) -> None:
        missing = {USER, ITEM, TIME} - set(self.interactions.column_names)
        if missing:
            raise ValueError(f"interactions lack columns {sorted(missing)}")
        for name in (USER, ITEM):
            if not pa.types.is_string(self.interactions.schema.field(name).type):
                raise ValueError(f"interactions column {name!r} must be string")
        for table in (self.items, self.users):
            key = USER if table is self.users else ITEM
            if table is not None and key not in table.column_names:
                raise ValueError(f"metadata table lacks its key column {key!r}")


def int_if_integral(values: pa.Array | pa.ChunkedArray) -> pa.Array | pa.ChunkedArray:
    """Numbers as int64 when every value is a whole number, else unchanged (a safe cast
    refuses fractions, NaN, infinities and overflow)."""
    try:
        return values.cast(pa.int64())
    except pa.ArrowInvalid:
        return values


def natural_key(value: str) -> tuple[int, int, str]:
    """Sort key putting numeric ids in numeric order ("2" < "10"), then other ids."""
    return (0, int(value), "") if value.isdigit() else (1, 0, value)
