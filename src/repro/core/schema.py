"""Typed schemas for the config (`config.register` stores them in Hydra's ConfigStore).

The schemas give types, not values: each value lives in one place, the YAML option of its
group under conf/ (MISSING here). A default below is for a key that not every option sets, or
one added since checkpoints first recorded their config: the value that does what runs did
before the key existed, so a recorded config that lacks it reads as it trained
(`declared_defaults`; no table to keep beside this file).
Hydra merges every YAML option onto these dataclasses, so a wrong type or an unknown key is
reported at composition time with its full key; `config.validate` adds the checks a type
cannot express.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from typing import Any, Optional

from omegaconf import MISSING

# OmegaConf reads these annotations at run time; it understands Optional[...] on every
# supported Python, PEP 604 unions only on some.
# ruff: noqa: UP045


@dataclass
class SeedConfig:
    mode: str = MISSING  # fixed | random
    value: Optional[int] = MISSING


@dataclass
class CudnnConfig:
    benchmark: bool = MISSING
    deterministic: bool = MISSING
    deterministic_algorithms: bool = MISSING
    warn_only: bool = MISSING
    tf32_matmul: bool = MISSING
    tf32_cudnn: bool = MISSING


@dataclass
class DataLoaderConfig:
    num_workers: int = MISSING
    pin_memory: bool = MISSING
    prefetch_factor: int = MISSING
    on_device: bool = False  # dataloader=device: in-memory data kept and augmented on the device


@dataclass
class MemoryFormatConfig:
    name: str = MISSING


@dataclass
class AmpConfig:
    mode: str = MISSING  # auto | off | bf16 | fp16


@dataclass
class DataConfig:
    _target_: str = MISSING  # the builder: (data config, seed) -> Splits (repro.core.data.datasets)
    num_classes: Optional[int] = MISSING  # None: infer (imagefolder)
    image_size: int = MISSING
    mean: list[float] = MISSING
    std: list[float] = MISSING
    augment: bool = MISSING
    crop_padding: int = MISSING
    resize: Optional[int] = MISSING
    val_size: int = MISSING
    root: Optional[str] = None
    download: bool = False
    fraction: float = 1.0  # keep this seeded fraction of every split (debug=limit)
    cache: str = "none"  # imagefolder: none | memory (decoded once into one tensor)
    cache_budget_gib: float = 8.0  # imagefolder: the most memory the decoded cache may take
    # Synthetic only (set by data/synthetic.yaml): a fixed benchmark made from its own seed.
    train_size: Optional[int] = None
    test_size: Optional[int] = None
    generator_seed: Optional[int] = None


@dataclass
class AugmentConfig:
    crop_flip: bool = MISSING
    flip: str = "random"  # random | alternate
    crop_padding_mode: str = "zeros"  # zeros | reflect | edge
    cutout: int = 0  # > 0: a random square of this side set to zero (Cutout)
    transforms: list[Any] = MISSING  # torchvision.transforms.v2 nodes with a _target_
    mixup_alpha: float = MISSING
    cutmix_alpha: float = MISSING


@dataclass
class TrainerConfig:
    epochs: int = MISSING
    max_steps: Optional[int] = MISSING
    batch_size: int = MISSING
    eval_batch_size: int = MISSING
    eval_every_epochs: int = MISSING
    eval_every_steps: Optional[int] = MISSING
    grad_clip: Optional[float] = MISSING
    checkpoint_every_steps: Optional[int] = MISSING
    keep_checkpoints: int = MISSING
    save_checkpoints: bool = MISSING  # false: write no checkpoint files at all (debug=fast)
    device: str = MISSING
    resume: str = MISSING
    compile: bool = MISSING
    halt_at_step: Optional[int] = MISSING
    num_threads: Optional[int] = MISSING
    global_batch: bool = MISSING  # torchrun: batch_size is the total over ranks, not per rank
    sync_batchnorm: bool = MISSING
    sync_debug: bool = MISSING  # CUDA: warn at every host sync after the first step
    profile_steps: Optional[list[int]] = None  # [first, last]: torch.profiler over them
    monitor: str = MISSING
    monitor_mode: str = MISSING  # max | min
    patience: Optional[int] = MISSING
    accumulate_steps: int = MISSING
    test_after_fit: bool = MISSING
    test_weights: str = MISSING  # best | last | ema
    tta: str = "none"  # none | flip: test-time augmentation of every evaluation
    init_weights: Optional[str] = None  # a file whose matching weights start the model
    world_invariant: bool = MISSING
    micro_batch: Optional[int] = MISSING


@dataclass
class OptimizerExtras:
    """The template's own keys of an `optimizer` node (any class's arguments besides), taken
    out before the class sees them (`build.optimizer`)."""

    decay_biases_and_norms: bool = True  # false: no weight decay on biases and norm weights
    lr_scale_biases_and_norms: float = 1.0  # their learning rate, as a multiple of lr
    layer_decay: Optional[float] = None  # fine-tuning: lr x this per depth below the head
    head_lr: Optional[float] = None  # fine-tuning: the classifier head's own learning rate


@dataclass
class MlflowConfig:
    tracking_uri: Optional[str] = MISSING
    experiment: str = MISSING


@dataclass
class WandbConfig:
    project: str = MISSING
    mode: str = MISSING  # offline | online | disabled


@dataclass
class LoggerConfig:
    # Declared here, not in csv.yaml: with `logger=[tensorboard,mlflow]`, mlflow's csv base
    # would set it back to false.
    tensorboard: bool = False
    fingerprint_every_steps: int = MISSING
    progress: str = MISSING  # auto | on | off
    plot: bool = MISSING
    mlflow: Optional[MlflowConfig] = None  # logger=mlflow
    wandb: Optional[WandbConfig] = None  # logger=wandb


@dataclass
class Config:
    seed: SeedConfig = field(default_factory=SeedConfig)
    cudnn: CudnnConfig = field(default_factory=CudnnConfig)
    dataloader: DataLoaderConfig = field(default_factory=DataLoaderConfig)
    memory_format: MemoryFormatConfig = field(default_factory=MemoryFormatConfig)
    amp: AmpConfig = field(default_factory=AmpConfig)
    # Open, unlike the other sections: a data option may add its builder's own settings.
    data: Any = field(default_factory=lambda: _open(DataConfig))
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    objective: Any = None
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    callbacks: dict[str, Any] = field(default_factory=dict)  # name -> a node with a _target_
    # name -> a node with a _target_: a part of the loop that changes the weights (lookahead)
    components: dict[str, Any] = field(default_factory=dict)
    # name -> a torchmetrics class by _target_, scoring every evaluation (the `metrics` group)
    metrics: dict[str, Any] = field(default_factory=dict)
    preset: Optional[str] = None  # set by conf/preset/*.yaml


@dataclass
class BenchConfig(Config):
    """The training schema plus a benchmark suite's own settings (free-form, per suite)."""

    suite: Any = None


def declared_defaults() -> dict[str, Any]:
    """Dotted key -> the value a schema declares for it, for every section's key that has one
    (and the optimizer's extras): what a recorded config that lacks the key means."""
    sections = {
        item.name: _SECTIONS[item.type] for item in fields(Config) if item.type in _SECTIONS
    }
    sections["optimizer"], sections["data"] = OptimizerExtras, DataConfig
    return {
        f"{section}.{item.name}": item.default
        for section, schema in sections.items()
        for item in fields(schema)
        if item.default not in (MISSING, dataclasses.MISSING) and "Config" not in str(item.type)
    }


def _open(schema: type) -> dict[str, Any]:
    """A section's keys and defaults as an untyped node, which takes keys the schema lacks;
    `config.validate` then types the declared ones."""
    return {item.name: item.default for item in fields(schema)}


_SECTIONS = {schema.__name__: schema for schema in (SeedConfig, CudnnConfig, DataLoaderConfig,
             MemoryFormatConfig, AmpConfig, DataConfig, AugmentConfig, TrainerConfig,
             LoggerConfig)}  # fmt: skip


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level of dotted keys: {"trainer": {"epochs": 6}} -> trainer.epochs."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out
