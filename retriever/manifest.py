"""The retriever artifact's manifest.json as a typed record.

Fields are the keys ``write_artifact`` has always written, in the order it writes them;
unknown keys are kept (``extra="allow"``) so artifacts written by other releases still load
and round-trip. What every manifest this code has ever written holds (format, version,
backbone, dim, n_items, max_len; the old-artifact fixtures included) is required, so readers
need no None checks and a file lacking one is refused by the loader, naming the field; the
checksum list stays optional so that the loader reports it with its own message.
Read it by attribute; ``to_dict()`` gives the keys the file holds, in its order, for writing.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from common.folders import register_folder_kind
from retriever.repeats import LEGACY_REPEATS, RepeatPolicy

FORMAT = "seqrec.retriever/1"
register_folder_kind("seqrec.retriever",
                     "a retriever artifact or bundle written by `seqrec train` or `seqrec pipeline`")


class RetrieverManifest(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    format: str
    version: str
    created_at: str | None = None
    git_sha: str | None = Field(None, description="the seqrec checkout's commit; absent when run from an install")
    seqrec_version: str | None = Field(None, description="the seqrec release that wrote it; absent in artifacts "
                                       "written before it was recorded")
    backbone: str
    dim: int
    n_items: int
    max_len: int
    dataset: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    index: dict[str, Any] = Field(default_factory=dict, description="IndexSpec.to_dict() of items.faiss")
    training: dict[str, Any] | None = Field(None, description="written by `seqrec train`: epochs, seconds, speed")
    repeats: RepeatPolicy = Field(
        LEGACY_REPEATS, description="the bundle's resolved repeat policy (retriever.config), the one source of "
        "truth that mining, the ranker, evaluation and the service's default exclude_seen follow; absent in "
        "artifacts older than the policy, which behave as exclude")
    compiled: dict[str, Any] | None = Field(
        None, description="what `retriever.compiled` wrote: {'encoder': 'onnx', ...} with encoder.onnx beside the "
        "weights, or {'encoder': 'eager', 'reason': ...}; absent in artifacts older than the compiled path")
    sha256: dict[str, str] | None = Field(None, description="file name -> sha256 of every file in the artifact")

    @property
    def exclude_seen(self) -> bool:
        """Whether the history is removed from what this bundle ranks (its repeat policy)."""
        return self.repeats == "exclude"

    def to_dict(self) -> dict[str, Any]:
        """The keys the file holds (defaults it did not hold left out), as JSON-ready values."""
        return self.model_dump(mode="json", exclude_unset=True)
