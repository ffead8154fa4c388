"""The `memory_format` knob: channels_last for the model and every 4-D input batch."""

from __future__ import annotations

import logging

import torch
from torch import nn

log = logging.getLogger(__name__)

FORMATS = {"contiguous": torch.contiguous_format, "channels_last": torch.channels_last}


class MemoryFormat:
    """Converts the model once and each batch on the way in."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.format = FORMATS[name]
        self._noted_rank: set[int] = set()

    def model(self, model: nn.Module) -> nn.Module:
        return model.to(memory_format=self.format)

    def batch(self, x: torch.Tensor) -> torch.Tensor:
        if self.format is torch.contiguous_format:
            return x
        if x.dim() != 4:
            if x.dim() not in self._noted_rank:
                self._noted_rank.add(x.dim())
                log.info("channels_last applies to 4-D batches; leaving %d-D input as is", x.dim())
            return x
        return x.contiguous(memory_format=self.format)
