"""Registry of sequence encoders: a new model is one file plus one line here.

Every encoder derives from ``SequenceEncoder`` (base.py), which states the contract and the
optional hooks with their defaults; `retriever.model.Retriever` turns an encoder into user
vectors and scores, so losses, training, export and serving are shared.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any

from retriever.backbones.base import SequenceEncoder
from retriever.backbones.bert4rec import BERT4Rec, BERT4RecConfig
from retriever.backbones.bsarec import BSARec, BSARecConfig
from retriever.backbones.hstu import HSTU, HSTUConfig
from retriever.backbones.lightsans import LightSANs, LightSANsConfig
from retriever.backbones.pcrec import PCRec, PCRecConfig
from retriever.backbones.rnn import LSTM, GRU4Rec, GRU4RecConfig, LSTMConfig
from retriever.backbones.sasrec import SASRec, SASRecConfig
from retriever.backbones.transformer import Transformer, TransformerConfig
from retriever.backbones.trm4rec import TRM4Rec, TRM4RecConfig
from retriever.backbones.xlstm import XLSTM, XLSTMConfig

__all__ = ["BACKBONES", "SequenceEncoder", "backbone_config", "build_encoder"]

BACKBONES: dict[str, tuple[type, type[SequenceEncoder]]] = {
    "transformer": (TransformerConfig, Transformer),
    "sasrec": (SASRecConfig, SASRec),
    "trm4rec": (TRM4RecConfig, TRM4Rec),
    "gru4rec": (GRU4RecConfig, GRU4Rec),
    "lstm": (LSTMConfig, LSTM),
    "bert4rec": (BERT4RecConfig, BERT4Rec),
    "lightsans": (LightSANsConfig, LightSANs),
    "hstu": (HSTUConfig, HSTU),
    "xlstm": (XLSTMConfig, XLSTM),
    "pcrec": (PCRecConfig, PCRec),
    "bsarec": (BSARecConfig, BSARec),
}


# Sizes every backbone that has them needs to be positive (hidden_size: the recurrent ones, None = d_model).
_SIZES = frozenset({"d_model", "n_layers", "n_heads", "max_len", "hidden_size"})


def backbone_config(name: str, n_items: int, params: Mapping[str, Any]) -> Any:
    """The backbone's typed config from a plain mapping; unknown or missing keys are a ValueError."""
    if name not in BACKBONES:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(sorted(BACKBONES))}")
    config_cls = BACKBONES[name][0]
    known = {f.name for f in dataclasses.fields(config_cls)} - {"n_items"}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ValueError(
            f"unknown option(s) for backbone {name!r}: {', '.join(unknown)}; known: {', '.join(sorted(known))}"
        )
    fields = {f.name: f for f in dataclasses.fields(config_cls)}
    for key in sorted(params):  # a value of another type fails later as a tensor error, or trains as a number
        _check_type(key, fields[key].type, params[key])
    config = config_cls(n_items=n_items, **params)
    for size in sorted(_SIZES & known):  # a size below 1 would fail later as a tensor error or an empty training set
        value = getattr(config, size)
        if value is not None and value < 1:
            raise ValueError(f"{size} must be >= 1, got {value}")
    return config


def _check_type(key: str, annotation: Any, value: Any) -> None:
    """A ValueError naming ``key`` and ``value`` unless the value fits a plain annotation (``int``, ``int | None``,
    ``float``, ``bool``; others, such as a Literal, are the module's to check). YAML reads ``true`` as a bool,
    which Python counts as an int: a bool is no size, nor a rate."""
    if annotation == "int | None" and value is None:
        return
    if annotation in ("int", "int | None") and (isinstance(value, bool) or not isinstance(value, int)):
        raise ValueError(f"{key} must be a whole number, got {value!r}")
    if annotation == "float":
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"{key} must be a number, got {value!r}")
        if not math.isfinite(value):
            raise ValueError(f"{key} must be finite, got {value!r}")
    if annotation == "bool" and not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, got {value!r}")


def build_encoder(name: str, config: Any) -> SequenceEncoder:
    return BACKBONES[name][1](config)
