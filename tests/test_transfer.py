"""Moving batches to the device (repro.core.runtime.transfer), in this process: the values a batch
is normalised to, the memory format it is written in, the CPU's serial chunks, and when a
batch goes through pinned memory or a side-stream prefetcher."""

from __future__ import annotations

import pytest
import torch

from repro.core.runtime import transfer
from repro.core.runtime.transfer import DeviceBatches, Prefetcher, host_to_device, prefetched

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
    with pytest.raises(AttributeError, match=r"^wrapped$"):
        _ = Prefetcher.__new__(Prefetcher).batch_size  # unpickled: no loader to ask yet


def test_a_batch_lands_on_the_runs_device_and_is_normalised_there():
    meta = torch.device("meta")  # a device other than the CPU, without a GPU
    prepare = DeviceBatches(meta, MEAN, STD, torch.channels_last)
    assert prepare.scale.device == meta and prepare.shift.device == meta
    out, labels = prepare(_images(2, 4), torch.tensor([1, 0]))
    assert out.device == meta and labels.device == meta and out.dtype == torch.float32
    assert out.is_contiguous(memory_format=torch.channels_last)


@pytest.mark.parametrize(
    "shape, chunks",
    [((40000, 1, 1, 1), [32767, 7233]), ((2, 1, 1, 32767), [1, 1]), ((2, 1, 1, 32768), [2])],
)
def test_the_serial_chunks_edges(shape, chunks, monkeypatch):
    multiplied = []
    real = torch.mul

    def counted(*args, **kwargs):
        multiplied.append(args[0].shape[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(transfer.torch, "mul", counted)
    DeviceBatches(CPU, [0.5], [0.5])(torch.zeros(shape, dtype=torch.uint8), torch.zeros(2))
    assert multiplied == chunks


class Stream:
    """torch.cuda's side stream, event and current stream, as calls recorded in order."""

    def __init__(self, calls: list, name: str) -> None:
        self.calls, self.name = calls, name

    def __enter__(self) -> None:
        self.calls.append("side stream")

    def __exit__(self, *exc: object) -> None:
        self.calls.append("compute stream")

    def wait_event(self, event: object) -> None:
        self.calls.append(("compute waits for", event.batch))


def test_the_next_batch_is_copied_on_the_side_stream_before_this_one_is_handed_over(monkeypatch):
    calls: list = []
    cuda = transfer.torch.cuda
    gpu = torch.device("cuda", 0)
    side = Stream(calls, "side")
    monkeypatch.setattr(cuda, "Stream", lambda device: device == gpu and side)
    monkeypatch.setattr(cuda, "stream", lambda stream: stream)
    monkeypatch.setattr(
        cuda, "current_stream", lambda device: Stream(calls, "compute" if device == gpu else "?")
    )

    class Event:
        def record(self, stream: Stream) -> None:
            self.batch = len([c for c in calls if c == "side stream"])
            calls.append(("copied", self.batch, stream.name))

    monkeypatch.setattr(cuda, "Event", Event)

    def kept(tensor: torch.Tensor, stream: Stream) -> None:
        calls.append(("kept", stream.name))

    monkeypatch.setattr(torch.Tensor, "record_stream", kept)

    class Prepare:  # DeviceBatches for a GPU: images made floats "there"
        device = gpu

        def __call__(self, images, labels):
            return images.float(), labels

    prepare = Prepare()
    ahead = Prefetcher([(_images(1, 2), torch.tensor([0])) for _ in range(3)], prepare)
    handed = []
    for images, _ in ahead:
        handed.append(images.dtype)
        calls.append("step")

    def copy(n: int) -> list:
        return ["side stream", ("copied", n, "side"), "compute stream"]

    def step(n: int) -> list:  # compute waits for this batch's copy alone, keeps its memory
        return [("compute waits for", n), ("kept", "compute"), ("kept", "compute"), "step"]

    assert calls == copy(1) + copy(2) + step(1) + copy(3) + step(2) + step(3)
    assert handed == [torch.float32] * 3


def test_a_batch_of_other_than_four_dimensions_is_written_contiguous(monkeypatch):
    prepare = DeviceBatches(CPU, [0.5], [0.5], torch.channels_last)
    images = torch.arange(16, dtype=torch.uint8).view(2, 1, 4, 2, 1)  # channels_last needs 4
    out, _ = prepare(images, torch.zeros(2))
    assert out.is_contiguous() and torch.allclose(out, (images.float() / 255 - 0.5) / 0.5)


def test_only_a_gpus_copies_are_issued_without_waiting(monkeypatch):
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *args, **kwargs: self)  # no GPU here
    assert DeviceBatches(torch.device("cuda"), MEAN, STD).non_blocking is True
    assert DeviceBatches(torch.device("meta"), MEAN, STD).non_blocking is False
