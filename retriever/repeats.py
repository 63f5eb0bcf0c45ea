"""The repeat policy: may an item of the user's history be recommended (and count as a hit) again?

    exclude: never. Evaluation removes the whole history, so a repeat target is unreachable (a
             miss); mining and the service remove it too.
    allow:   nothing is removed for anyone; history items compete on their merit in evaluation,
             mining, the ranker's training and the service.
    auto:    allow when more than REPEAT_THRESHOLD of the validation targets are repeats, else
             exclude (decided on validation only, from the prepared data).

The run config (``train.repeats``) holds the request; the retriever manifest's ``repeats`` holds
the resolved policy, the one record that mining, the ranker, evaluation and the service's default
``exclude_seen`` follow. Artifacts written before the policy existed have none and behave as
exclude, as they always did.

REPEAT_THRESHOLD: under exclude a repeat target can never be a hit, so the repeat share is the part
of HR@k that exclusion gives away for certain. 1 % sits well above the zero of data without
re-consumption (Beauty and ML-100K: 0.0 %) and below the shares of data where users come back to
items (re-purchases, music, news re-reads: several per cent and up; one public dataset: 6.7 %).
It is a property of the data, never of a dataset's name.
"""

from __future__ import annotations

from typing import Literal

RepeatPolicy = Literal["exclude", "allow"]
REPEATS: tuple[str, ...] = ("auto", "exclude", "allow")
REPEAT_THRESHOLD = 0.01
LEGACY_REPEATS: RepeatPolicy = "exclude"


def resolve_repeats(requested: str, valid_share: float) -> RepeatPolicy:
    """The policy a run follows: ``requested`` itself, or for "auto" the one the validation share implies."""
    if requested == "auto":
        return "allow" if valid_share > REPEAT_THRESHOLD else "exclude"
    if requested == "allow":
        return "allow"
    if requested == "exclude":
        return "exclude"
    raise ValueError(f"unknown repeat policy {requested!r}; choose one of {', '.join(REPEATS)}")
