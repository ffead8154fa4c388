"""Each knob is really applied: one test per config group, each failing if the knob were ignored."""

from __future__ import annotations

import itertools
import logging
import multiprocessing
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from repro.core import config
from repro.core.data.loader import LoaderContext
from repro.core.data.samplers import EpochBatches, EvalBatches
from repro.core.data.workers import start_worker
from repro.core.engine.loop import Trainer
from repro.core.errors import ConfigError
from repro.core.runtime import determinism, seeding
from repro.core.runtime.devices import use_pinned_memory
from repro.core.runtime.launch import expand_seed_shorthand
from repro.core.runtime.memory_format import MemoryFormat
from repro.core.runtime.precision import Precision
from repro.core.runtime.transfer import DeviceBatches
from repro.extras.models.small_cnn import SmallCNN

from conftest import compose_config, read_summary, tiny, train_in_process

CPU = torch.device("cpu")


@pytest.fixture
def recorded_forward(monkeypatch):
    """Record what the model sees in its forward pass during training."""
    seen: list[dict] = []
    original = SmallCNN.forward

    def forward(self, x):
        if x.device.type == "meta":  # the shape probe before the first step, not a batch
            return original(self, x)
        conv = self[0]
        seen.append(
            {
                "input_channels_last": x.is_contiguous(memory_format=torch.channels_last),
                "weight_channels_last": conv.weight.is_contiguous(
                    memory_format=torch.channels_last
                ),
                "autocast": torch.is_autocast_enabled("cpu"),
                "autocast_dtype": torch.get_autocast_dtype("cpu"),
                "training": self.training,
                "grad_enabled": torch.is_grad_enabled(),
            }
        )
        return original(self, x)

    monkeypatch.setattr(SmallCNN, "forward", forward)
    return seen


# ---- seed ---------------------------------------------------------------------------------


def test_seed_shorthand_sets_the_value_and_keeps_group_choices():
    assert expand_seed_shorthand(["seed=3", "amp=bf16"]) == ["seed.value=3", "amp=bf16"]
    assert expand_seed_shorthand(["seed=0,1,2"]) == ["seed.value=0,1,2"]
    assert expand_seed_shorthand(["seed=random"]) == ["seed=random"]
    assert expand_seed_shorthand(["seed=fixed", "seed.value=4"]) == ["seed=fixed", "seed.value=4"]


def test_seed_globals_seeds_python_numpy_and_torch_from_the_root():
    draws = []
    for _ in range(2):
        seeding.seed_globals(7)
        draws.append((random.random(), np.random.rand(), torch.rand(1).item()))
    seeding.seed_globals(8)
    other = (random.random(), np.random.rand(), torch.rand(1).item())
    assert draws[0] == draws[1]
    assert all(a != b for a, b in zip(draws[0], other, strict=True))


def test_named_streams_are_distinct_and_stable():
    assert seeding.stream_seed(0, "order", 1) == seeding.stream_seed(0, "order", 1)
    seeds = {
        seeding.stream_seed(0, "order", 1),
        seeding.stream_seed(0, "order", 2),
        seeding.stream_seed(0, "augment", 1),
        seeding.stream_seed(1, "order", 1),
        seeding.stream_seed(0, "order", 1, rank=1),
    }
    assert len(seeds) == 5


def test_seed_random_draws_records_and_can_be_repeated(tmp_path):
    summary = train_in_process(tmp_path / "r", *tiny("seed=random"))
    drawn = summary["seed"]
    resolved = (tmp_path / "r" / "resolved_config.yaml").read_text()
    assert f"value: {drawn}" in resolved
    again = train_in_process(tmp_path / "f", *tiny(f"seed={drawn}"))
    assert again["weights_sha256"] == summary["weights_sha256"]


def test_model_init_depends_on_the_seed_only(tmp_path):
    from repro.core import build

    cfg = compose_config(*tiny())
    first = build.model(cfg, 5).state_dict()
    torch.rand(100)  # using the global stream in between must not matter
    second = build.model(cfg, 5).state_dict()
    third = build.model(cfg, 6).state_dict()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert not torch.equal(first["0.weight"], third["0.weight"])


# ---- cudnn --------------------------------------------------------------------------------


def test_cudnn_deterministic_sets_every_flag(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    determinism.apply(compose_config("cudnn=deterministic").cudnn, CPU)
    assert torch.backends.cudnn.deterministic is True
    assert torch.backends.cudnn.benchmark is False
    assert torch.are_deterministic_algorithms_enabled()
    assert not torch.is_deterministic_algorithms_warn_only_enabled()
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.backends.cudnn.allow_tf32 is False
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"


def test_cudnn_benchmark_and_warn_only():
    determinism.apply(compose_config("cudnn=benchmark").cudnn, CPU)
    assert torch.backends.cudnn.benchmark is True
    assert torch.backends.cuda.matmul.allow_tf32 is True
    assert not torch.are_deterministic_algorithms_enabled()
    determinism.apply(compose_config("cudnn=deterministic", "cudnn.warn_only=true").cudnn, CPU)
    assert torch.is_deterministic_algorithms_warn_only_enabled()


def test_preset_exact_composes_the_deterministic_knobs():
    cfg = compose_config("preset=exact")
    assert cfg.cudnn.deterministic_algorithms and not cfg.cudnn.benchmark
    assert cfg.amp.mode == "off"
    fast = compose_config("preset=fast")
    assert fast.cudnn.benchmark and fast.dataloader.num_workers == 6  # benchmark, fast


def test_a_preset_named_with_an_experiment_wins_over_the_experiments_knobs():
    cfg = compose_config("experiment=cifar10_resnet18", "preset=exact")
    assert cfg.cudnn.deterministic_algorithms and not cfg.cudnn.benchmark
    assert cfg.amp.mode == "off" and not cfg.trainer.compile
    assert cfg.model._target_.endswith("resnet18_cifar"), "the rest of the experiment stays"
    config.validate(cfg)


def test_an_override_that_breaks_preset_exact_is_refused_naming_it():
    config.validate(compose_config("preset=exact", "cudnn.warn_only=true"))  # still exact
    for override, key in (
        ("amp=bf16", "amp.mode"),
        ("cudnn=benchmark", "cudnn.deterministic_algorithms"),
    ):
        with pytest.raises(ConfigError, match=rf"^{key}=.*preset=exact needs"):
            config.validate(compose_config("preset=exact", override))


def test_gpu_batches_are_normalised_straight_into_the_models_memory_format(monkeypatch):
    from repro.core import build

    raw = torch.randint(0, 256, (8, 3, 32, 32), dtype=torch.uint8)
    labels = torch.zeros(8, dtype=torch.int64)
    plain = DeviceBatches(CPU, [0.5] * 3, [0.25] * 3)(raw, labels)[0]
    direct = DeviceBatches(CPU, [0.5] * 3, [0.25] * 3, torch.channels_last)(raw, labels)[0]
    assert direct.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(plain, direct), "the same values in either layout"
    assert MemoryFormat("channels_last").batch(direct) is direct, "nothing left to convert"
    made = []
    monkeypatch.setattr(build, "DeviceBatches", lambda *args: made.append(args[-1]))
    cfg = compose_config("memory_format=channels_last")
    build.device_batches(cfg, torch.device("cuda", 0)), build.device_batches(cfg, CPU)
    assert made == [torch.channels_last, torch.contiguous_format]


# ---- dataloader ---------------------------------------------------------------------------


def test_loader_gets_a_seeded_generator_worker_init_and_workers():
    from repro.core import build

    cfg = compose_config("dataloader=default", "data.train_size=256", "data.val_size=64")
    data = build.splits(cfg, 3)
    loader, _, val = build.loaders(cfg, data, LoaderContext(3))
    again, _, _ = build.loaders(cfg, data, LoaderContext(3))
    other, _, _ = build.loaders(cfg, data, LoaderContext(4))
    assert loader.generator is not None
    assert loader.generator.initial_seed() == again.generator.initial_seed()
    assert loader.generator.initial_seed() != other.generator.initial_seed()
    assert loader.worker_init_fn is start_worker  # seeds the worker (seeding.seed_worker)
    assert loader.num_workers == 2 and loader.prefetch_factor == 2
    assert isinstance(loader.batch_sampler, EpochBatches)
    assert val.num_workers == 2


WORKERS_THEN_SIGKILL = """
import os, signal, numpy as np
from torch.utils.data import DataLoader
from repro.core.data.workers import start_worker

class Large:
    def __len__(self): return 10**6
    def __getitem__(self, index): return np.zeros(100_000)

def announce(worker_id):
    start_worker(worker_id)
    os.write(1, f"{os.getpid()}\\n".encode())  # one write: two workers' lines never interleave

# numpy batches travel through the pipe by value (as CPU evaluation batches do): it fills
batches = iter(DataLoader(
    Large(), batch_size=4, num_workers=2, worker_init_fn=announce, collate_fn=np.stack
))
next(batches), next(batches)  # batch 1 comes from worker 1: both have announced themselves
os.kill(os.getpid(), signal.SIGKILL)
"""


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


@pytest.mark.skipif(sys.platform != "linux", reason="parent-death signal: Linux only")
def test_loader_workers_die_with_a_killed_main_process():
    # Without it they wait forever to flush their queue, holding the run's output pipes.
    main = subprocess.Popen(
        [sys.executable, "-c", WORKERS_THEN_SIGKILL], stdout=subprocess.PIPE, text=True
    )
    workers = [int(main.stdout.readline()) for _ in range(2)]
    assert main.wait(timeout=60) == -signal.SIGKILL
    deadline = time.monotonic() + 20
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not any(alive(pid) for pid in workers)
    main.stdout.close()


def test_pinned_memory_only_on_cuda():
    assert use_pinned_memory(True, torch.device("cuda")) is True
    assert use_pinned_memory(True, torch.device("cpu")) is False
    assert use_pinned_memory(False, torch.device("cuda")) is False


def test_pin_memory_is_off_in_a_cpu_run(tmp_path):
    summary = train_in_process(tmp_path / "p", *tiny("dataloader.pin_memory=true"))
    assert summary["pin_memory"] is False


def test_epoch_order_is_a_function_of_seed_and_epoch():
    sampler = EpochBatches(100, 10, root_seed=1)
    sampler.set_epoch(3)
    batches = list(sampler)
    sampler.set_epoch(3, start_batch=4)
    assert list(sampler) == batches[4:]
    sampler.set_epoch(4)
    following = list(sampler)
    assert following != batches
    assert sorted(i for b in batches for _, i in b) == list(range(100))
    sampler.set_epoch(3, start_batch=4, epochs=2)  # one iterator through epochs, as a run reads
    assert list(sampler) == batches[4:] + following
    assert len(sampler) == 6 + 10


def test_evaluation_batches_go_round_in_stored_order_per_rank():
    second_rank = EvalBatches(10, 4, rank=1, world=2)
    assert len(second_rank) == 2
    assert list(itertools.islice(second_rank, 5)) == [[1, 3, 5, 7], [9]] * 2 + [[1, 3, 5, 7]]


def test_loader_workers_start_once_per_run_and_stop_with_it_even_after_an_error(
    tmp_path, monkeypatch
):
    """One iterator per loader for the whole run: workers never restart at an epoch, and
    none outlives the run, whether it ends or fails."""
    children = []
    original = Trainer.train_step

    def failing(trainer, images, labels):
        children.append({child.pid for child in multiprocessing.active_children()})
        if trainer.state.position.step == 7:
            raise RuntimeError("boom")
        return original(trainer, images, labels)

    monkeypatch.setattr(Trainer, "train_step", failing)
    before = {child.pid for child in multiprocessing.active_children()}
    run = tiny("dataloader.num_workers=2", "trainer.epochs=3")  # 6 steps per epoch
    with pytest.raises(RuntimeError, match="boom"):
        train_in_process(tmp_path / "failing", *run)
    training = children[0] - before
    assert len(training) == 2 and children[:6] == [children[0]] * 6  # epoch 0
    validation = children[6] - children[0]  # started by the evaluation that ended epoch 0
    assert len(validation) == 2 and children[6:] == [children[0] | validation] * 2
    assert {child.pid for child in multiprocessing.active_children()} <= before


# ---- memory_format and amp ----------------------------------------------------------------


def test_channels_last_reaches_the_weights_and_every_batch(tmp_path, recorded_forward):
    train_in_process(tmp_path / "cl", *tiny("memory_format=channels_last"))
    training = [s for s in recorded_forward if s["training"]]
    evaluation = [s for s in recorded_forward if not s["training"]]
    assert training and evaluation
    assert all(s["input_channels_last"] and s["weight_channels_last"] for s in recorded_forward)


def test_contiguous_leaves_the_layout_alone(tmp_path, recorded_forward):
    train_in_process(tmp_path / "c", *tiny("memory_format=contiguous"))
    assert not any(s["input_channels_last"] for s in recorded_forward)
    assert not any(s["weight_channels_last"] for s in recorded_forward)


def test_channels_last_leaves_other_ranks_alone(caplog):
    from repro.core.runtime.memory_format import MemoryFormat

    caplog.set_level(logging.INFO, logger="repro.core.runtime.memory_format")
    fmt = MemoryFormat("channels_last")
    assert fmt.name == "channels_last"  # what the run's settings record
    flat = torch.zeros(4, 10)
    assert fmt.batch(flat) is flat
    fmt.batch(flat)
    said = [r.getMessage() for r in caplog.records if "4-D" in r.message]
    assert said == ["channels_last applies to 4-D batches; leaving 2-D input as is"]


def test_bf16_autocast_is_active_in_training_and_eval(tmp_path, recorded_forward):
    summary = train_in_process(tmp_path / "bf16", *tiny("amp=bf16"))
    assert summary["amp"] == "bf16"
    assert all(s["autocast"] and s["autocast_dtype"] == torch.bfloat16 for s in recorded_forward)


def test_amp_off_and_auto_on_cpu_run_in_full_precision(tmp_path, recorded_forward):
    summary = train_in_process(tmp_path / "auto", *tiny("amp=auto"))
    assert summary["amp"] == "off"
    assert not any(s["autocast"] for s in recorded_forward)


def test_fp16_is_refused_on_cpu_where_no_mode_scales_the_loss():
    with pytest.raises(ConfigError, match="fp16"):
        Precision("fp16", torch.device("cpu"))
    for mode in ("off", "bf16"):
        assert Precision(mode, torch.device("cpu")).scaler.is_enabled() is False


# ---- the rest of the run --------------------------------------------------------------------


def test_eval_runs_without_gradients(tmp_path, recorded_forward):
    train_in_process(tmp_path / "g", *tiny())
    assert all(not s["grad_enabled"] for s in recorded_forward if not s["training"])
    assert all(s["grad_enabled"] for s in recorded_forward if s["training"])


def test_summary_records_the_flags(tmp_path):
    train_in_process(tmp_path / "d", *tiny("cudnn=deterministic"))
    flags = read_summary(tmp_path / "d")["flags"]
    assert flags["deterministic_algorithms"] is True and flags["cudnn_deterministic"] is True


@pytest.mark.slow
def test_compile_trains_and_keeps_checkpoints_interchangeable(tmp_path):
    """trainer.compile=true (inductor's C++ build: about half a minute on 2 cores)."""
    plain = train_in_process(tmp_path / "plain", *tiny("trainer.max_steps=2"))
    compiled = train_in_process(tmp_path / "compiled", *tiny("trainer.max_steps=2"),
                                "trainer.compile=true")  # fmt: skip
    assert compiled["completed"] and np.isfinite(compiled["val_loss"])
    keys = [
        set(torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"])
        for run in (tmp_path / "plain", tmp_path / "compiled")
    ]
    assert keys[0] == keys[1] and not any("_orig_mod" in key for key in keys[1])
    assert plain["step"] == compiled["step"] == 2
