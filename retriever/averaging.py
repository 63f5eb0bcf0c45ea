"""An exponential moving average of the retriever's weights (``train.ema_epochs``), kept beside the trained model.

Validation, early stopping, ``best.pt`` and so the exported model read the average, not the last step's
weights. The horizon is given in epochs, not as a per-step decay, so one setting means the same on a dataset of
ten steps an epoch and on one of ten thousand. torch's ``AveragedModel`` does the averaging (parameters only:
the encoders' buffers are constants).
"""

from __future__ import annotations

from torch import nn
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn

from retriever.config import RunConfig


def ema_decay(ema_epochs: float, steps_per_epoch: int) -> float:
    """The per-step decay whose averaging horizon (1 / (1 - decay) steps) is ``ema_epochs`` epochs."""
    return 1.0 - 1.0 / max(1.0, ema_epochs * steps_per_epoch)


def averaged_copy(model: nn.Module, config: RunConfig, steps_per_epoch: int) -> AveragedModel | None:
    """The moving average of ``model`` (a copy, on its device; the first update copies the weights), or None when
    the config keeps none."""
    horizon = config.train.ema_epochs
    if horizon is None:
        return None
    return AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(ema_decay(horizon, steps_per_epoch)))
