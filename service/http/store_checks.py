"""The argument checks both history stores (`service.http.store`) apply before touching any state."""

from __future__ import annotations


def check_user(user_id: str) -> None:
    if not isinstance(user_id, str) or not user_id:
        raise ValueError(f"user_id must be a non-empty string, got {user_id!r}")


def check_max_len(max_len: int) -> None:
    if isinstance(max_len, bool) or not isinstance(max_len, int) or max_len < 1:
        raise ValueError(f"max_len must be an integer >= 1, got {max_len!r}")


def check_seen_cap(seen_cap: int) -> int:
    if isinstance(seen_cap, bool) or not isinstance(seen_cap, int) or seen_cap < 1:
        raise ValueError(f"seen_cap must be an integer >= 1, got {seen_cap!r}")
    return seen_cap
