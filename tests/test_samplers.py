"""Which images each batch holds (repro.core.data.samplers), checked against the rules the
docstrings state, written out again here: the epoch's order from (seed, epoch) alone, each
rank's slice of a global batch, a start from any batch, evaluation in stored order."""

from __future__ import annotations

import itertools

import torch

from repro.core.data.samplers import EpochBatches, EvalBatches
from repro.core.runtime.seeding import torch_generator


def _shuffled(size: int, seed: int, epoch: int) -> list[int]:
    return torch.randperm(size, generator=torch_generator(seed, "order", epoch)).tolist()


def test_each_epoch_is_its_own_shuffle_cut_into_whole_batches():
    sampler = EpochBatches(size=11, batch_size=3, root_seed=5)
    assert sampler.batches_per_epoch() == 3 and len(sampler) == 3
    order = _shuffled(11, 5, 0)
    assert list(sampler) == [[(0, i) for i in order[b * 3 : b * 3 + 3]] for b in range(3)]
    assert sampler.order(1).tolist() == _shuffled(11, 5, 1) != order


def test_ranks_take_disjoint_slices_of_each_global_batch():
    per_rank = [list(EpochBatches(14, 2, 9, rank=r, world=3)) for r in range(3)]
    order = _shuffled(14, 9, 0)
    assert [len(batches) for batches in per_rank] == [2, 2, 2]  # 14 // 6; the last 2 dropped
    for step in range(2):
        for rank in range(3):
            first = step * 6 + rank * 2
            assert per_rank[rank][step] == [(0, i) for i in order[first : first + 2]]


def test_a_start_from_any_batch_continues_through_the_later_epochs():
    sampler = EpochBatches(size=8, batch_size=2, root_seed=1)
    sampler.set_epoch(3, start_batch=3, epochs=2)
    third, fourth = _shuffled(8, 1, 3), _shuffled(8, 1, 4)
    expected = [[(3, i) for i in third[6:8]]]
    expected += [[(4, i) for i in fourth[b * 2 : b * 2 + 2]] for b in range(4)]
    assert list(sampler) == expected and len(sampler) == 5
    indexed = [(epoch, indices.tolist()) for epoch, indices in sampler.index_batches()]
    assert indexed == [(batch[0][0], [i for _, i in batch]) for batch in expected]


def test_a_source_that_orders_its_own_epochs_is_read_in_its_order():
    asked = []

    def reversed_order(seed: int, epoch: int) -> torch.Tensor:
        asked.append((seed, epoch))
        return torch.arange(6).flip(0) + 0 * epoch

    sampler = EpochBatches(6, 3, root_seed=4, epoch_order=reversed_order)
    assert list(sampler) == [[(0, 5), (0, 4), (0, 3)], [(0, 2), (0, 1), (0, 0)]]
    assert asked == [(4, 0)]


def test_evaluation_reads_stored_order_each_rank_every_worldth_image_and_goes_round():
    sampler = EvalBatches(size=7, batch_size=2, rank=1, world=2)
    assert len(sampler) == 2  # images 1, 3, 5 in batches of two
    assert list(itertools.islice(sampler, 5)) == [[1, 3], [5], [1, 3], [5], [1, 3]]
    alone = EvalBatches(size=5, batch_size=5)
    assert len(alone) == 1 and next(iter(alone)) == [0, 1, 2, 3, 4]
    counted = sorted(
        i for r in range(3) for b in itertools.islice(EvalBatches(8, 3, r, 3), 1) for i in b
    )
    assert counted == list(range(8))  # each image once over the ranks
