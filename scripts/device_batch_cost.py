"""What `dataloader=device` costs per training batch, without a GPU: the dataset lives on
PyTorch's meta device, which stands in for one (it runs no kernels), so the script counts
the operators each batch makes there (on a GPU, kernel launches) and times the host's share
of making it, over one epoch of CIFAR-10's size, for the built-in recipes' pipelines.

    uv run python scripts/device_batch_cost.py [--batch 1024] [--passes 3]
"""

from __future__ import annotations

import argparse
import time

import torch

from repro.core.data.batching import BatchMaker
from repro.core.data.samplers import EpochBatches
from repro.core.data.sources import TensorImages
from repro.core.data.transforms import build
from repro.core.watch.operators import DeviceOps

IMAGES = 50_000
PIPELINES = {
    "airbench (pad 2 reflected, alternate flips)": dict(
        crop_padding=2, flip="alternate", padding_mode="reflect"
    ),
    "speedrun (pad 4 reflected, flips, Cutout 8)": dict(
        crop_padding=4, cutout=8, padding_mode="reflect"
    ),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--passes", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)  # the loader's own thread, as in training
    images = torch.zeros((IMAGES, 3, 32, 32), dtype=torch.uint8, device="meta")
    source = TensorImages(images, torch.arange(IMAGES) % 10)
    sampler = EpochBatches(IMAGES, args.batch, root_seed=0)
    for name, options in PIPELINES.items():
        maker = BatchMaker(source, build(True, 32, None, **options), stream=7)
        maker(torch.arange(args.batch), 0)  # the first batch also sends Cutout's tables
        with DeviceOps() as ops:
            maker(torch.arange(args.batch), 1)
        times = []
        for _ in range(args.passes):
            started, count = time.perf_counter(), 0
            for epoch, indices in sampler.index_batches():
                maker(indices, epoch)
                count += 1
            times.append((time.perf_counter() - started) / count * 1e6)
        shown = ", ".join(f"{t:.0f}" for t in times)
        print(f"{name}: {ops.count} device ops per batch; host µs per batch: {shown}")


if __name__ == "__main__":
    main()
