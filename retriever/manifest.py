"""The retriever artifact's manifest.json as a typed record.

Fields are the keys ``write_artifact`` has always written, in the order it writes them;
unknown keys are kept (``extra="allow"``) so artifacts written by other releases still load
and round-trip. Only ``format`` and ``version`` are required: the loader reports a missing
checksum list or item count with its own, more precise messages.

``manifest["key"]``, ``manifest.get("key")`` and ``{**manifest}`` still work, with a dict's meaning (a key the
file does not hold is missing, even where the field has a default), for code written when
the manifest was a plain dict; new code reads attributes.
"""

from __future__ import annotations

from collections.abc import KeysView, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

FORMAT = "seqrec.retriever/1"


class RetrieverManifest(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)

    format: str
    version: str
    created_at: str | None = None
    git_sha: str | None = None
    backbone: str | None = None
    dim: int | None = None
    n_items: int | None = None
    max_len: int | None = None
    dataset: dict[str, Any] = Field(default_factory=dict)
    metrics: dict[str, Any] = Field(default_factory=dict)
    index: dict[str, Any] = Field(default_factory=dict, description="IndexSpec.to_dict() of items.faiss")
    training: dict[str, Any] | None = Field(None, description="written by `seqrec train`: epochs, seconds, speed")
    sha256: dict[str, str] | None = Field(None, description="file name -> sha256 of every file in the artifact")

    def to_dict(self) -> dict[str, Any]:
        """The keys the file holds (defaults it did not hold left out), as JSON-ready values."""
        return self.model_dump(mode="json", exclude_unset=True)

    def __getitem__(self, key: str) -> Any:
        if not self._holds(key):
            raise KeyError(key)
        return getattr(self, key)

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._holds(key)

    def keys(self) -> KeysView[str]:
        """The keys the file holds; with ``__getitem__`` this makes ``dict(m)`` and ``{**m}`` work."""
        return self.to_dict().keys()

    def get(self, key: str, default: Any = None) -> Any:
        return getattr(self, key) if self._holds(key) else default

    def __eq__(self, other: object) -> bool:
        # A manifest read back from disk as a dict equals the record it was written from.
        if isinstance(other, Mapping):
            return self.to_dict() == dict(other)
        return super().__eq__(other)

    def _holds(self, key: str) -> bool:
        return key in self.model_fields_set or key in (self.model_extra or {})
