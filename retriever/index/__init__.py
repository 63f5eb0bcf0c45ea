"""FAISS export and search layer for item vectors.

Item vectors are stored one per index row: row ``r`` of the index is row ``r`` of the matrix handed to
:func:`build_index`, so callers keep their own row <-> item-id mapping and this module never sees ids.
Every index uses the inner-product metric; callers L2-normalise first (:func:`normalize`) when they want
cosine similarity.

Three structures are offered (:class:`IndexSpec`):

* ``flat``: exact search, no training, the default for catalogues up to a few hundred thousand items;
* ``hnsw``: a graph index, CPU only, fast approximate search for big catalogues;
* ``ivf``: inverted lists over k-means cells, optionally product-quantised (``pq_m``) to save memory,
  and the structure that runs on GPU.

The package is split by job: ``spec`` (what to build), ``build`` (build and save), ``device``
(load, CPU/GPU placement, search parameters) and ``topk`` (search); the names below are the
public interface, importable from ``retriever.index``.
"""

from retriever.index.build import build_index, normalize, save_index
from retriever.index.device import gpu_available, gpu_cloner_options, load_index, set_search_params
from retriever.index.spec import IndexKind, IndexSpec, IndexSpecError, spec_for_catalogue
from retriever.index.topk import search

__all__ = [
    "IndexKind",
    "IndexSpec",
    "IndexSpecError",
    "build_index",
    "gpu_available",
    "gpu_cloner_options",
    "load_index",
    "normalize",
    "save_index",
    "search",
    "set_search_params",
    "spec_for_catalogue",
]
