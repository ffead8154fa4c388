"""Whole batches of an in-memory dataset, made with gathers: no Python per sample.

`over(pipeline, images)` turns a batchable pipeline into a maker of batches from any indices
and their keys. A pipeline that starts with a random crop (then a flip) becomes a
`CropFlipTable`: the padded dataset beside its mirror image, so that every row of every
crop is a run of bytes of one table and a batch is one `index_select`. Any other pipeline is
a plain gather followed by its whole-batch form (`Gathered`).

A maker comes in two halves, for a dataset on a GPU with the indices and keys on the host:
`locate` (on the host: one int64 per sample saying where its pixels are) and `build` (on the
dataset's device, from those locations sent over). `BatchMaker` does both, with the draws
hashed on the host and one copy between them.
"""

from __future__ import annotations

import torch

from repro.core.data import transforms
from repro.core.data.datasets import Source
from repro.core.data.slots import Batch
from repro.core.data.sources import TensorImages, in_memory
from repro.core.data.transforms import Compose, HorizontalFlip, RandomCrop, on_device_of
from repro.core.runtime.seeding import SampleKeys
from repro.core.runtime.transfer import host_to_device


def over(pipeline: Compose, images: torch.Tensor) -> Gathered | CropFlipTable:
    """`pipeline` (batchable) over a whole uint8 (N, C, H, W) dataset, as a callable
    (indices, keys) -> batch, with `locate` and `build` halves."""
    kinds = [type(step) for step in pipeline.steps]
    for head in ([RandomCrop, HorizontalFlip], [RandomCrop]):
        if kinds[: len(head)] == head:
            rest = Compose(pipeline.steps[len(head) :])
            return CropFlipTable(images, *pipeline.steps[: len(head)], then=rest)  # type: ignore[arg-type]
    return Gathered(images, pipeline)


class BatchMaker:
    """Samples of an in-memory source through a pipeline, a whole batch at a time, on the
    source's device (`over`). Random steps draw from `stream` keyed on the epoch and
    the indices, computed on the host for the whole batch; what the device needs (where each
    sample's pixels are, and its label) goes over in one copy."""

    def __init__(self, source: TensorImages, transform: Compose, stream: int | None = None) -> None:
        self.make, self.stream = over(transform, source.images), stream
        self.device = source.images.device
        self.labels = source.labels.cpu()  # picked on the host, sent with the locations

    @classmethod
    def of(cls, source: Source, transform: Compose, stream: int | None = None) -> BatchMaker | None:
        """A maker where batches can be made whole, else None (per-sample path)."""
        held = in_memory(source)
        if held is not None and transform.batchable:
            return cls(held, transform, stream)
        return None

    def __call__(self, indices: list[int] | torch.Tensor, epoch: int | None = None) -> Batch:
        """The batch of `indices` (host values: a list or a CPU tensor); `epoch` keys the
        random draws (None: no random step)."""
        index = torch.as_tensor(indices, dtype=torch.int64, device="cpu")
        keys = None if epoch is None else SampleKeys(self.stream, epoch, index)
        located, labels = self.make.locate(index, keys), self.labels[index]
        if labels.dtype == torch.int64 and labels.dim() == 1:  # class indices: one copy for both
            located, labels = host_to_device(torch.stack([located, labels]), self.device).unbind()
        else:  # targets of another shape or dtype (multi-hot, soft labels) go on their own
            located, labels = (
                host_to_device(located, self.device),
                host_to_device(labels, self.device),
            )
        return Batch(self.make.build(located, keys), labels)


class Gathered:
    """Pick a batch out of a dataset, then apply a pipeline's whole-batch form."""

    def __init__(self, images: torch.Tensor, pipeline: Compose) -> None:
        self.images, self.pipeline = images, pipeline

    def locate(self, indices: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """Where each sample's pixels are: its index."""
        return indices

    def build(self, located: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """The batch, from `locate`'s result on the dataset's device."""
        return self.pipeline.batch(self.images[located], keys)

    def __call__(self, indices: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        return self.build(on_device_of(self.images, indices)[0], keys)


class CropFlipTable:
    """Random crop (after padding) and horizontal flip of any samples as one gather.

    The dataset is padded once and stored next to its mirror image (2 x (1 + 2 padding /
    size)^2 x its memory); every row of every crop is then a contiguous run of `size` bytes
    of that table, at an offset set by the sample, its flip, its crop corner, its channel
    and the row. Each sample's parameters are the per-sample steps' draws from its keys, so
    the bytes are theirs.
    """

    def __init__(
        self,
        images: torch.Tensor,
        crop: RandomCrop,
        flip: HorizontalFlip | None = None,
        then: Compose | None = None,
    ) -> None:
        count, channels, height, width = images.shape
        pad, size = crop.padding, crop.size
        padded = transforms.pad(images, pad, crop.mode)
        # Mirroring commutes with each padding mode: the mirror's crop is the crop's mirror.
        table = torch.stack([padded, padded.flip(-1)]) if flip is not None else padded
        self.rows = table.view(-1).unfold(0, size, 1)  # row i: table's bytes i .. i+size-1
        self.crop, self.flip, self.shape = crop, flip, (count, channels, height, width)
        self.then = then if then is not None and then.steps else None
        # Sample i's row r of channel c starts at locate(i) + c * plane + r * padded width.
        padded_height, padded_width = height + 2 * pad, width + 2 * pad
        plane = padded_height * padded_width
        channel_rows = torch.arange(channels).view(-1, 1) * plane
        self.offsets = (channel_rows + torch.arange(size) * padded_width).to(images.device)

    def locate(self, indices: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """Where each sample's crop starts in the table: its first byte, an int64 per sample,
        computed where `indices` and the keys are."""
        assert keys is not None
        count, channels, height, width = self.shape
        pad, size = self.crop.padding, self.crop.size
        padded_height, padded_width = height + 2 * pad, width + 2 * pad
        top, left = self.crop.draw(keys, height, width)
        top, left = top + pad, left + pad
        image = indices
        if self.flip is not None:
            # The flip of a crop at `left` is the crop of the mirror at the mirrored corner.
            mirrored = self.flip.draw(keys)
            left = torch.where(mirrored, padded_width - size - left, left)
            image = image + mirrored * count
        return (image * channels * padded_height + top) * padded_width + left

    def build(self, located: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        """The batch, from `locate`'s result on the table's device: one gather of its rows."""
        channels, size = self.shape[1], self.crop.size
        starts = (located.view(-1, 1, 1) + self.offsets).view(-1)
        batch = self.rows.index_select(0, starts).view(len(located), channels, size, size)
        return batch if self.then is None else self.then.batch(batch, keys)

    def __call__(self, indices: torch.Tensor, keys: SampleKeys | None) -> torch.Tensor:
        return self.build(on_device_of(self.offsets, self.locate(indices, keys))[0], keys)
