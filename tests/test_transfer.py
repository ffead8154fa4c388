"""Moving batches to the device (repro.runtime.transfer), in this process: the values a batch
is normalised to, the memory format it is written in, the CPU's serial chunks, and when a
batch goes through pinned memory or a side-stream prefetcher."""

from __future__ import annotations

import pytest
import torch

from repro.runtime import transfer
from repro.runtime.transfer import DeviceBatches, Prefetcher, host_to_device, prefetched

MEAN, STD = [0.5, 0.25, 0.0], [0.5, 0.25, 2.0]
CPU = torch.device("cpu")


def _expected(images: torch.Tensor) -> torch.Tensor:
    mean, std = torch.tensor(MEAN).view(1, 3, 1, 1), torch.tensor(STD).view(1, 3, 1, 1)
    return (images.float() / 255 - mean) / std


def _images(count: int, side: int) -> torch.Tensor:
    return torch.randint(
        0, 256, (count, 3, side, side), generator=torch.Generator().manual_seed(0)
    ).to(torch.uint8)


def test_a_batch_is_normalised_on_the_device_in_the_models_memory_format():
    prepare = DeviceBatches(CPU, MEAN, STD, torch.channels_last)
    assert prepare.scale.shape == prepare.shift.shape == (1, 3, 1, 1) and not prepare.non_blocking
    images, labels = _images(2, 4), torch.tensor([1, 0])
    out, moved = prepare(images, labels)
    assert out.dtype == torch.float32 and out.is_contiguous(memory_format=torch.channels_last)
    assert torch.allclose(out, _expected(images), atol=1e-6) and torch.equal(moved, labels)


def test_a_batch_prepared_ahead_passes_through_untouched():
    prepare = DeviceBatches(CPU, MEAN, STD)
    images, labels = torch.rand(2, 3, 4, 4), torch.tensor([0, 1])
    out, same = prepare(images, labels)
    assert out is images and same is labels


@pytest.mark.parametrize(
    "count, side, chunks",
    [(20, 32, 2), (10, 32, 0), (1, 128, 0)],  # 3072 a image: 10 a chunk; one op; too big
)
def test_on_a_cpu_a_large_batch_of_small_images_is_normalised_in_serial_chunks(
    count, side, chunks, monkeypatch
):
    multiplied = []
    real = torch.mul

    def counted(*args, **kwargs):
        multiplied.append(args[0].shape[0])
        return real(*args, **kwargs)

    images = _images(count, side)
    plain = DeviceBatches(CPU, MEAN, STD)(images, torch.zeros(count))[0]
    monkeypatch.setattr(transfer.torch, "mul", counted)
    out = DeviceBatches(CPU, MEAN, STD)(images, torch.zeros(count))[0]
    assert torch.equal(out, plain)  # the same values, chunked or not
    assert multiplied == ([10] * chunks if chunks else [count])


class Host:
    """A host tensor as host_to_device sees one: pinned, then copied without waiting."""

    is_cuda = False

    def __init__(self) -> None:
        self.calls: list[tuple] = []

    def pin_memory(self) -> Host:
        self.calls.append(("pin",))
        return self

    def to(self, device, non_blocking: bool = False) -> str:
        self.calls.append(("to", device, non_blocking))
        return "copied"


def test_a_small_host_tensor_reaches_a_gpu_through_pinned_memory_without_waiting():
    host = Host()
    assert host_to_device(host, torch.device("cuda")) == "copied"
    assert host.calls == [("pin",), ("to", torch.device("cuda"), True)]
    values = torch.arange(3)
    assert torch.equal(host_to_device(values, CPU), values)
    assert host_to_device(values, torch.device("meta")).device.type == "meta"


def test_only_pinned_batches_for_a_gpu_go_through_the_prefetcher(monkeypatch):
    loader = torch.utils.data.DataLoader(list(range(6)), batch_size=2)
    on_cpu = DeviceBatches(CPU, MEAN, STD)
    assert prefetched(loader, on_cpu, pin_memory=True) is loader
    monkeypatch.setattr(transfer.torch.cuda, "Stream", lambda device: ("stream", device))
    gpu = DeviceBatches(torch.device("meta"), MEAN, STD)
    gpu.device = torch.device("cuda", 0)  # as built for a GPU (none here to allocate on)
    assert prefetched(loader, gpu, pin_memory=False) is loader
    ahead = prefetched(loader, gpu, pin_memory=True)
    assert isinstance(ahead, Prefetcher) and ahead.stream == ("stream", gpu.device)
    assert len(ahead) == 3 and ahead.batch_size == 2 and ahead.dataset is loader.dataset
    with pytest.raises(AttributeError):
        _ = Prefetcher.__new__(Prefetcher).batch_size  # unpickled: no loader to ask yet
