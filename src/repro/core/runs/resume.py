"""Resuming: which checkpoint to continue from, and whether the config still matches it."""

from __future__ import annotations

import copy
import logging
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from repro.core import relocated, schema
from repro.core.data import datasets
from repro.core.data.datasets import Splits
from repro.core.errors import CheckpointError
from repro.core.runs import checkpoint
from repro.core.runs.checkpoint import Checkpointer

log = logging.getLogger(__name__)

# Keys that may differ between a checkpoint and the resuming run: they change how long the
# run goes on, how it is observed or how data is loaded, never what an already taken step did.
MAY_CHANGE = (
    "trainer.epochs",
    "trainer.max_steps",
    "trainer.resume",
    "trainer.eval_every_epochs",
    "trainer.eval_every_steps",
    "trainer.checkpoint_every_steps",
    "trainer.keep_checkpoints",
    "trainer.eval_batch_size",
    "trainer.halt_at_step",
    "trainer.save_checkpoints",
    "trainer.sync_debug",
    "trainer.profile_steps",
    "dataloader.",
    "logger.",
    "callbacks.",  # they only watch
    "seed.mode",
    "data.root",
    "data.download",
)

# A key a recorded config lacks (added since it was written) means what the schema declares
# for it: the behaviour before the key existed (`schema.declared_defaults`).
DECLARED = schema.declared_defaults()


# What a config recorded before the `objective` group existed trained with: cross-entropy, its
# smoothing then kept under `trainer`.
DEFAULT_OBJECTIVE = "repro.core.tasks.objectives.CrossEntropy"
# Classes that moved to the recipes area, by their old `_target_`.
MOVED = {
    "repro.models.whitened_cnn.WhitenedCNN": "repro.recipes.whitened_cnn.WhitenedCNN",
    "repro.models.resnet9.ResNet9": "repro.recipes.resnet9.ResNet9",
}
LOOKAHEAD = "repro.extras.recipes.lookahead.Lookahead"  # once `trainer.lookahead_every` and its kin
AVERAGE = "repro.extras.components.ema.WeightAverage"  # once `trainer.ema_decay`


def upgrade(recorded: dict[str, Any]) -> dict[str, Any]:
    """A recorded config (a checkpoint's, a resolved_config.yaml's) in today's layout: what
    has moved since is where it is now. A copy; the record is left as it was."""
    upgraded = copy.deepcopy(recorded)
    sections = ("data", "trainer", "model", "components")
    if not all(isinstance(upgraded.get(key, {}), dict) for key in sections):
        return upgraded  # no config of this template: trust.as_data says so in one line
    data = upgraded.get("data", {})
    if "name" in data and "_target_" not in data:  # the builders are named as the options were
        data["_target_"] = f"repro.core.data.datasets.{data.pop('name')}"
    if "objective" not in upgraded:
        smoothing = upgraded.get("trainer", {}).pop("label_smoothing", 0.0)
        upgraded["objective"] = {"_target_": DEFAULT_OBJECTIVE, "label_smoothing": smoothing}
    model = upgraded.get("model", {})
    if model.get("_target_") in MOVED:
        model["_target_"] = MOVED[model["_target_"]]
    trainer = upgraded.get("trainer", {})
    components: dict[str, Any] = {}  # in the order they acted: the average, then lookahead
    if trainer.get("ema_decay") is not None:
        components["ema"] = {"_target_": AVERAGE, "decay": trainer["ema_decay"]}
    trainer.pop("ema_decay", None)
    if "lookahead_every" in trainer:
        every = trainer.pop("lookahead_every")
        decay, ramp = trainer.pop("lookahead_decay", 0.5), trainer.pop("lookahead_ramp", "constant")
        if every is not None:
            lookahead = {"_target_": LOOKAHEAD, "every": every, "decay": decay, "ramp": ramp}
            components["lookahead"] = lookahead
    if components:
        upgraded["components"] = {**components, **upgraded.get("components", {})}
    return _relocated(upgraded)


def _relocated(node: Any) -> Any:
    """`node` with every `_target_` named as today's layout names it (`relocated`)."""
    if isinstance(node, list):
        return [_relocated(item) for item in node]
    if not isinstance(node, dict):
        return node
    moved = {key: _relocated(value) for key, value in node.items()}
    target = moved.get("_target_")
    if isinstance(target, str):
        moved["_target_"] = relocated.new_name(target)
    return moved


# Keys whose null means "as the data says" (an image folder's class count).
INFERRED = ("data.num_classes", "model.num_classes")


def fill_declared(cfg: DictConfig) -> None:
    """Give a config recorded before some keys existed their declared (old behaviour) values."""
    for key, value in DECLARED.items():
        section, name = key.rsplit(".", 1)
        node = OmegaConf.select(cfg, section)
        if node is not None and (name not in node or OmegaConf.is_missing(node, name)):
            node[name] = value


def find(resume: str, checkpointer: Checkpointer) -> dict[str, Any] | None:
    """The state to continue from: `auto` (this run folder's newest good one), `never`, a path."""
    if resume == "never":
        return None
    skipped: list[str] = []
    if resume == "auto":
        found = checkpointer.latest_good(skipped)
        if found is None:
            return None
        path, state = found
    else:
        path = Path(resume).expanduser()
        state = checkpoint.load(path)
    state["loaded_from"] = str(path)  # logged once the run goes on (a no-op rerun logs nothing)
    state["skipped"] = skipped  # damaged newer checkpoints, for the attempt's record
    return state


def provenance(state: dict[str, Any] | None, run_dir: Path) -> dict[str, Any]:
    """What an attempt's record says of its start: the checkpoint it resumed from (relative to
    the run folder when inside it) and the damaged ones it passed over."""
    if state is None:
        return {"resumed_from": None, "skipped_checkpoints": []}
    loaded = Path(state["loaded_from"])
    inside = loaded.absolute().is_relative_to(run_dir.absolute())
    shown = str(loaded.absolute().relative_to(run_dir.absolute())) if inside else str(loaded)
    return {"resumed_from": shown, "skipped_checkpoints": state["skipped"]}


def check_seed(state: dict[str, Any], seed_cfg: DictConfig) -> None:
    """A fixed seed asked for must be the one the checkpoint was trained with (seed=random
    takes the checkpoint's drawn seed)."""
    trained_with = state["root_seed"]
    if seed_cfg.mode == "fixed" and seed_cfg.value != trained_with:
        raise CheckpointError(
            f"seed={seed_cfg.value} was asked, but this run folder's checkpoint was trained with "
            f"seed={trained_with}: use a new run folder for seed {seed_cfg.value}, or ask for "
            f"seed={trained_with} to continue this run"
        )


def check_length(state: dict[str, Any], total_steps: int) -> int:
    """The checkpoint's step; a config that would end before it is refused."""
    done = int(state["position"]["step"])
    if done > total_steps:
        raise CheckpointError(
            f"this run folder already holds {done} steps, and the config asks for {total_steps} "
            "(trainer.epochs, trainer.max_steps): a run cannot be shortened; train the shorter "
            "run in a new folder"
        )
    return done


def check_compatible(state: dict[str, Any], cfg: DictConfig, resolved: dict[str, str]) -> None:
    """Refuse to resume under a config that differs in anything that changes results, or on
    a machine where the same config resolves otherwise (`amp=auto`, `trainer.device=auto`)."""
    classes = len(state["classes"]) if state.get("classes") else None
    _check_config(state["config"], cfg, classes)
    changed = [key for key in sorted(resolved) if state["resolved"].get(key) != resolved[key]]
    if changed:
        shown = "; ".join(f"{k}: {state['resolved'].get(k)!r} -> {resolved[k]!r}" for k in changed)
        raise CheckpointError(
            f"this machine resolves the same config differently from the checkpoint's ({shown}); "
            "resuming would change precision or device mid-run: resume where it was trained, "
            "or name the setting (e.g. amp=bf16, trainer.device=cuda) in a new run folder"
        )


def _check_config(saved: dict[str, Any], cfg: DictConfig, classes: int | None) -> None:
    now = DECLARED | schema.flatten(OmegaConf.to_container(cfg, resolve=True))
    before = DECLARED | schema.flatten(upgrade(saved))
    # Left to the data (null) now, stored as the count it inferred by a checkpoint written
    # before inferred values stayed out of the config: the same request.
    for key in INFERRED:
        if now.get(key, 0) is None and before.get(key) == classes:
            now[key] = classes
    may_change = (*MAY_CHANGE, *datasets.settings_that_may_change(cfg.data))
    differing = sorted(
        key
        for key in now.keys() | before.keys()
        if now.get(key) != before.get(key) and not key.startswith(may_change)
    )
    if differing:
        shown = "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in differing[:8])
        raise CheckpointError(
            f"the config differs from the checkpoint's in {len(differing)} key(s) that change "
            f"results ({shown}); use a new run folder, or set them back"
        )


def check_same_data(state: dict[str, Any], data: Splits, root: Any) -> None:
    """The data a run resumes on must be what its checkpoint trained on: the same classes in
    the same order, and as many images in every split."""
    check_same_classes(state, data.classes, root, "resuming would train another problem")
    recorded = state.get("split_sizes") or {}
    now = split_sizes(data)
    changed = [f"{split} {recorded[split]} -> {now[split]}" for split in now
               if split in recorded and recorded[split] != now[split]]  # fmt: skip
    if changed:
        raise CheckpointError(
            f"data.root={root}: the data's splits changed since this run folder's checkpoint "
            f"({', '.join(changed)} images); resuming would not continue the same run: put the "
            "data back as it was, or train the new data in a new run folder"
        )
    before, digests = state.get("split_digests") or {}, split_digests(data)
    changed = [split for split in digests if split in before and before[split] != digests[split]]
    if changed:
        raise CheckpointError(
            f"data.root={root}: the data's {', '.join(changed)} changed since this run folder's "
            "checkpoint (its manifest is another); resuming would not continue the same run: "
            "put the data back as it was, or train the new data in a new run folder"
        )


def check_same_classes(state: dict[str, Any], classes: list[str], root: Any, why: str) -> None:
    """The data's classes are the ones the checkpoint's model was trained on, in its order."""
    trained_on = state.get("classes")
    if trained_on is not None and list(trained_on) != list(classes):
        raise CheckpointError(
            f"data.root={root}: the data has the classes {_listed(classes)}, but the checkpoint "
            f"was trained on {_listed(trained_on)}; {why}: point data.root at the data it was "
            "trained on, or put that data back as it was"
        )


def split_sizes(data: Splits) -> dict[str, int]:
    """How many images each split holds: stored in checkpoints for `check_same_data`."""
    return {"train": len(data.train), "val": len(data.val), "test": len(data.test)}


def split_digests(data: Splits) -> dict[str, str]:
    """The digests of the splits whose source names its contents cheaply (`digest()`: a
    sharded dataset's manifest), stored in checkpoints for `check_same_data`."""
    named = {split: getattr(getattr(data, split), "digest", None) for split in split_sizes(data)}
    return {split: digest() for split, digest in named.items() if callable(digest)}


def _listed(classes: Any) -> str:
    names = [str(name) for name in classes]
    shown = ", ".join(names[:6]) + (f", ... ({len(names)} in all)" if len(names) > 6 else "")
    return f"[{shown}]"
