"""Measure this machine: `python -m benchmarks [suite=knobs|overhead|startup|exactness] ...`.

The training config composes as for `repro.train` (preset=fast, amp=bf16, dataloader=device
... all work); `suite.*` holds the suite's settings (conf/suite/). Prints a table and writes
bench.json and bench.md into the run folder, outputs/bench/<date>/<time>-<id>/.
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.core.runtime.launch import start

    start("benchmarks")

import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from omegaconf import DictConfig

import benchmarks
from benchmarks import common
from repro.core import config, schema
from repro.core.errors import UserError, exit_with
from repro.core.runtime import determinism, launch, seeding
from repro.core.runtime.devices import select_device

config.register()


def bench(cfg: DictConfig, run_dir: Path) -> dict:
    """Run the suite `cfg.suite.name` into `run_dir`; returns what bench.json holds."""
    config.validate(cfg, schema=schema.BenchConfig)
    benchmarks.validate(cfg.suite)
    suite = benchmarks.load(cfg.suite.name)
    cfg.seed.value = seeding.resolve_seed(cfg.seed.mode, cfg.seed.value)
    device = select_device(cfg.trainer.device)
    # Before a suite asks the GPU anything: cuBLAS reads its workspace setting when CUDA starts.
    determinism.apply(cfg.cudnn, device)
    result = suite.run(cfg, run_dir)
    payload = common.write(result, run_dir, cfg, device)
    common.show(result, run_dir)
    return payload


@hydra.main(config_path="../conf", config_name="bench", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        payload = bench(cfg, Path(HydraConfig.get().runtime.output_dir))
    except UserError as error:
        exit_with(error)
    if payload["summary"].get("all_passed") is False:  # a suite of checks: one failed
        raise SystemExit(1)


if __name__ == "__main__":
    sys.argv = launch.expand_seed_shorthand(sys.argv)
    main()
