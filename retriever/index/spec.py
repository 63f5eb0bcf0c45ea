"""How an index is built and searched (``IndexSpec``), and the default for a catalogue size."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields
from typing import Any, Literal, get_args

from common.errors import RetrieverError

IndexKind = Literal["flat", "hnsw", "ivf"]
_KINDS: tuple[str, ...] = get_args(IndexKind)

# Above this many items exact search stops being "a few ms per batch" on CPU (see spec_for_catalogue).
_FLAT_MAX_ITEMS = 200_000


class IndexSpecError(RetrieverError):
    """An index setting that cannot be built or searched (a bad option, or one the catalogue cannot support)."""


@dataclass(frozen=True)
class IndexSpec:
    """How to build and search an index; serialisable with :meth:`to_dict` / :meth:`from_dict`.

    ``nlist=None`` picks about ``4 * sqrt(n)`` lists, clipped to ``[1, n // 39]``. ``pq_m=None`` stores
    full vectors in the lists (IVF-Flat); otherwise IVF-PQ with ``pq_m`` sub-quantizers of 8 bits each,
    which needs ``d % pq_m == 0`` and at least 256 training vectors.

    ``gpu_shard`` only matters when the index is loaded onto several GPUs: False puts a full copy on
    each (faiss ``IndexReplicas``: queries spread over the GPUs, for throughput), True splits the
    vectors across them (``IndexShards``: each GPU holds 1/n of the catalogue and every query asks
    all of them, for catalogues too big for one GPU's memory).
    """

    kind: IndexKind = "flat"
    hnsw_m: int = 32
    ef_construction: int = 200
    ef_search: int = 128
    nlist: int | None = None
    nprobe: int = 32
    pq_m: int | None = None
    gpu_shard: bool = False

    def __post_init__(self) -> None:
        # Specs arrive from JSON/YAML configs, so the annotations alone guarantee nothing at runtime.
        if self.kind not in _KINDS:
            raise IndexSpecError(f"unknown index kind {self.kind!r}; expected one of {', '.join(_KINDS)}")
        minimum = {"hnsw_m": 2, "ef_construction": 1, "ef_search": 1, "nprobe": 1, "nlist": 1, "pq_m": 1}
        optional = {"nlist", "pq_m"}
        for name, low in minimum.items():
            value = getattr(self, name)
            if value is None and name in optional:
                continue
            # bool is an int subclass; True as a list count is a config mistake, not 1.
            if isinstance(value, bool) or not isinstance(value, int):
                raise IndexSpecError(f"index option {name} must be an int, got {value!r}")
            if value < low:
                raise IndexSpecError(f"index option {name} must be >= {low}, got {value}")
        if not isinstance(self.gpu_shard, bool):
            raise IndexSpecError(f"index option gpu_shard must be true or false, got {self.gpu_shard!r}")

    def to_dict(self) -> dict[str, object]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, object]) -> IndexSpec:
        """Inverse of :meth:`to_dict`; missing keys take their defaults, unknown keys are an error."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(str(key) for key in set(d) - known)
        if unknown:
            raise IndexSpecError(f"unknown index options: {', '.join(unknown)}; known: {', '.join(sorted(known))}")
        # Any: value types are checked by __post_init__, which gives a better message than a TypeError.
        kwargs: dict[str, Any] = dict(d)
        return cls(**kwargs)


def spec_for_catalogue(n_items: int) -> IndexSpec:
    """A sensible default index for a catalogue of ``n_items`` items (``--index auto``).

    Exact (``flat``) search up to 200,000 items: a batch of queries against it is one BLAS matrix product,
    a few ms per query on CPU, with perfect recall and no build time. Beyond that the cost grows linearly
    with the catalogue, so HNSW (M 32, efConstruction 128, efSearch 256) takes over. `seqrec bench index`
    measured that setting on 10^6 clustered 64-d vectors at recall@100 0.98-0.99 and about 1 ms a query on
    one CPU thread (docs/SCALE.md). HNSW is chosen over IVF, which was cheaper on those clustered vectors,
    because its recall degrades gracefully on vectors without cluster structure where IVF's collapses; the
    price is a build of minutes and ~M * 8 bytes per item of graph. How well any setting does depends on
    the vectors: `seqrec bench index --artifact A` measures it on a bundle's own item vectors.
    """
    if n_items < 0:
        raise IndexSpecError(f"n_items must be >= 0, got {n_items}")
    if n_items <= _FLAT_MAX_ITEMS:
        return IndexSpec(kind="flat")
    return IndexSpec(kind="hnsw", hnsw_m=32, ef_construction=128, ef_search=256)
