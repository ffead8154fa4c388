"""Typed schemas for the config, registered with Hydra's ConfigStore, and range checks.

The schemas give types, not values: each value lives in one place, the YAML option of its
group under conf/ (MISSING here). A default below is for a key that not every option sets.

Hydra merges every YAML option onto these dataclasses, so a wrong type or an unknown key is
reported at composition time with its full key. `validate` adds the checks a type cannot
express (ranges and choices) and raises a ConfigError naming key, value and what is allowed.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any, Optional

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig

from repro.errors import ConfigError

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
    name: str = MISSING
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
    cutout: int = MISSING  # > 0: a random square of this side set to zero (Cutout)
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
    label_smoothing: float = MISSING
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
    monitor: str = MISSING
    monitor_mode: str = MISSING  # max | min
    patience: Optional[int] = MISSING
    ema_decay: Optional[float] = MISSING
    accumulate_steps: int = MISSING
    test_after_fit: bool = MISSING
    test_weights: str = MISSING  # best | last | ema
    tta: str = MISSING  # none | flip: test-time augmentation of every evaluation
    world_invariant: bool = MISSING
    micro_batch: Optional[int] = MISSING


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
    tensorboard: bool = MISSING
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
    data: DataConfig = field(default_factory=DataConfig)
    augment: AugmentConfig = field(default_factory=AugmentConfig)
    model: Any = None
    optimizer: Any = None
    scheduler: Any = None
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    logger: LoggerConfig = field(default_factory=LoggerConfig)
    preset: Optional[str] = None  # set by conf/preset/*.yaml


@dataclass
class BenchConfig(Config):
    """The training schema plus a benchmark suite's own settings (free-form, per suite)."""

    suite: Any = None


def register() -> None:
    """What every entry point sets up before Hydra composes: the schemas, each under its own
    name in the `schema` group (`train` for conf/config.yaml, `bench` for conf/bench.yaml),
    and the resolvers the conf/ files name. Safe to call more than once."""
    from repro import launch  # imports nothing heavy

    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=Config, package="_global_")
    store.store(group="schema", name="bench", node=BenchConfig, package="_global_")
    launch.register_resolvers()


CHOICES = {
    "seed.mode": ("fixed", "random"),
    "memory_format.name": ("contiguous", "channels_last"),
    "amp.mode": ("auto", "off", "bf16", "fp16"),
    "data.name": ("synthetic", "cifar10", "imagefolder"),
    "data.cache": ("none", "memory"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.monitor_mode": ("max", "min"),
    "trainer.test_weights": ("best", "last", "ema"),
    "trainer.tta": ("none", "flip"),
    "logger.progress": ("auto", "on", "off"),
    "logger.wandb.mode": ("offline", "online", "disabled"),
}

# key: (lowest allowed, whether None is allowed)
MINIMUM = {
    "trainer.epochs": (1, False),
    "trainer.max_steps": (1, True),
    "trainer.batch_size": (1, False),
    "trainer.eval_batch_size": (1, False),
    "trainer.eval_every_epochs": (1, False),
    "trainer.eval_every_steps": (1, True),
    "trainer.checkpoint_every_steps": (1, True),
    "trainer.halt_at_step": (1, True),
    "trainer.num_threads": (1, True),
    "trainer.keep_checkpoints": (1, False),
    "trainer.patience": (1, True),
    "trainer.accumulate_steps": (1, False),
    "trainer.micro_batch": (1, True),
    "trainer.grad_clip": (0, True),
    "trainer.label_smoothing": (0, False),
    "dataloader.num_workers": (0, False),
    "dataloader.prefetch_factor": (1, False),
    "data.num_classes": (2, True),
    "data.image_size": (1, False),
    "data.crop_padding": (0, False),
    "data.val_size": (1, False),
    "data.train_size": (1, True),
    "data.test_size": (1, True),
    "data.fraction": (0, False),
    "data.cache_budget_gib": (0, False),
    "augment.mixup_alpha": (0, False),
    "augment.cutout": (0, False),
    "augment.cutmix_alpha": (0, False),
    "logger.fingerprint_every_steps": (1, False),
    "optimizer.lr": (0, False),
    "optimizer.weight_decay": (0, False),
    "optimizer.momentum": (0, False),
}


def _get(cfg: DictConfig, key: str) -> Any:
    node: Any = cfg
    for part in key.split("."):
        if not isinstance(node, DictConfig) or part not in node:
            return _ABSENT
        node = node[part]
    return node


_ABSENT = object()


# What preset=exact promises: each key's required value. A choice made after the preset (on
# the command line: `preset=exact amp=bf16`) would quietly void it, so it is refused.
EXACT = {
    "seed.mode": "fixed",
    "cudnn.deterministic_algorithms": True,
    "cudnn.deterministic": True,
    "cudnn.benchmark": False,
    "cudnn.tf32_matmul": False,
    "cudnn.tf32_cudnn": False,
    "amp.mode": "off",
    "trainer.compile": False,
}


def _check_exact(cfg: DictConfig) -> None:
    broken = [key for key, wanted in EXACT.items() if _get(cfg, key) != wanted]
    if broken:
        wanted = ", ".join(f"{key}={EXACT[key]}" for key in broken)
        allowed = f"preset=exact needs {wanted}; drop the override or the preset"
        raise ConfigError(broken[0], _get(cfg, broken[0]), allowed)


def flatten(values: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested dict as one level of dotted keys: {"trainer": {"epochs": 6}} -> trainer.epochs."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, dict):
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> tuple[str, Any, str] | None:
    """The first key of `node` its dataclass does not declare, its value and the closest known
    key. `+key=value` adds keys past the schema; nodes typed Any (model, optimizer, scheduler)
    and nodes with a `_target_` take any key, as their class's arguments."""
    known = {f.name: f for f in fields(schema)}
    for key in node:
        if key not in known:
            close = difflib.get_close_matches(str(key), list(known), n=1, cutoff=0.0)
            return f"{prefix}{key}", node[key], f"{prefix}{close[0]}" if close else ""
        child = known[key].default_factory  # a section's dataclass; MISSING for Any nodes
        if is_dataclass(child) and "_target_" not in node[key]:
            found = _unknown_keys(node[key], child, f"{prefix}{key}.")
            if found:
                return found
    return None


def validate(cfg: DictConfig, schema: type = Config) -> None:
    """Raise ConfigError for a key `schema` does not know, or the first value outside its
    allowed range or choices."""
    unknown = _unknown_keys(cfg, schema)
    if unknown:
        key, value, closest = unknown
        raise ConfigError(key, value, f"not a known key; the closest is {closest}")
    if cfg.get("preset") == "exact":
        _check_exact(cfg)
    for key, allowed in CHOICES.items():
        value = _get(cfg, key)
        if value is not _ABSENT and value not in allowed:
            raise ConfigError(key, value, f"choose one of {', '.join(allowed)}")
    for key, (lowest, nullable) in MINIMUM.items():
        value = _get(cfg, key)
        if value is _ABSENT or (value is None and nullable):
            continue
        if not isinstance(value, int | float) or isinstance(value, bool) or value < lowest:
            raise ConfigError(key, value, f"must be a number >= {lowest}")
    if cfg.seed.mode == "fixed" and cfg.seed.value is None:
        raise ConfigError(
            "seed.value", None, "an integer >= 0 with seed=fixed (or use seed=random)"
        )
    if cfg.seed.value is not None and cfg.seed.value < 0:
        raise ConfigError("seed.value", cfg.seed.value, "an integer >= 0")
    _check_trainer_extras(cfg.trainer)
    augment = cfg.get("augment")
    if cfg.trainer.world_invariant and augment and (augment.mixup_alpha or augment.cutmix_alpha):
        allowed = (
            "0 with trainer.world_invariant=true (mixing is keyed per rank, not per micro-batch)"
        )
        raise ConfigError("augment.mixup_alpha", augment.mixup_alpha, allowed)
    if augment and augment.cutout > cfg.data.image_size:
        allowed = f"0 (off) or a side of at most data.image_size ({cfg.data.image_size})"
        raise ConfigError("augment.cutout", augment.cutout, allowed)
    if not 0 <= cfg.trainer.label_smoothing < 1:
        raise ConfigError("trainer.label_smoothing", cfg.trainer.label_smoothing, "in [0, 1)")
    if len(cfg.data.mean) != 3 or len(cfg.data.std) != 3 or min(cfg.data.std) <= 0:
        raise ConfigError(
            "data.std", list(cfg.data.std), "three positive numbers (and three means)"
        )
    if not 0 < cfg.data.fraction <= 1:
        raise ConfigError("data.fraction", cfg.data.fraction, "in (0, 1]")
    if cfg.data.resize is not None and cfg.data.resize < cfg.data.image_size:
        allowed = f"null or >= data.image_size ({cfg.data.image_size})"
        raise ConfigError("data.resize", cfg.data.resize, allowed)
    if cfg.data.name in ("imagefolder", "cifar10") and not cfg.data.root:
        raise ConfigError("data.root", cfg.data.root, f"a folder path for data={cfg.data.name}")


MONITORED = ("val_acc", "val_loss", "ema_val_acc", "ema_val_loss")


def _check_trainer_extras(trainer: DictConfig) -> None:
    """Best-checkpoint, EMA and accumulation settings that must agree with each other."""
    if trainer.monitor not in MONITORED:
        raise ConfigError("trainer.monitor", trainer.monitor, f"one of {', '.join(MONITORED)}")
    uses_ema = trainer.monitor.startswith("ema_") or trainer.test_weights == "ema"
    if trainer.ema_decay is None and uses_ema:
        key = "trainer.monitor" if trainer.monitor.startswith("ema_") else "trainer.test_weights"
        raise ConfigError(key, trainer.get(key.split(".")[1]), "needs trainer.ema_decay set")
    if trainer.ema_decay is not None and not 0 < trainer.ema_decay < 1:
        raise ConfigError("trainer.ema_decay", trainer.ema_decay, "null or in (0, 1)")
    if trainer.world_invariant:
        _check_world_invariant(trainer)
    if trainer.batch_size % trainer.accumulate_steps:
        allowed = f"a divisor of trainer.batch_size ({trainer.batch_size})"
        raise ConfigError("trainer.accumulate_steps", trainer.accumulate_steps, allowed)


def _check_world_invariant(trainer: DictConfig) -> None:
    """What world-invariant training needs, and what it cannot make invariant."""
    needs = {
        "trainer.global_batch": (trainer.global_batch, True, "true: the batch is the total"),
        "trainer.accumulate_steps": (trainer.accumulate_steps, 1, "1: micro_batch does that"),
        "trainer.sync_batchnorm": (trainer.sync_batchnorm, False, "false: statistics are "
                                   "combined in micro-batch order instead"),
    }  # fmt: skip
    for key, (value, wanted, why) in needs.items():
        if value != wanted:
            raise ConfigError(key, value, f"{why} with trainer.world_invariant=true")
    if trainer.micro_batch is None or trainer.batch_size % trainer.micro_batch:
        allowed = f"a divisor of trainer.batch_size ({trainer.batch_size}) with world_invariant"
        raise ConfigError("trainer.micro_batch", trainer.micro_batch, allowed)
