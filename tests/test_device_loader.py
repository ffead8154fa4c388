"""The batched data path: whole-batch views, shared slots, dataloader=device, prefetching.

Each must give the bytes of the per-sample DataLoader path for the same seed and epoch, so
none of them changes a result.
"""

from __future__ import annotations

import pickle

import pytest
import torch
from torch.utils.data import default_collate

from repro.core import build
from repro.core.data.batching import BatchMaker
from repro.core.data.device_loader import DeviceEvalLoader, DeviceTrainLoader
from repro.core.data.loader import Batches, EvalView, LoaderContext, TrainView
from repro.core.data.samplers import EpochBatches
from repro.core.data.slots import Batch
from repro.core.data.sources import ImageFiles, TensorImages
from repro.core.data.transforms import build as pipeline
from repro.core.errors import ConfigError
from repro.core.runtime.seeding import stream_seed
from repro.core.runtime.transfer import DeviceBatches
from repro.core.watch.operators import DeviceOps

from conftest import compose_config, tiny, train_in_process

SMALL = ("data.train_size=300", "data.val_size=70", "trainer.batch_size=64")


def epoch_batches(loader, sampler, epoch, start=0):
    sampler.set_epoch(epoch, start_batch=start)
    return [(images.clone(), labels.clone()) for images, labels in loader]


def one_pass(loader):
    """An evaluation loader's first pass (it goes round for as long as it is read)."""
    with Batches(loader) as batches:
        return [(images.clone(), labels.clone()) for images, labels in batches.take(len(loader))]


def assert_same(left, right, prepare=None):
    """Same batches; with `prepare`, compared as the model's input (CPU workers normalise)."""
    assert len(left) == len(right) > 0
    for (a_images, a_labels), (b_images, b_labels) in zip(left, right, strict=True):
        if prepare is None:
            assert a_images.dtype == b_images.dtype == torch.uint8
        else:
            a_images, b_images = prepare(a_images, a_labels)[0], prepare(b_images, b_labels)[0]
        assert torch.equal(a_images, b_images) and torch.equal(a_labels, b_labels)


def model_input(cfg):
    return build.device_batches(cfg, torch.device("cpu"))


@pytest.mark.parametrize("padding", [0, 2, 5])
def test_batched_views_give_the_per_sample_bytes(padding):
    cfg = compose_config(*SMALL, f"data.crop_padding={padding}")
    data = build.splits(cfg, 7)
    train_transform, eval_transform = build.pipelines(cfg)
    view = TrainView(data.train, train_transform, stream_seed(7, "augment"))
    keys = [(3, index) for index in range(0, 300, 3)]
    batched = view.__getitems__(keys)
    assert isinstance(batched, Batch)
    expected = default_collate([view[key] for key in keys])
    assert_same([tuple(batched)], [tuple(expected)])
    evaluated = EvalView(data.val, eval_transform)
    indices = list(range(len(data.val)))
    assert_same([tuple(evaluated.__getitems__(indices))],
                [tuple(default_collate([evaluated[i] for i in indices]))])  # fmt: skip


def test_a_batch_from_a_worker_arrives_unchanged():
    batch = Batch(torch.arange(24, dtype=torch.uint8).view(2, 3, 2, 2), torch.tensor([4, 1]))
    again = pickle.loads(pickle.dumps(batch))
    assert isinstance(again, Batch)
    assert torch.equal(again.images, batch.images) and torch.equal(again.labels, batch.labels)


def test_device_loader_yields_the_dataloader_batches_for_each_seed_and_epoch():
    for seed in (0, 5):
        reference = compose_config(*SMALL, "dataloader.num_workers=1", f"seed={seed}")
        device = compose_config(*SMALL, "dataloader=device", f"seed={seed}")
        data = build.splits(reference, seed)
        loader, sampler, val = build.loaders(reference, data, LoaderContext(seed))
        on_device, device_sampler, device_val = build.loaders(device, data, LoaderContext(seed))
        assert isinstance(on_device, DeviceTrainLoader)
        assert device_sampler.batches_per_epoch() == sampler.batches_per_epoch() == 4
        for epoch in (0, 3):
            from_workers = epoch_batches(loader, sampler, epoch)
            assert from_workers[0][0].dtype == torch.float32  # normalised in the worker
            assert_same(epoch_batches(on_device, device_sampler, epoch), from_workers,
                        model_input(reference))  # fmt: skip
        assert_same(one_pass(device_val), one_pass(val))


def test_device_loader_resumes_at_a_batch_position():
    cfg = compose_config(*SMALL, "dataloader=device")
    data = build.splits(cfg, 1)
    loader, sampler, _ = build.loaders(cfg, data, LoaderContext(1))
    whole = epoch_batches(loader, sampler, 2)
    loader.set_epoch(2, start_batch=3)
    assert len(loader) == 1
    assert_same([(images.clone(), labels) for images, labels in loader], whole[3:])
    assert isinstance(sampler, EpochBatches)


def test_device_loader_gives_the_dataloader_weights_and_resumes_exactly(tmp_path):
    run = tiny("trainer.epochs=2")
    reference = train_in_process(tmp_path / "dataloader", *run)
    straight = train_in_process(tmp_path / "device", *run, "dataloader=device")
    assert straight["weights_sha256"] == reference["weights_sha256"]
    halted = train_in_process(tmp_path / "resumed", *run, "dataloader=device",
                              "trainer.halt_at_step=7")  # fmt: skip
    assert halted["step"] == 7 and not halted["completed"]
    resumed = train_in_process(tmp_path / "resumed", *run, "dataloader=device")
    assert resumed["resumed_from_step"] == 7
    assert resumed["weights_sha256"] == reference["weights_sha256"]


def test_device_loader_needs_data_in_memory(tmp_path):
    cfg = compose_config(*SMALL)
    files = ImageFiles([tmp_path / "a.png"], [0])
    train_transform, _ = build.pipelines(cfg)
    with pytest.raises(ConfigError, match="dataloader='device'"):
        DeviceTrainLoader(files, train_transform, EpochBatches(1, 1, 0), 0, torch.device("cpu"))


def test_device_loader_refusals_name_what_it_needs(tmp_path):
    cfg = compose_config(*SMALL)
    train_transform, _ = build.pipelines(cfg)
    files = ImageFiles([tmp_path / "a.png"], [0])
    with pytest.raises(ConfigError) as refused:
        DeviceEvalLoader(files, train_transform, 4, LoaderContext(0))
    assert str(refused.value) == (
        "dataloader='device' is not allowed: needs an in-memory dataset (synthetic, cifar10, or "
        "image files with data.cache=memory); use dataloader=default or fast for image files"
    )
    resized, _ = build.pipelines(compose_config(*SMALL, "data.resize=40"))
    held = TensorImages(torch.zeros(4, 3, 32, 32, dtype=torch.uint8), torch.arange(4))
    with pytest.raises(ConfigError) as refused:
        DeviceTrainLoader(held, resized, EpochBatches(4, 2, 0), 0, torch.device("cpu"))
    assert str(refused.value) == (
        "dataloader='device' is not allowed: crop, flip and Cutout only (no data.resize, no "
        "augment.transforms)"
    )
    device = compose_config(*SMALL, "dataloader=device", "trainer.batch_size=301")
    data = build.splits(device, 0)
    with pytest.raises(ConfigError) as refused:
        build.loaders(device, data, LoaderContext(0))
    assert str(refused.value) == (
        "trainer.batch_size=301 is not allowed: at most the 300 training images (over all ranks)"
    )


def test_each_rank_evaluates_every_worldth_image_in_stored_order_pass_after_pass():
    cfg = compose_config(*SMALL)
    _, eval_transform = build.pipelines(cfg)
    images = torch.arange(10, dtype=torch.uint8).view(10, 1, 1, 1).expand(10, 3, 32, 32)
    held = TensorImages(images.contiguous(), torch.arange(10) * 10)
    loader = DeviceEvalLoader(held, eval_transform, 2, LoaderContext(0, rank=1, world=3))
    assert len(loader) == 2  # images 1, 4 and 7: one batch of two, one of one
    batches = iter(loader)
    labels = [next(batches)[1].tolist() for _ in range(4)]
    assert labels == [[10, 40], [70], [10, 40], [70]]
    assert len(DeviceEvalLoader(held, eval_transform, 5, LoaderContext(0))) == 2
    assert len(DeviceEvalLoader(held, eval_transform, 4, LoaderContext(0))) == 3


def test_the_device_loaders_are_built_from_the_runs_seed_rank_and_batch_sizes():
    cfg = compose_config(*SMALL, "dataloader=device", "trainer.eval_batch_size=32")
    data = build.splits(cfg, 4)
    train, sampler, val = build.loaders(cfg, data, LoaderContext(4, rank=1, world=2))
    assert train.sampler is sampler and len(train) == sampler.batches_per_epoch() == 2  # 150 each
    assert (sampler.root_seed, sampler.rank, sampler.world, sampler.batch_size) == (4, 1, 2, 64)
    assert val.batch_size == 32 and val.indices.tolist() == list(range(1, 70, 2))
    assert train.maker.stream == stream_seed(4, "augment")


def test_workers_hand_over_batches_through_shared_slots_unchanged():
    """Slots are reused across epochs, abandoned iterators and resumed positions."""
    workers = compose_config(*SMALL, "dataloader.num_workers=2", "dataloader.prefetch_factor=1",
                             "data.train_size=700")  # fmt: skip
    plain = compose_config(*SMALL, "dataloader=debug", "data.train_size=700")
    data = build.splits(plain, 2)
    loader, sampler, _ = build.loaders(workers, data, LoaderContext(2))
    reference, reference_sampler, _ = build.loaders(plain, data, LoaderContext(2))
    assert loader.dataset.slots is not None
    sampler.set_epoch(0)
    with Batches(loader) as abandoned:  # its batches in flight are dropped
        next(abandoned)
    for epoch, start in ((1, 0), (2, 4), (3, 0)):
        assert_same(epoch_batches(loader, sampler, epoch, start),
                    epoch_batches(reference, reference_sampler, epoch, start),
                    model_input(plain))  # fmt: skip


def test_prepared_batches_pass_through_device_batches():
    prepare = DeviceBatches(torch.device("cpu"), [0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
    images = torch.randint(0, 256, (8, 3, 4, 4), dtype=torch.uint8)
    normalised, labels = prepare(images, torch.arange(8))
    assert normalised.dtype == torch.float32
    again, _ = prepare(normalised, labels)
    assert again is normalised


@pytest.mark.parametrize("shape", [(8, 3, 4, 4), (64, 3, 32, 32), (3, 3, 120, 120)])
def test_cpu_normalisation_gives_one_ops_values_in_any_chunking(shape):
    """One op for a small batch, chunks run in this thread for a larger one, one parallel
    op for large images: every way, the values of a single whole-batch multiply-add."""
    prepare = DeviceBatches(torch.device("cpu"), [0.5, 0.4, 0.3], [0.2, 0.25, 0.3])
    images = torch.randint(0, 256, shape, dtype=torch.uint8)
    normalised, _ = prepare(images, torch.arange(shape[0]))
    assert torch.equal(normalised, torch.mul(images, prepare.scale).add_(prepare.shift))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_prefetcher_gives_the_same_batches_on_the_gpu():
    from repro.core.runtime.transfer import Prefetcher

    device = torch.device("cuda")
    prepare = DeviceBatches(device, [0.5] * 3, [0.25] * 3)
    batches = [(torch.randint(0, 256, (4, 3, 8, 8), dtype=torch.uint8).pin_memory(),
                torch.arange(4).pin_memory()) for _ in range(3)]  # fmt: skip
    prefetched = Prefetcher(batches, prepare)
    for (images, labels), (raw, raw_labels) in zip(prefetched, batches, strict=True):
        assert torch.equal(images, prepare(raw, raw_labels)[0])
        assert torch.equal(labels.cpu(), raw_labels)


@pytest.mark.parametrize(
    ("flip", "cutout", "most"), [("random", 0, 3), ("alternate", 0, 3), ("random", 4, 8)]
)
def test_a_device_batch_costs_the_device_a_few_operations(flip, cutout, most):
    """On a GPU every operation is a kernel launch, and launches, not arithmetic, bound a
    small batch's making. With the dataset on the meta device (it stands in for a GPU and
    runs nothing), a crop-and-flip batch costs it one copy (locations and labels), an add and
    a gather: the draws are hashed on the host. Cutout adds its corners' copy, two table
    lookups, an `and` and the fill."""
    images = torch.zeros((100, 3, 8, 8), dtype=torch.uint8, device="meta")
    source = TensorImages(images, torch.arange(100) % 10)
    maker = BatchMaker(source, pipeline(True, 8, None, 2, flip=flip, cutout=cutout), stream=7)
    maker(list(range(50)), epoch=1)  # the first batch also sends Cutout's lookup tables
    with DeviceOps() as ops:
        batch = maker(list(range(0, 100, 3)), epoch=2)
    assert batch.images.shape == (34, 3, 8, 8) and batch.images.device.type == "meta"
    assert ops.count <= most


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("flip", ["random", "alternate"])
def test_a_batch_made_on_the_gpu_is_the_hosts_to_the_byte(flip):
    """The device loader's own path: host keys and locations, the pinned copy, the gather and
    Cutout's lookup on the GPU give the bytes and labels the CPU maker gives."""
    images = torch.randint(0, 256, (200, 3, 12, 12), dtype=torch.uint8)
    labels = torch.arange(200) % 10
    steps = pipeline(True, 12, None, 3, flip=flip, cutout=5)
    on_cpu = BatchMaker(TensorImages(images, labels), steps, stream=11)
    on_gpu = BatchMaker(TensorImages(images.cuda(), labels), steps, stream=11)
    for epoch, indices in ((0, list(range(0, 200, 3))), (1, [5, 199, 0, 5])):
        expected, made = on_cpu(indices, epoch), on_gpu(indices, epoch)
        assert made.images.is_cuda and made.labels.is_cuda
        assert torch.equal(made.images.cpu(), expected.images)
        assert torch.equal(made.labels.cpu(), expected.labels)
