"""Range and choice checks of a composed config, and config helpers.

`validate` adds to the schemas' types (`schema.py`) the checks a type cannot express (ranges,
choices, settings that must agree) and raises a ConfigError naming key, value and what is
allowed.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import fields, is_dataclass
from typing import Any

from omegaconf import DictConfig

from repro.core.errors import ConfigError
from repro.core.schema import BenchConfig, Config

CHOICES = {
    "seed.mode": ("fixed", "random"),
    "memory_format.name": ("contiguous", "channels_last"),
    "amp.mode": ("auto", "off", "bf16", "fp16"),
    "data.cache": ("none", "memory"),
    "trainer.device": ("auto", "cpu", "cuda"),
    "trainer.monitor_mode": ("max", "min"),
    "trainer.test_weights": ("best", "last", "ema"),
    "trainer.tta": ("none", "flip", "flip_translate"),
    "augment.flip": ("random", "alternate"),
    "augment.crop_padding_mode": ("zeros", "reflect", "edge"),
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
    "dataloader.num_workers": (0, False),
    "dataloader.prefetch_factor": (1, False),
    "data.num_classes": (2, True),
    "data.image_size": (1, False),
    "data.crop_padding": (0, False),
    "data.val_size": (0, False),
    "data.train_size": (1, True),
    "data.test_size": (1, True),
    "data.cache_budget_gib": (0, False),
    "augment.mixup_alpha": (0, False),
    "augment.cutout": (0, False),
    "augment.cutmix_alpha": (0, False),
    "logger.fingerprint_every_steps": (1, False),
    "optimizer.lr": (0, False),
    "optimizer.weight_decay": (0, False),
    "optimizer.momentum": (0, False),
}


# key: (the interval a value must lie in, as written; whether None is allowed). "[" and "]"
# include their end, "(" and ")" leave it out.
BETWEEN = {
    "scheduler.warmup": ("[0, 1)", True),
    "objective.label_smoothing": ("[0, 1)", False),
    "data.fraction": ("(0, 1]", False),
}


def inside(value: Any, interval: str) -> bool:
    """Whether a number lies in an interval written as in BETWEEN."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        return False
    low, high = (float(end) for end in interval[1:-1].split(","))
    above = value >= low if interval[0] == "[" else value > low
    below = value <= high if interval[-1] == "]" else value < high
    return above and below


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


def did_you_mean(key: str, known: Any, prefix: str = "") -> str:
    """What to say of an unknown `key`: the closest of the `known` keys (any, however far: a
    name to check beats none), or that there are none."""
    close = difflib.get_close_matches(str(key), [str(k) for k in known], n=1, cutoff=0.0)
    return f"did you mean {prefix}{close[0]}?" if close else "there are no keys here yet"


def _unknown_keys(node: Any, schema: type, prefix: str = "") -> tuple[str, Any, str] | None:
    """The first key of `node` its dataclass does not declare, its value and what to say of
    it. `+key=value` adds keys past the schema; nodes typed Any (model, optimizer, scheduler)
    and nodes with a `_target_` take any key, as their class's arguments."""
    known = {f.name: f for f in fields(schema)}
    for key in node:
        if key not in known:
            return f"{prefix}{key}", node[key], did_you_mean(key, known, prefix)
        child = known[key].default_factory  # a section's dataclass; MISSING for Any nodes
        if is_dataclass(child) and "_target_" not in node[key]:
            found = _unknown_keys(node[key], child, f"{prefix}{key}.")
            if found:
                return found
    return None


def validate(cfg: DictConfig, schema: type = Config) -> None:
    """Raise ConfigError for a key `schema` does not know, or the first value outside its
    allowed range or choices."""
    from repro.core import tasks
    from repro.core.data import datasets  # the data option's own settings, typed by its builder

    datasets.typed_data(cfg.data)
    datasets.check_settings(datasets.builder(cfg.data), cfg.data)
    unknown = _unknown_keys(cfg, schema)
    if unknown:
        key, value, hint = unknown
        raise ConfigError(key, value, f"not a known key; {hint}")
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
    for key, (interval, nullable) in BETWEEN.items():
        value = _get(cfg, key)
        if value is _ABSENT or (value is None and nullable):
            continue
        if not inside(value, interval):
            raise ConfigError(key, value, f"{'null or ' if nullable else ''}in {interval}")
    for group in ("callbacks", "components", "metrics"):
        _check_plugged_in(group, cfg.get(group))
    # Built only once the data has loaded: `+objective.gama=3` would be refused that late.
    _check_arguments("objective", cfg.get("objective"))
    if cfg.seed.mode == "fixed" and cfg.seed.value is None:
        raise ConfigError(
            "seed.value", None, "an integer >= 0 with seed=fixed (or use seed=random)"
        )
    if cfg.seed.value is not None and cfg.seed.value < 0:
        raise ConfigError("seed.value", cfg.seed.value, "an integer >= 0")
    _check_trainer_extras(cfg.trainer, cfg.get("components"))
    tasks.check_config(cfg)  # what the objective's task allows, and selection without val
    augment = cfg.get("augment")
    if cfg.trainer.world_invariant and augment and (augment.mixup_alpha or augment.cutmix_alpha):
        allowed = (
            "0 with trainer.world_invariant=true (mixing is keyed per rank, not per micro-batch)"
        )
        raise ConfigError("augment.mixup_alpha", augment.mixup_alpha, allowed)
    mirrored = augment and augment.crop_flip and augment.crop_padding_mode == "reflect"
    shortest = cfg.data.resize or cfg.data.image_size  # the crop's images are at least this
    if mirrored and cfg.data.crop_padding >= shortest:
        allowed = f"below the images' shorter side ({shortest}) with reflect padding"
        raise ConfigError("data.crop_padding", cfg.data.crop_padding, allowed)
    if augment and augment.cutout > cfg.data.image_size:
        allowed = f"0 (off) or a side of at most data.image_size ({cfg.data.image_size})"
        raise ConfigError("augment.cutout", augment.cutout, allowed)
    if len(cfg.data.mean) != 3 or len(cfg.data.std) != 3 or min(cfg.data.std) <= 0:
        raise ConfigError(
            "data.std", list(cfg.data.std), "three positive numbers (and three means)"
        )
    if cfg.data.resize is not None and cfg.data.resize < cfg.data.image_size:
        allowed = f"null or >= data.image_size ({cfg.data.image_size})"
        raise ConfigError("data.resize", cfg.data.resize, allowed)


def _check_plugged_in(group: str, nodes: Any) -> None:
    """`callbacks` and `components`: name -> null or a node naming its class by `_target_`."""
    for name, node in (nodes or {}).items():
        if node is not None and not (isinstance(node, DictConfig) and "_target_" in node):
            raise ConfigError(
                f"{group}.{name}", node, "a class given by _target_ (and its arguments)"
            )


def _check_arguments(key: str, node: Any) -> None:
    """Every key of a `_target_` node names an argument its target takes (any does, for a
    target taking **kwargs). A target that cannot be imported or inspected is left to its
    build, which says why in one line."""
    if not isinstance(node, DictConfig) or not isinstance(node.get("_target_"), str):
        return
    from hydra.utils import get_object

    try:
        parameters = inspect.signature(get_object(node._target_)).parameters.values()
    except Exception:  # an import error, or a builtin without a signature
        return
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    takes = [parameter.name for parameter in parameters if parameter.kind in named]
    for name in node:
        if not str(name).startswith("_") and name not in takes:  # _target_, _partial_: Hydra's
            takes_text = ", ".join(takes) or "no arguments"
            allowed = f"not an argument of {node._target_}, which takes {takes_text}"
            raise ConfigError(f"{key}.{name}", node[name], allowed)


MONITORED = ("val_", "ema_val_")  # an evaluation's columns: accuracy, objective's terms, metrics


def _check_trainer_extras(trainer: DictConfig, components: Any) -> None:
    """Best-checkpoint, EMA and accumulation settings that must agree with each
    other or lie in a range."""
    if trainer.monitor != "auto" and not str(trainer.monitor).startswith(MONITORED):
        allowed = (
            "auto (the objective's: val_acc, or val_map for multi-label) or an evaluation "
            "column: val_acc, val_loss, val_<a term or a metric>, ema_val_..."
        )
        raise ConfigError("trainer.monitor", trainer.monitor, allowed)
    uses_ema = trainer.monitor.startswith("ema_") or trainer.test_weights == "ema"
    if uses_ema and (components or {}).get("ema") is None:
        key = "trainer.monitor" if trainer.monitor.startswith("ema_") else "trainer.test_weights"
        needs = "needs a weight average: +components=ema"
        raise ConfigError(key, trainer.get(key.split(".")[1]), needs)
    if trainer.world_invariant:
        _check_world_invariant(trainer)
    window = trainer.profile_steps
    if window is not None and (len(window) != 2 or not 1 <= window[0] <= window[1]):
        allowed = "null or [first, last], steps with 1 <= first <= last"
        raise ConfigError("trainer.profile_steps", list(window), allowed)
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


def register() -> None:
    """What every entry point sets up before Hydra composes: the schemas, each under its own
    name in the `schema` group (`train` for conf/config.yaml, `bench` for conf/bench.yaml),
    and the resolvers the conf/ files name. Safe to call more than once."""
    from hydra.core.config_store import ConfigStore
    from omegaconf import OmegaConf

    from repro.core.runtime import launch  # imports nothing heavy

    # Hydra copies its config repository (the store with it) for every group it lists, 166
    # times for `--help`, 4 s here; the store is a singleton whose `load` hands out copies of
    # its nodes, so a copy of it may be the store itself.
    ConfigStore.__deepcopy__ = _same_store  # type: ignore[attr-defined]
    store = ConfigStore.instance()
    store.store(group="schema", name="train", node=Config, package="_global_")
    store.store(group="schema", name="bench", node=BenchConfig, package="_global_")
    launch.register_resolvers()
    OmegaConf.register_new_resolver("record_subdir", _record_subdir, replace=True)


def _same_store(store: Any, memo: dict[int, Any]) -> Any:
    """A deep copy of Hydra's ConfigStore: the store (see `register`)."""
    return store


def _record_subdir(*args: Any) -> Any:
    """The `record_subdir` resolver (runs.history), imported when Hydra first resolves it: a
    command that composes no run folder (`--help`, `--cfg job`) imports no torch."""
    from repro.core.runs.history import record_subdir

    return record_subdir(*args)
