"""Read an index back, place it on CPU or GPU(s), and set its search parameters.

GPU support is optional: the CPU-only ``faiss-cpu`` wheel lacks the GPU API entirely, so every GPU
call is guarded and the code falls back to CPU.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any, cast

import faiss

from retriever.index.spec import IndexKind, IndexSpec

logger = logging.getLogger(__name__)


def load_index(path: Path, spec: IndexSpec | None = None, *, gpu: bool | None = None) -> faiss.Index:
    """Read an index written by :func:`save_index`, optionally applying ``spec``'s search parameters.

    ``gpu=None`` moves flat and IVF indexes to the GPU(s) when faiss sees one, ``gpu=False`` never does,
    and ``gpu=True`` requires a GPU (ValueError otherwise). With several GPUs, ``spec.gpu_shard`` picks
    shards over replicas (:func:`gpu_cloner_options`). HNSW always stays on CPU: faiss has no GPU
    search for a CPU-built HNSW graph.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no index file at {path}")
    try:
        index = faiss.read_index(str(path))
    except RuntimeError as err:
        raise ValueError(f"{path} is not a readable faiss index: {err}") from err
    if spec is not None:
        set_search_params(index, spec)

    want_gpu = gpu_available() if gpu is None else gpu
    if not want_gpu:
        return index
    if gpu and not gpu_available():
        raise ValueError("gpu=True but faiss sees no GPU (CPU-only faiss build or no device)")
    kind = kind_of(index)
    if kind == "hnsw":
        if gpu:
            logger.warning("HNSW has no GPU search in faiss; %s stays on CPU", path)
        return index
    options = gpu_cloner_options(spec)
    try:
        # Clones copy nprobe, so the search parameters set above carry over.
        moved = faiss.index_cpu_to_all_gpus(index, co=options)
    except RuntimeError as err:
        # e.g. an IVF-PQ layout the GPU kernels do not support.
        if gpu:
            raise ValueError(f"could not move {path} to GPU: {err}") from err
        logger.warning("could not move %s to GPU, searching on CPU: %s", path, err)
        return index
    logger.info("loaded %s onto %d GPU(s) (%s)", path, faiss.get_num_gpus(),
                "sharded" if options.shard else "replicated")
    return moved


def set_search_params(index: faiss.Index, spec: IndexSpec) -> None:
    """Apply ``spec.ef_search`` / ``spec.nprobe`` to whichever structure ``index`` actually is.

    The index's own structure decides, not ``spec.kind``: a loaded file is the source of truth, and a
    mismatch is only logged.
    """
    kind = kind_of(index)
    if kind is None:
        logger.warning("no search parameters known for %s; left unchanged", type(index).__name__)
        return
    if kind != spec.kind:
        logger.warning("spec says %r but the index is %r; applying the %r parameters", spec.kind, kind, kind)
    gpu = is_gpu_index(index)
    space = faiss.GpuParameterSpace() if gpu else faiss.ParameterSpace()
    if kind == "hnsw":
        space.set_index_parameter(index, "efSearch", spec.ef_search)
    elif kind == "ivf":
        leaf = unwrap(index)
        nlist = getattr(leaf, "nlist", None)
        # faiss clamps nprobe at search time on CPU; clamping here keeps GPU (max 2048) happy as well.
        nprobe = min(spec.nprobe, int(nlist)) if isinstance(nlist, int) and nlist > 0 else spec.nprobe
        space.set_index_parameter(index, "nprobe", nprobe)


def gpu_cloner_options(spec: IndexSpec | None) -> Any:
    """faiss's options for copying an index onto every GPU: replicas (the default) or shards (``gpu_shard``).

    Only GPU builds of faiss have the class; callers reach this after :func:`gpu_available`.
    """
    options: Any = cast(Any, faiss).GpuMultipleClonerOptions()
    options.shard = bool(spec is not None and spec.gpu_shard)
    return options


def gpu_available() -> bool:
    """True when this faiss build has the GPU API and sees at least one device."""
    return hasattr(faiss, "StandardGpuResources") and faiss.get_num_gpus() > 0


def unwrap(index: faiss.Index) -> faiss.Index:
    """Descend through wrappers (GPU replicas/shards, ID maps, transforms, refinement) to the core index."""
    index = faiss.downcast_index(index)
    while True:
        if isinstance(index, faiss.IndexReplicas | faiss.IndexShards):
            # faiss's type stubs omit ThreadedIndex.count/at, hence the Any.
            threaded: Any = index
            if threaded.count() == 0:
                return index
            index = faiss.downcast_index(threaded.at(0))
        elif isinstance(index, faiss.IndexPreTransform | faiss.IndexIDMap | faiss.IndexIDMap2):
            index = faiss.downcast_index(index.index)
        elif isinstance(index, faiss.IndexRefine):
            index = faiss.downcast_index(index.base_index)
        else:
            return index


def kind_of(index: faiss.Index) -> IndexKind | None:
    leaf = unwrap(index)
    if isinstance(leaf, faiss.IndexHNSW):
        return "hnsw"
    gpu_ivf = getattr(faiss, "GpuIndexIVF", None)
    if faiss.try_extract_index_ivf(leaf) is not None or (gpu_ivf is not None and isinstance(leaf, gpu_ivf)):
        return "ivf"
    gpu_flat = getattr(faiss, "GpuIndexFlat", None)
    if isinstance(leaf, faiss.IndexFlat) or (gpu_flat is not None and isinstance(leaf, gpu_flat)):
        return "flat"
    return None


def is_gpu_index(index: faiss.Index) -> bool:
    gpu_base = getattr(faiss, "GpuIndex", None)
    return gpu_base is not None and isinstance(unwrap(index), gpu_base)
