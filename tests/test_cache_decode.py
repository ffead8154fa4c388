"""`data.cache=memory` in-process (repro.core.data.cache): what a decoded split holds, what it
refuses, and how the decoding is shared out; on images made in memory, no files."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from rich.progress import Progress

from repro.core.data import cache
from repro.core.data.transforms import CenterCrop, ResizeShorter
from repro.core.data.workers import start_worker
from repro.core.errors import ConfigError


class Decoded:
    """A split whose images are made on access, counting the reads."""

    def __init__(self, shapes, keeps_labels: bool = True) -> None:
        self.shapes, self.reads = shapes, 0
        if keeps_labels:
            self.labels = [index % 3 for index in range(len(shapes))]

    def __len__(self) -> int:
        return len(self.shapes)

    def __getitem__(self, index: int):
        self.reads += 1
        generator = torch.Generator().manual_seed(index)
        image = torch.randint(0, 256, self.shapes[index], dtype=torch.uint8, generator=generator)
        return image, index % 3


def data_cfg(side=4, resize=None, budget_gib=1.0):
    return SimpleNamespace(image_size=side, resize=resize, cache_budget_gib=budget_gib)


def test_a_split_is_resized_as_the_pipeline_would_and_keeps_its_order_and_labels():
    files = Decoded([(3, 8, 8), (3, 6, 6), (3, 4, 4), (3, 10, 10)])
    held = cache.decode(files, data_cfg(side=4))
    expected = [ResizeShorter(4)(files[i][0], None) for i in range(4)]
    assert torch.equal(held.images, torch.stack(expected))
    assert held.labels.tolist() == [0, 1, 2, 0] and held.labels.dtype == torch.int64


def test_data_resize_sets_the_side_and_squares_images_of_other_shapes():
    files = Decoded([(3, 6, 9), (3, 9, 6), (3, 6, 6)])
    held = cache.decode(files, data_cfg(side=2, resize=6))
    square = CenterCrop(6)
    expected = [square(ResizeShorter(6)(files[i][0], None), None) for i in range(3)]
    assert held.images.shape == (3, 3, 6, 6)
    assert torch.equal(held.images, torch.stack(expected))


def test_kept_labels_are_taken_without_reading_the_images_again():
    files = Decoded([(3, 4, 4)] * 5)
    cache.decode(files, data_cfg())
    assert files.reads == 5 + 1, "each image once, and the first to size the split"
    unlabelled = Decoded([(3, 4, 4)] * 5, keeps_labels=False)
    held = cache.decode(unlabelled, data_cfg())
    assert held.labels.tolist() == [0, 1, 2, 0, 1]


def test_images_of_several_sizes_without_a_resize_are_refused_naming_their_sizes():
    files = Decoded([(3, 4, 6), (3, 4, 4), (3, 5, 4), (3, 6, 4), (3, 4, 6)])
    with pytest.raises(ConfigError) as refused:
        cache.decode(files, data_cfg(side=4), name="val")
    message = str(refused.value)
    assert message.startswith("data.resize=None")
    assert "to cache val images of several sizes (4x4, 4x6, 5x4 ...)" in message
    assert "6x4" not in message, "three examples"
    assert message.endswith("with data.cache=memory (or data.cache=none)")


def test_the_budget_is_checked_on_the_first_image_before_decoding_the_rest():
    files = Decoded([(3, 4, 4)] * 5)  # 5 x 48 bytes once resized to 4
    exact = 5 * 48 / cache.GIB
    assert len(cache.decode(files, data_cfg(budget_gib=exact)).images) == 5, "up to the budget"
    over = Decoded([(3, 8, 8)] * 5)  # 48 bytes each once resized, also
    with pytest.raises(ConfigError) as refused:
        cache.decode(over, data_cfg(budget_gib=exact * 0.99))
    assert over.reads == 1, "refused on the estimate, nothing decoded"
    assert str(refused.value).startswith(f"data.cache_budget_gib={exact * 0.99}")
    assert "at least 0.00 GiB to cache the 5 decoded split images (or data.cache=none)" in str(
        refused.value
    )
    with pytest.raises(ConfigError, match=r"at least 2\.50 GiB to cache the 3 decoded "):
        cache._refuse_budget(data_cfg(), 3, 2.5 * cache.GIB, "train")


def test_the_bar_counts_every_image_decoded(monkeypatch):
    bars = []

    def silent(setting):
        bars.append((setting, Progress(disable=True)))
        return bars[-1][1]

    monkeypatch.setattr(cache, "progress_bar", silent)
    monkeypatch.setattr(cache, "CHUNK", 2)
    cache.decode(Decoded([(3, 4, 4)] * 5), data_cfg(), name="train", progress="on")
    ((setting, bar),) = bars
    task = bar.tasks[0]
    assert setting == "on" and task.description == "decoding train"
    assert task.total == 5 and task.completed == 5


@pytest.mark.filterwarnings("ignore:This DataLoader will create")
@pytest.mark.parametrize(("cpus", "workers"), [(3, 3), (64, cache.MAX_WORKERS), (None, 1)])
def test_large_splits_are_decoded_by_worker_processes(monkeypatch, cpus, workers):
    monkeypatch.setattr(cache.os, "cpu_count", lambda: cpus)
    loader = cache._decoder(Decoded([(3, 1, 1)] * cache.PARALLEL_FROM))
    assert loader.num_workers == workers and loader.batch_size == cache.CHUNK
    assert loader.worker_init_fn is start_worker and loader.collate_fn is cache._stacked
    first = torch.multiprocessing.get_all_start_methods()[0]
    assert loader.multiprocessing_context.get_start_method() == first


def test_small_splits_are_decoded_in_this_process(monkeypatch):
    monkeypatch.setattr(cache.os, "cpu_count", lambda: 8)
    loader = cache._decoder(Decoded([(3, 1, 1)] * (cache.PARALLEL_FROM - 1)))
    assert loader.num_workers == 0 and loader.worker_init_fn is None
    assert loader.batch_size == cache.CHUNK and loader.collate_fn is cache._stacked


def test_a_chunk_of_one_size_is_one_tensor_and_of_several_a_list():
    same = [torch.full((1, 2, 2), value, dtype=torch.uint8) for value in range(3)]
    assert torch.equal(cache._stacked(same), torch.stack(same))
    mixed = [torch.zeros(1, 2, 2), torch.zeros(1, 2, 3), torch.zeros(1, 2, 2)]
    assert cache._stacked(mixed) is mixed
    first_odd = [torch.zeros(1, 2, 3), torch.zeros(1, 2, 2), torch.zeros(1, 2, 2)]
    assert cache._stacked(first_odd) is first_odd


def test_the_first_image_sizes_the_estimate():
    # Squared to 4 x 4 in the end; the second, 4 x 6 once resized, would overestimate.
    files = Decoded([(3, 4, 4), (3, 4, 6), (3, 4, 4)])
    held = cache.decode(files, data_cfg(side=2, resize=4, budget_gib=3 * 48 / cache.GIB))
    assert held.images.shape == (3, 3, 4, 4)


def test_a_split_of_one_image_decodes():
    held = cache.decode(Decoded([(3, 5, 4)]), data_cfg(side=4))
    assert held.images.shape == (1, 3, 5, 4) and held.labels.tolist() == [0]
