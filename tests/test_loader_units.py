"""The loaders' parts in-process (repro.core.data.loader): the run-long iterator, the views'
samples and batches, batching samples read one by one, and what each DataLoader is given."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from repro.core.data import loader, transforms
from repro.core.data.datasets import Splits
from repro.core.data.loader import Batches, EvalView, LoaderContext, TrainView
from repro.core.data.slots import Batch, SlotRef
from repro.core.data.sources import TensorImages
from repro.core.data.workers import start_worker
from repro.core.runtime.seeding import SampleKeys, stream_seed

STREAM = stream_seed(2, "augment")


class Listed:
    """Images of any sizes, read one by one (as files are): no `tensors()`."""

    def __init__(self, images, labels) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index):
        return self.images[index], self.labels[index]


def picture(height: int, width: int, value: int = 0) -> torch.Tensor:
    base = torch.arange(3 * height * width) % 200 + value
    return base.to(torch.uint8).view(3, height, width)


def in_memory(count: int = 12) -> TensorImages:
    return TensorImages(torch.stack([picture(6, 6, i) for i in range(count)]), torch.arange(count))


# ---- one iterator per run -----------------------------------------------------------------


def test_batches_start_the_loader_once_and_hand_out_what_it_yields():
    starts = []

    class Loader:
        def __iter__(self):
            starts.append(1)
            return iter(range(5))

    batches = Batches(Loader())
    assert list(batches.take(2)) == [0, 1] and list(batches.take(2)) == [2, 3]
    assert iter(batches) is batches and starts == [1]
    with batches:
        assert next(batches) == 4
        with pytest.raises(StopIteration):
            next(batches)
    assert batches.iterator is None, "closed on leaving the block"
    assert next(batches) == 0 and starts == [1, 1]


def test_an_errors_frames_let_the_failed_iterator_go():
    import gc
    import weakref

    class Failing:
        def __iter__(self):
            return self

        def __next__(self):
            raise RuntimeError("a worker died")

    class Loader:
        def __iter__(self):
            made = Failing()
            handles.append(weakref.ref(made))
            return made

    handles: list = []
    batches = Batches(Loader())
    with pytest.raises(RuntimeError) as raised:
        next(batches)
    gc.collect()
    assert handles[0]() is None, "nothing holds the iterator: its workers can stop now"
    assert raised.value.__traceback__ is not None, "the traceback itself still prints"


def test_an_error_from_the_loader_closes_it_and_goes_on_up():
    def failing():
        yield 1
        raise RuntimeError("a worker died")

    class Loader:
        def __iter__(self):
            return failing()

    batches = Batches(Loader())
    assert next(batches) == 1
    with pytest.raises(RuntimeError, match="a worker died") as raised:
        next(batches)
    assert batches.iterator is None
    assert raised.value.__traceback__ is not None


# ---- the views ----------------------------------------------------------------------------


def test_a_training_sample_is_its_image_through_the_pipeline_with_its_own_keys():
    source = in_memory()
    pipeline = transforms.build(True, 6, None, crop_padding=2)
    view = TrainView(source, pipeline, STREAM)
    assert view.maker is not None and view.maker.stream == STREAM, "in memory: whole batches"
    image, label = view[(3, 5)]
    assert torch.equal(image, pipeline(source.images[5], SampleKeys(STREAM, 3, 5)))
    assert label == 5 and len(view) == 12
    batch = view.__getitems__([(3, 5), (3, 0), (3, 5)])
    assert isinstance(batch, Batch) and batch.labels.tolist() == [5, 0, 5]
    assert torch.equal(batch.images[0], image) and torch.equal(batch.images[2], image)
    alone = view.__getitems__([(3, 5)])  # a batch of one
    assert torch.equal(alone.images[0], image)


def test_a_training_batch_read_one_by_one_has_the_same_bytes_as_in_memory():
    source = in_memory()
    listed = Listed(list(source.images), list(source.labels))
    pipeline = transforms.build(True, 6, None, crop_padding=2, cutout=2)
    keys = [(1, index) for index in (7, 2, 9)]
    from_memory = TrainView(source, pipeline, STREAM).__getitems__(keys)
    read = TrainView(listed, pipeline, STREAM)
    assert read.maker is None
    one_by_one = read.__getitems__(keys)
    assert torch.equal(from_memory.images, one_by_one.images)
    assert torch.equal(from_memory.labels, one_by_one.labels)


def test_a_prepared_batch_leaves_the_view_prepared_and_through_a_slot_when_there_are_slots():
    source = in_memory()
    view = TrainView(source, transforms.build(True, 6, None, crop_padding=0), STREAM)
    view.prepare = lambda images, labels: (images.float() / 2, labels + 100)
    batch = view.__getitems__([(0, 1), (0, 2)])
    assert batch.images.dtype == torch.float32 and batch.labels.tolist() == [101, 102]
    listed = TrainView(Listed(list(source.images), list(source.labels)), view.transform, STREAM)
    listed.prepare = view.prepare
    assert listed.__getitems__([(0, 1), (0, 2)]).labels.tolist() == [101, 102]
    view.slots = SimpleNamespace(put=lambda made: ("in a slot", made))
    where, made = view.__getitems__([(0, 1), (0, 2)])
    assert where == "in a slot" and made.labels.tolist() == [101, 102]


def test_samples_that_stay_of_several_sizes_are_returned_as_samples():
    listed = Listed([picture(4, 6), picture(6, 4)], [0, 1])
    view = TrainView(listed, transforms.Compose([transforms.HorizontalFlip()]), STREAM)
    samples = view.__getitems__([(0, 0), (0, 1)])
    assert isinstance(samples, list) and [label for _, label in samples] == [0, 1]
    assert [image.shape for image, _ in samples] == [(3, 4, 6), (3, 6, 4)]


def test_an_evaluation_batch_is_its_images_through_the_eval_pipeline_in_either_path():
    source = in_memory()
    pipeline = transforms.Compose([transforms.CenterCrop(4)])
    view = EvalView(source, pipeline)
    assert view.maker is not None
    image, label = view[3]
    assert torch.equal(image, source.images[3][:, 1:5, 1:5]) and label == 3 and len(view) == 12
    batch = view.__getitems__(range(2, 5))
    assert torch.equal(batch.images, source.images[2:5, :, 1:5, 1:5])
    assert batch.labels.tolist() == [2, 3, 4]
    listed = EvalView(Listed(list(source.images), list(source.labels)), pipeline)
    assert listed.maker is None
    assert torch.equal(listed.__getitems__(range(2, 5)).images, batch.images)


def test_samples_of_other_shapes_are_cropped_one_by_one_then_stacked():
    pipeline = transforms.build(True, 4, None, crop_padding=0)  # crop then flip: all 4 x 4
    listed = Listed([picture(6, 5, 1), picture(5, 7, 2), picture(4, 4, 3)], [2, 0, 1])
    batch = loader.sample_then_batch(listed, pipeline, [0, 1, 2], STREAM, 4)
    for position, index in enumerate([0, 1, 2]):
        expected = pipeline(listed.images[index], SampleKeys(STREAM, 4, index))
        assert torch.equal(batch.images[position], expected)
    assert batch.labels.tolist() == [2, 0, 1]


def test_per_sample_steps_run_on_each_image_and_the_tail_on_the_batch():
    calls = []

    class PerSample:
        def __call__(self, image, keys):
            calls.append(("sample", keys))
            return image[:, :4, :4]

    class Tail:
        def __call__(self, image, keys):
            raise AssertionError("the tail runs on the batch")

        def batch(self, images, keys):
            calls.append(("batch", keys.index.tolist(), keys.epoch))
            return images + 1

    listed = Listed([picture(5, 5), picture(6, 4)], [1, 0])
    pipeline = transforms.Compose([PerSample(), Tail()])
    batch = loader.sample_then_batch(listed, pipeline, [1, 0], STREAM, 7)
    assert [call[0] for call in calls] == ["sample", "sample", "batch"]
    assert calls[0][1] == SampleKeys(STREAM, 7, 1) and calls[2][1:] == ([1, 0], 7)
    assert torch.equal(batch.images[0], picture(6, 4)[:, :4, :4] + 1)
    plain = loader.sample_then_batch(listed, transforms.Compose([PerSample()]), [0])
    assert calls[-1] == ("sample", None) and plain.labels.tolist() == [1]


def test_a_batch_built_whole_passes_collate_and_samples_are_stacked():
    batch = Batch(torch.zeros(2, 1), torch.zeros(2))
    assert loader.collate(batch) is batch
    reference = SlotRef("token", 3)
    assert loader.collate(reference) is reference
    images, labels = loader.collate([(torch.ones(2), 1), (torch.zeros(2), 0)])
    assert images.tolist() == [[1.0, 1.0], [0.0, 0.0]] and labels.tolist() == [1, 0]


# ---- the DataLoaders ----------------------------------------------------------------------


def loader_cfg(workers: int, prefetch: int = 3):
    return SimpleNamespace(num_workers=workers, prefetch_factor=prefetch)


def test_a_loaders_options_in_this_process_and_with_workers():
    context = LoaderContext(root_seed=5, pin_memory=True)
    options = loader._loader_options(loader_cfg(0), context)
    assert set(options) == {
        "num_workers",
        "pin_memory",
        "worker_init_fn",
        "collate_fn",
        "generator",
    }
    assert options["num_workers"] == 0 and options["pin_memory"] is True
    assert options["worker_init_fn"] is start_worker and options["collate_fn"] is loader.collate
    assert options["generator"].initial_seed() == stream_seed(5, "loader")
    workers = loader._loader_options(loader_cfg(1, prefetch=5), LoaderContext(root_seed=5))
    assert workers["num_workers"] == 1 and workers["prefetch_factor"] == 5
    assert workers["pin_memory"] is False
    start = torch.multiprocessing.get_all_start_methods()[0]
    assert workers["multiprocessing_context"] == start


class Ordered(TensorImages):
    def epoch_order(self, epoch, seed):
        return torch.arange(len(self))


def splits_of(train) -> Splits:
    return Splits(train, in_memory(4), in_memory(4), ["a"])


def test_the_train_loader_samples_this_ranks_batches_in_the_sources_own_order():
    source = Ordered(in_memory().images, in_memory().labels)
    context = LoaderContext(root_seed=9, rank=1, world=2)
    pipeline = transforms.build(True, 6, None, crop_padding=1)
    built, sampler = loader.train_loader(splits_of(source), pipeline, 4, loader_cfg(0), context)
    assert built.batch_sampler is sampler and sampler.batch_size == 4
    assert (sampler.size, sampler.root_seed, sampler.rank, sampler.world) == (12, 9, 1, 2)
    assert sampler.epoch_order == source.epoch_order
    assert built.dataset.stream == stream_seed(9, "augment")
    assert built.dataset.prepare is None and built.dataset.slots is None
    in_process, _ = loader.train_loader(
        splits_of(source), pipeline, 4, loader_cfg(0), context, prepare_in_workers=print
    )
    assert in_process.dataset.prepare is None, "without workers the training thread prepares"
    _, sampler = loader.train_loader(splits_of(in_memory()), pipeline, 4, loader_cfg(0), context)
    assert sampler.epoch_order is None


def test_workers_get_the_preparation_and_slots_for_whole_batches():
    def prepare(images, labels):
        return images.float(), labels

    pipeline = transforms.build(True, 6, None, crop_padding=1)
    workers = loader_cfg(1, prefetch=3)
    splits = splits_of(in_memory())
    built, _ = loader.train_loader(
        splits, pipeline, 4, workers, LoaderContext(0), prepare_in_workers=prepare
    )
    view = built.dataset
    assert view.prepare is prepare
    assert view.slots.per_worker == 5 and view.slots.images.shape == (5, 4, 3, 6, 6)
    assert view.slots.images.dtype == torch.float32
    listed = Listed([picture(6, 6)] * 4, [0, 1, 0, 1])
    flip = transforms.Compose([transforms.HorizontalFlip()])
    read, _ = loader.train_loader(splits_of(listed), flip, 4, workers, LoaderContext(0))
    assert read.dataset.slots is not None, "files stacked whole go through slots too"
    assert read.dataset.prepare is None


def test_the_eval_loader_reads_this_ranks_share_in_stored_order():
    context = LoaderContext(root_seed=0, rank=1, world=3)
    built = loader.eval_loader(in_memory(10), transforms.Compose([]), 2, loader_cfg(0), context)
    assert list(built.batch_sampler.indices) == [1, 4, 7]
    assert built.batch_sampler.batch_size == 2
    assert isinstance(built.dataset, EvalView)


def test_a_training_split_of_one_image_gets_its_loader():
    one = TensorImages(picture(6, 6)[None], torch.tensor([0]))
    pipeline = transforms.build(True, 6, None, crop_padding=1)
    built, sampler = loader.train_loader(
        splits_of(one), pipeline, 1, loader_cfg(1), LoaderContext(0)
    )
    assert built.dataset.slots.images.shape == (5, 1, 3, 6, 6) and sampler.size == 1
