"""Files from others, fuzzed: harmful targets, interpolations, Hydra overrides, symlinks and junk
placed at random in a real run folder, sweep folder and checkpoint, and every entry point that
reads them run on the result. Whatever a case draws, no marker file is created, nothing outside
the case's own folder changes, and a refusal is one line on stderr, never a traceback.

Each case is drawn from `random.Random(seed)`; its pytest id (`0017-run_overrides`) names the seed
and the kind of its first payload, so `-k 0017-` replays it. A case copies the module's base
material (a killed run, a sweep with one job complete and one killed, their checkpoints) into its
own folder beside an `outside/` folder that stands for the rest of the machine: the payloads
point into it (symlinks, paths, a marker to create, decoy code and config to load), and it is
compared, names, bytes and times, before and after each entry point. `test_fuzz_fast` (50
cases) runs in `make test`, `test_fuzz_many` (500) in `make test-all`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pickle
import random
import shutil
import signal
import stat
import subprocess
import sys
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from hydra.utils import instantiate

from repro import evaluate, predict, report
from repro.core.runs import checkpoint
from repro.export import command as export
from repro.resume import command as resume
from repro.verify import command as verify

from conftest import ROOT, TINY, make_image_tree, run_cli

# The run: killed (SIGKILL) after step 3 of 4, with a checkpoint at step 2, so a resume or a
# training into its folder really relaunches. The sweep: job 0 trains 2 steps and completes,
# job 1 is killed like the run.
RUN = [o for o in TINY if not o.startswith("trainer.epochs=")] + [
    "trainer.num_threads=1",
    "trainer.checkpoint_every_steps=2",
    "trainer.max_steps=4",
]
SWEEP = [o for o in RUN if not o.startswith("trainer.max_steps=")] + ["trainer.max_steps=2,4"]
KILL = {"REPRO_FAULT": "step:3"}

FAST_CASES = 50
MANY_CASES = 500
ENTRY_TIMEOUT_S = 300  # an entry point that hangs is a failure of its case, not of the suite
EXPENSIVE = ("train", "resume:run", "resume:sweep")  # each launches `python -m repro.train`


# -- the world a case lives in --------------------------------------------------------------


@dataclass
class Case:
    seed: int
    root: Path
    run: Path  # a copy of the base run (killed after its step-2 checkpoint)
    sweep: Path  # a copy of the base sweep (job 0 complete, job 1 killed)
    images: Path  # the base's images, for predict (only read)
    outside: Path  # the rest of the machine: nothing in it may change
    rng: random.Random
    payloads: list[str] = field(default_factory=list)
    entries: list[set[str]] = field(default_factory=list)  # each payload's entry points
    links: int = 0
    primary: int = 0  # the index in `entries` of the first payload's, the one its id names

    @property
    def marker(self) -> Path:
        return self.outside / "pwned"

    @property
    def ckpt(self) -> Path:
        return self.run / "checkpoints" / "last.pt"

    def note(self, description: str, *entries: str) -> None:
        self.payloads.append(description)
        self.entries.append(set(entries))


def plant_decoys(outside: Path, marker: Path) -> None:
    """What a payload can point at in `outside`: a `repro` package whose `train` creates the
    marker (for a working directory moved there), configs that install a Hydra callback which
    creates it (for a search path or config dir moved there), and a pickle that creates it when
    loaded (for `--experimental-rerun`)."""
    (outside / "repro").mkdir(parents=True)
    (outside / "repro" / "__init__.py").write_text("")
    (outside / "repro" / "train.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    callback = {"fuzz": {"_target_": "pathlib.Path.touch", "_args_": [str(marker)]}}
    (outside / "conf" / "evil").mkdir(parents=True)
    group = "# @package _global_\n" + yaml.safe_dump({"hydra": {"callbacks": callback}})
    (outside / "conf" / "evil" / "x.yaml").write_text(group)
    primary = {"defaults": ["config", "_self_"], "hydra": {"callbacks": callback}}
    (outside / "conf" / "evil.yaml").write_text(yaml.safe_dump(primary))
    (outside / "evil.pickle").write_bytes(pickle.dumps(_Touch(str(marker))))


class _Touch:
    """Unpickled, runs `touch MARKER`."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def marker_made(marker: Path) -> list[Path]:
    """The marker, or a file named after it (numpy.save adds .npy), link or not."""
    return [p for p in marker.parent.iterdir() if p.name.startswith(marker.name)]


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every entry under `folder` (links not followed): a file's bytes and times, a folder's
    times (an entry made and removed again shows), a link's target."""
    found: dict[str, tuple] = {".": ("dir", folder.stat().st_mtime_ns)}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in sorted(dirnames + filenames):
            path = Path(dirpath) / name
            info = path.lstat()
            key = str(path.relative_to(folder))
            if stat.S_ISLNK(info.st_mode):
                found[key] = ("link", os.readlink(path))
            elif stat.S_ISDIR(info.st_mode):
                found[key] = ("dir", info.st_mtime_ns)
            else:
                digest = hashlib.sha256(path.read_bytes()).hexdigest()[:16]
                found[key] = ("file", digest, info.st_size, info.st_mtime_ns)
    return found


def differences(before: dict[str, tuple], after: dict[str, tuple]) -> str:
    added = sorted(after.keys() - before.keys())
    removed = sorted(before.keys() - after.keys())
    changed = sorted(k for k in before.keys() & after.keys() if before[k] != after[k])
    # A folder whose times alone changed: an entry was made in it and removed again.
    touched = [k for k in changed if before[k][0] == after[k][0] == "dir"]
    changed = [k for k in changed if k not in touched]
    parts = [f"{what} {names[:6]}{' ...' if len(names) > 6 else ''}"
             for what, names in (("added", added), ("removed", removed), ("changed", changed),
                                 ("written in (an entry made or removed)", touched))
             if names]  # fmt: skip
    return "; ".join(parts)


# -- reading and rewriting the records --------------------------------------------------------


def edit_checkpoints(folder: Path, edit: Callable[[dict], None]) -> None:
    """Apply `edit` to the state of every checkpoint in `folder`, written back with its digest
    intact (as a maker of a crafted checkpoint would)."""
    for path in sorted(folder.glob("*.pt")):
        state = checkpoint.load(path)  # plain values and tensors
        edit(state)
        path.unlink()  # last.pt may be a hard link to a step file: a new file
        checkpoint.atomic_save(state, path)


def edit_yaml(path: Path, edit: Callable[[Any], Any]) -> None:
    data = yaml.safe_load(path.read_text())
    changed = edit(data)
    path.write_text(yaml.safe_dump(data if changed is None else changed, sort_keys=False))


def read_attempts(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line]


def write_attempts(path: Path, attempts: list[dict]) -> None:
    path.write_text("".join(json.dumps(a) + "\n" for a in attempts))


def dict_nodes(value: Any) -> Iterator[dict]:
    if isinstance(value, dict):
        yield value
        for item in value.values():
            yield from dict_nodes(item)
    elif isinstance(value, list):
        for item in value:
            yield from dict_nodes(item)


def leaves(value: Any) -> Iterator[tuple[Any, Any]]:
    """(container, key or index) of every scalar inside nested dicts and lists."""
    items = value.items() if isinstance(value, dict) else enumerate(value)
    for key, item in items:
        if isinstance(item, dict | list):
            yield from leaves(item)
        else:
            yield value, key


def sync_sweep_jobs(sweep: Path, recorded: dict) -> None:
    """Rewrite each job's .hydra/overrides.yaml as the basic sweeper expands `recorded` (the
    hydra node of multirun.yaml): a maker of a crafted sweep keeps its files consistent."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    params = [f"{k}={v}" for k, v in (recorded["sweeper"].get("params") or {}).items()]
    try:
        parsed = OverridesParser.create().parse_overrides([*params, *recorded["overrides"]["task"]])
        (grid,) = BasicSweeper.split_arguments(parsed, None)
    except Exception:  # not Hydra's grammar: resume cannot expand it either
        return
    for job in sweep.glob("*/.hydra/hydra.yaml"):
        num = yaml.safe_load(job.read_text())["hydra"]["job"]["num"]
        if num < len(grid):
            job.with_name("overrides.yaml").write_text(yaml.safe_dump(grid[num]))


# -- payloads -------------------------------------------------------------------------------


def harmful_node(case: Case) -> dict[str, Any]:
    return case.rng.choice(harmful_nodes(case.marker, case.outside))


def harmful_nodes(marker: Path, outside: Path) -> list[dict[str, Any]]:
    """`_target_` nodes that create the marker (or a file beside it) when Hydra instantiates
    them, and, in NOT_LIVE, some that only name what no stored config should build (this
    Hydra's own target policy blocks os.system, subprocess, exec and the like, or they do
    nothing here): see test_the_payloads_are_live."""
    m = str(marker)
    touch = {"_target_": "pathlib.Path.touch", "_args_": [m]}
    return [
        touch,
        {"_target_": "pathlib.Path.mkdir", "_args_": [m]},
        {"_target_": "pathlib.Path.symlink_to", "_args_": [m, str(ROOT)]},
        {"_target_": "builtins.open", "_args_": [m, "w"]},
        {"_target_": "io.open", "_args_": [m, "w"]},
        {"_target_": "os.makedirs", "_args_": [m]},
        {"_target_": "logging.FileHandler", "_args_": [m]},
        {"_target_": "shutil.copyfile", "_args_": [str(ROOT / "README.md"), m]},
        {"_target_": "shutil.copytree", "_args_": [str(ROOT / "conf"), m]},
        {"_target_": "torch.save", "_args_": [{}, m]},
        {"_target_": "numpy.save", "_args_": [m, [1]]},
        {"_target_": "zipfile.ZipFile", "_args_": [m, "w"]},
        {"_target_": "repro.extras.models.small_cnn.SmallCNN", "num_classes": 10, "widths": touch},
        {"_target_": "torch.optim.SGD", "params": touch, "lr": 0.1},
        # names only
        {"_target_": "os.system", "_args_": [f"touch {m}"]},
        {"_target_": "subprocess.run", "_args_": [["touch", m]]},
        {"_target_": "builtins.exec", "_args_": [f"open({m!r}, 'w').close()"]},
        {"_target_": "asyncio.create_subprocess_shell", "_args_": [f"touch {m}"]},
        {"_target_": "hydra.utils.call", "config": {"_target_": "os.system", "_args_": [m]}},
        {"_target_": "pathlib.Path.write_text", "_args_": [m, "written"]},
        {"_target_": "torch.hub.load", "_args_": [str(outside), "x"], "source": "local"},
        {"_target_": "importlib.import_module", "_args_": ["repro"]},
    ]


NOT_LIVE = {
    "os.system", "subprocess.run", "builtins.exec", "asyncio.create_subprocess_shell",
    "hydra.utils.call", "pathlib.Path.write_text", "torch.hub.load", "importlib.import_module",
}  # fmt: skip


def interpolation(case: Case) -> str:
    o, m = case.outside, case.marker
    return case.rng.choice(
        [
            "${oc.env:HOME}",
            "x${oc.env:HOME}y",
            "${oc.env:PATH,none}",
            f"${{record_subdir:{o}/claimed}}",  # a custom resolver that claims a folder
            f"prefix ${{record_subdir:{o}/claimed}} suffix",
            "${run_id:}",
            "${run_stamp:}",
            "${now:%Y-%m-%d}",
            "${hydra:runtime.cwd}",
            f"${{oc.create:{{_target_: pathlib.Path.touch, _args_: ['{m}']}}}}",
            "${oc.decode:'{a: 1}'}",
            "${..model}",
            "${model}",
            "${oc.select:data.root,/tmp}",
        ]
    )


PLACES = (
    "model", "model.sub", "optimizer", "scheduler", "objective", "data", "augment.transforms",
    "callbacks", "components", "metrics", "logger", "trainer", "new key", "random node",
)  # fmt: skip


def place_node(config: dict, node: dict, rng: random.Random) -> str:
    """Put `node` at a place of `config` drawn by `rng`; says where and how."""
    place = rng.choice(PLACES)
    if place == "model.sub":
        key = rng.choice(["widths", "block", "head", "dropout"])
        config.setdefault("model", {})[key] = node
        return f"model.{key}"
    if place == "augment.transforms":
        transforms = config.setdefault("augment", {}).setdefault("transforms", [])
        if rng.random() < 0.5:
            transforms.append({"_target_": "torchvision.transforms.v2.RandomHorizontalFlip"})
        index = rng.randint(0, len(transforms))
        transforms.insert(index, node)
        return f"augment.transforms[{index}]"
    if place in ("callbacks", "components", "metrics"):
        name = rng.choice(["fuzz", "ema", "top5"])
        if not isinstance(config.get(place), dict):
            config[place] = {}
        config[place][name] = node
        return f"{place}.{name}"
    if place == "logger":
        key = rng.choice(["mlflow", "wandb", "fuzz"])
        config.setdefault("logger", {})[key] = node
        return f"logger.{key}"
    if place == "new key":
        key = rng.choice(["fuzz", "hydra", "plugins", "setup"])
        config[key] = node
        return key
    if place == "random node":
        nodes = list(dict_nodes(config))
        target = rng.choice(nodes)
        key = rng.choice([*target.keys(), "fuzz"]) if target else "fuzz"
        target[key] = node
        return f"<random node {nodes.index(target)}>.{key}"
    merge = rng.random() < 0.4 and isinstance(config.get(place), dict)
    config[place] = {**config[place], **node} if merge else node
    return f"{place} ({'merged into it' if merge else 'replaced'})"


def place_harmful(case: Case, config: dict) -> str:
    node = harmful_node(case)
    return f"{place_node(config, node, case.rng)} = {node}"


def interpolate_leaf(case: Case, config: dict) -> str:
    """An interpolation at a random leaf, or as a `_target_`."""
    rng = case.rng
    value = interpolation(case)
    container, key = rng.choice(list(leaves(config)))
    if rng.random() < 0.2:  # a target that only an interpolation names
        container, key = rng.choice([n for n in dict_nodes(config) if "_target_" in n]), "_target_"
    container[key] = value
    return f"{key}={value!r} (a leaf)"


def poison_config(case: Case, config: dict) -> str:
    """A harmful node or an interpolation at a random place of a stored config."""
    return (place_harmful if case.rng.random() < 0.6 else interpolate_leaf)(case, config)


def send_outside(case: Case, config: dict) -> str:
    """Values that would send metrics or write data outside: a tracker, a download."""
    o = case.outside
    choice = case.rng.randrange(4)
    logger = config.setdefault("logger", {})
    if choice == 0:
        logger["mlflow"] = {"tracking_uri": f"file://{o}/mlruns", "experiment": "fuzz"}
        return f"logger.mlflow.tracking_uri=file://{o}/mlruns"
    if choice == 1:
        logger["mlflow"] = {"tracking_uri": f"{o}/store", "experiment": "fuzz"}
        return f"logger.mlflow.tracking_uri={o}/store"
    data = config.setdefault("data", {})
    if choice == 2:
        data.update(download=True, root=f"{o}/data")
        return f"data.download=true data.root={o}/data"
    cifar = yaml.safe_load((ROOT / "conf" / "data" / "cifar10.yaml").read_text())
    config["data"] = {**cifar, "download": True, "root": f"{o}/cifar"}
    return f"data=cifar10 data.download=true data.root={o}/cifar"


def stored_config_payload(case: Case, kind: str) -> None:
    """kind ckpt_target / ckpt_interp / ckpt_send: a checkpoint's stored config (the run's
    last.pt and its step file, the same payload in each)."""
    rng = case.rng
    make = {
        "ckpt_target": place_harmful,
        "ckpt_interp": interpolate_leaf,
        "ckpt_send": send_outside,
    }[kind]
    seed = rng.random()
    said: list[str] = []

    def edit(state: dict) -> None:
        case.rng = random.Random(seed)
        said.append(make(case, state["config"]))

    edit_checkpoints(case.run / "checkpoints", edit)
    case.rng = rng
    entries = ["evaluate", "predict", "export"]
    if rng.random() < 0.5:  # training in the run's folder restores from it
        entries += ["resume:run", "train"]
    case.note(f"checkpoint config: {said[0]}", *entries)


def record_payload(case: Case) -> None:
    """kind record: a harmful node, an interpolation or a sending value in a recorded config
    of a run or sweep folder."""
    rng = case.rng
    where = rng.choices(
        ["run resolved", "job resolved", "run .hydra", "job .hydra", "multirun"],
        weights=[4, 2, 1, 1, 1],
    )[0]
    path, entries = {
        "run resolved": (case.run / "resolved_config.yaml", ["verify:run"]),
        "job resolved": (case.sweep / "0" / "resolved_config.yaml", ["verify:job"]),
        "run .hydra": (case.run / ".hydra" / "config.yaml", ["resume:run", "verify:run"]),
        "job .hydra": (case.sweep / "1" / ".hydra" / "config.yaml", ["resume:sweep", "report"]),
        "multirun": (case.sweep / "multirun.yaml", ["resume:sweep", "report"]),
    }[where]
    said: list[str] = []
    send = rng.random() < 0.3
    edit_yaml(
        path, lambda c: said.append(send_outside(case, c) if send else poison_config(case, c))
    )
    case.note(f"{path.relative_to(case.root)}: {said[0]}", *entries)


def override_payloads(case: Case) -> dict[str, list[str]]:
    o, m = case.outside, case.marker
    return {
        "hydra callback (shell)": [
            "+hydra.callbacks.fuzz._target_=os.system",
            f"+hydra.callbacks.fuzz._args_=['touch {m}']",
        ],
        "hydra callback (a log file)": [
            "+hydra.callbacks.fuzz._target_=logging.FileHandler",
            f"+hydra.callbacks.fuzz._args_=['{m}']",
        ],
        "hydra logging handler": [
            "+hydra.job_logging.handlers.fuzz.class=logging.FileHandler",
            f"+hydra.job_logging.handlers.fuzz.filename='{m}'",
        ],
        "hydra callback (touch)": [
            "+hydra.callbacks.fuzz._target_=pathlib.Path.touch",
            f"+hydra.callbacks.fuzz._args_=['{m}']",
        ],
        "hydra callback (asyncio)": [
            "+hydra.callbacks.fuzz._target_=asyncio.create_subprocess_shell",
            f"+hydra.callbacks.fuzz.cmd='touch {m}'",
        ],
        "search path and a group from it": [f"hydra.searchpath=['file://{o}/conf']", "+evil=x"],
        "config dir and name": [f"--config-dir={o}/conf", "--config-name=evil"],
        "experimental rerun (a pickle)": [f"--experimental-rerun={o}/evil.pickle"],
        "job env_set": [
            f"++hydra.job.env_set.MLFLOW_TRACKING_URI=file://{o}/mlruns",
            "logger=mlflow",
        ],
        "launcher": [
            "hydra/launcher=submitit_local",
            f"hydra.launcher.submitit_folder='{o}/submitit'",
        ],
        "sweeper search space": [
            "hydra/sweeper=optuna",
            "hydra.sweeper.custom_search_space=os.system",
        ],
        "output subdir": [f"hydra.output_subdir='{o}/hydra_out'"],
        "sweep subdir": [f"hydra.sweep.subdir='{o}/job'"],
        "log file": [f"hydra.job_logging.handlers.file.filename='{o}/train.log'"],
        "run and sweep dir": [f"++hydra.run.dir='{o}/run'", f"++hydra.sweep.dir='{o}/sweep'"],
        "task callback": [
            "+callbacks.fuzz._target_=pathlib.Path.touch",
            f"+callbacks.fuzz._args_=['{m}']",
        ],
        "task component": [
            "+components.fuzz._target_=builtins.open",
            f"+components.fuzz._args_=['{m}',w]",
        ],
        "task model": ["model._target_=pathlib.Path.touch", f"+model._args_=['{m}']"],
        "task tracker": ["logger=mlflow", f"logger.mlflow.tracking_uri='file://{o}/store'"],
        "task download": ["data.download=true", f"data.root='{o}/d'"],
        "task download (cifar10)": ["data=cifar10", "data.download=true", f"data.root='{o}/d'"],
        "task resolver": [f"trainer.tta='${{record_subdir:{o}/claimed}}'"],
        "task env interpolation": ["trainer.tta=${oc.env:HOME}"],
        "group into hydra's package": [f"+model@hydra.callbacks=../../../../../..{o}/conf/evil"],
        "timm weights from a chosen url": [
            "model=timm",
            "model.pretrained=true",
            f"+model.cache_dir='{o}/cache'",
            "+model.pretrained_cfg_overlay={url:'file:///etc/hostname',hf_hub_id:null}",
        ],
    }


def hydra_fields(case: Case, hydra: dict) -> str:
    """Edit what a relaunch takes from the record besides its overrides."""
    o = case.outside
    choice = case.rng.randrange(4)
    if choice == 0:
        hydra["runtime"]["cwd"] = str(o)  # holds a repro/train.py that creates the marker
        return f"hydra.runtime.cwd={o}"
    if choice == 1:  # (hydra.searchpath does not reach the primary config; --config-dir does)
        hydra["job"]["config_name"] = "evil"
        hydra["overrides"]["hydra"].append(f"--config-dir={o}/conf")
        return f"hydra.job.config_name=evil, --config-dir={o}/conf in overrides.hydra"
    if choice == 2:
        hydra["job"]["config_name"] = "bench"
        return "hydra.job.config_name=bench"
    hydra["overrides"]["hydra"].append(f"hydra.runtime.cwd={o}")
    return f"hydra.runtime.cwd={o} as an override"


def run_overrides_payload(case: Case) -> None:
    """kind run_overrides: what `repro.resume RUN` relaunches."""
    rng = case.rng
    record = case.run / ".hydra" / "hydra.yaml"
    if rng.random() < 0.25:
        said: list[str] = []
        edit_yaml(record, lambda d: said.append(hydra_fields(case, d["hydra"])))
        case.note(f".hydra/hydra.yaml: {said[0]}", "resume:run")
        return
    name, overrides = rng.choice(sorted(override_payloads(case).items()))
    where = rng.choice(["attempts.jsonl", "hydra.yaml hydra", "hydra.yaml task"])
    if where == "attempts.jsonl":
        attempts = read_attempts(case.run / "attempts.jsonl")
        attempts[-1]["overrides"] = attempts[-1]["overrides"] + overrides
        write_attempts(case.run / "attempts.jsonl", attempts)
    else:
        which = where.split()[-1]
        edit_yaml(record, lambda d: d["hydra"]["overrides"][which].extend(overrides))
        if which == "task":  # what a run made before attempts.jsonl existed relaunches
            (case.run / "attempts.jsonl").unlink()
    case.note(f"{name} in {where}: {overrides}", "resume:run")


def sweep_overrides_payload(case: Case) -> None:
    """kind sweep_overrides: what `repro.resume SWEEP` relaunches, the jobs' records kept
    consistent with it."""
    rng = case.rng
    record = case.sweep / "multirun.yaml"
    recorded = yaml.safe_load(record.read_text())
    hydra = recorded["hydra"]
    if rng.random() < 0.25:
        said = f"multirun.yaml: {hydra_fields(case, hydra)}"
    else:
        name, overrides = rng.choice(sorted(override_payloads(case).items()))
        where = rng.choice(["hydra", "task", "sweeper.params"])
        if where == "sweeper.params" and all(o.partition("=")[1] for o in overrides):
            params = hydra["sweeper"].get("params") or {}
            params.update(o.split("=", 1) for o in overrides)
            hydra["sweeper"]["params"] = params
        else:
            where = "task" if where == "sweeper.params" else where
            hydra["overrides"][where].extend(overrides)
        said = f"{name} in multirun.yaml {where}: {overrides}"
    record.write_text(yaml.safe_dump(recorded, sort_keys=False))
    sync_sweep_jobs(case.sweep, hydra)
    case.note(said, "resume:sweep", "report")


RUN_LINKABLE = (
    "run.lock", ".attempts.reserve", "train.log", "metrics.csv", "fingerprints.csv",
    "attempts.jsonl", "summary.json", "attempts", ".hydra", "checkpoints",
    "checkpoints/last.pt", "checkpoints/step-00000002.pt", "resolved_config.yaml",
    "source.patch", "curves.png", "tb", "error.txt", ".hydra/hydra.yaml",
)  # fmt: skip
SWEEP_LINKABLE = (
    "0", "1", "multirun.yaml", "1/run.lock", "1/.attempts.reserve", "1/train.log",
    "1/attempts.jsonl", "1/fingerprints.csv", "1/checkpoints", "1/checkpoints/last.pt",
    "1/metrics.csv", "1/summary.json", "1/.hydra", "0/summary.json", "0/metrics.csv",
    "sweep_summary.json", "sweep_summary.md", "sweep_summary.csv", "sweep.png",
)  # fmt: skip
FOLDERS = {"attempts", ".hydra", "checkpoints", "tb", "0", "1", "1/checkpoints", "1/.hydra"}


def link_out(case: Case, path: Path, folder: bool) -> str:
    """Replace `path` by a symlink into outside/: to a copy of what was there (a link that
    works), to a new empty file or folder, or to nothing yet."""
    case.links += 1
    target = case.outside / f"linked-{case.links}-{path.name.lstrip('.')}"
    if case.rng.random() < 0.2 or not (path.exists() or folder):
        how = "to nothing yet"  # a file the run has not written yet: a dangling link
    elif path.is_dir():
        shutil.copytree(path, target, symlinks=True)
        how = "to a copy"
    elif path.exists():
        shutil.copy2(path, target)
        how = "to a copy"
    else:
        target.mkdir()
        how = "to an empty folder"
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to(target, target_is_directory=folder)
    return f"{path.relative_to(case.root)} -> {target.relative_to(case.root)} ({how})"


def run_symlink_payload(case: Case) -> None:
    name = case.rng.choice(RUN_LINKABLE)
    said = link_out(case, case.run / name, name in FOLDERS)
    case.note(f"symlink {said}", "train", "resume:run", "verify:run", "evaluate")


def sweep_symlink_payload(case: Case) -> None:
    name = case.rng.choice(SWEEP_LINKABLE)
    said = link_out(case, case.sweep / name, name in FOLDERS)
    case.note(f"symlink {said}", "resume:sweep", "report")


def junk_payload(case: Case) -> None:
    """kind junk: records that are not what their writer writes: one line, no traceback."""
    rng, run, sweep = case.rng, case.run, case.sweep

    def attempts_edit(edit: Callable[[dict], None]) -> Callable[[], None]:
        def apply() -> None:
            attempts = read_attempts(run / "attempts.jsonl")
            edit(attempts[-1])
            write_attempts(run / "attempts.jsonl", attempts)

        return apply

    def text(path: Path, content: str) -> Callable[[], None]:
        return lambda: path.write_text(content)

    def classes(state: dict) -> None:
        state["classes"] = [f"class\n{i}\x1b[31m" for i in range(10)]

    def job_named_oddly() -> None:
        shutil.copytree(sweep / "0", sweep / "odd\nname", symlinks=True)

    run_entries = ("resume:run", "verify:run", "evaluate")
    sweep_entries = ("resume:sweep", "report")
    junk = {
        "run summary.json not JSON": (text(run / "summary.json", "{not json"), run_entries),
        "run summary.json a list": (text(run / "summary.json", "[1, 2]"), run_entries),
        "run summary.json wrong types": (
            text(run / "summary.json", '{"completed": "no", "step": "x", "env": 3}'),
            run_entries,
        ),
        "attempts.jsonl junk line": (
            lambda: (run / "attempts.jsonl").write_text(
                (run / "attempts.jsonl").read_text() + "garbage\n"
            ),
            run_entries,
        ),
        "attempts overrides a string": (
            attempts_edit(lambda a: a.update(overrides="data.root=/x")),
            run_entries,
        ),
        "attempts overrides not strings": (
            attempts_edit(lambda a: a.update(overrides=[1, None, {"a": 1}])),
            run_entries,
        ),
        "attempts env a list": (attempts_edit(lambda a: a.update(env=[])), run_entries),
        "run hydra.yaml not YAML": (text(run / ".hydra" / "hydra.yaml", "a: [b\n"), run_entries),
        "run hydra.yaml a number": (text(run / ".hydra" / "hydra.yaml", "hydra: 3\n"), run_entries),
        "run resolved_config.yaml a list": (
            text(run / "resolved_config.yaml", "- a\n- b\n"),
            ("verify:run",),
        ),
        "run fingerprints.csv junk": (
            text(run / "fingerprints.csv", "step,loss\nx,y\n"),
            ("verify:run",),
        ),
        "multirun.yaml not YAML": (text(sweep / "multirun.yaml", "hydra: [\n"), sweep_entries),
        "multirun.yaml task a string": (
            lambda: edit_yaml(
                sweep / "multirun.yaml", lambda d: d["hydra"]["overrides"].update(task="x=1")
            ),
            sweep_entries,
        ),
        "job error.txt of many lines": (
            text(sweep / "1" / "error.txt", "line one\nline two\n\x1b[31mred\x1b[0m\n"),
            sweep_entries,
        ),
        "job summary.json not JSON": (text(sweep / "0" / "summary.json", "{"), sweep_entries),
        "job overrides.yaml a mapping": (
            text(sweep / "1" / ".hydra" / "overrides.yaml", "a: 1\n"),
            sweep_entries,
        ),
        "job hydra.yaml num a string": (
            lambda: edit_yaml(
                sweep / "1" / ".hydra" / "hydra.yaml", lambda d: d["hydra"]["job"].update(num="x")
            ),
            sweep_entries,
        ),
        "a job folder named with a newline": (job_named_oddly, sweep_entries),
        "checkpoint class names with newlines": (
            lambda: edit_checkpoints(run / "checkpoints", classes),
            ("evaluate", "predict", "export"),
        ),
        "checkpoint config a list": (
            lambda: edit_checkpoints(run / "checkpoints", lambda s: s.update(config=[1, 2])),
            ("evaluate", "predict", "export"),
        ),
        "checkpoint model config a string": (
            lambda: edit_checkpoints(
                run / "checkpoints", lambda s: s["config"].update(model="resnet")
            ),
            ("evaluate", "predict", "export"),
        ),
    }
    name = rng.choice(sorted(junk))
    apply, entries = junk[name]
    apply()
    case.note(f"junk: {name}", *entries)


SPECIAL_RUN = (
    "checkpoints/last.pt",
    "checkpoints/step-00000002.pt",
    "resolved_config.yaml",
    "attempts.jsonl",
    "metrics.csv",
    "fingerprints.csv",
    ".hydra/hydra.yaml",
    ".hydra/config.yaml",
    ".hydra/overrides.yaml",
    "train.log",
    "summary.json",
    "source.patch",
)
SPECIAL_SWEEP = (
    "multirun.yaml",
    "0/summary.json",
    "0/metrics.csv",
    "1/attempts.jsonl",
    "1/checkpoints/last.pt",
    "0/.hydra/hydra.yaml",
    "1/.hydra/overrides.yaml",
    "1/train.log",
)
RUN_ENTRIES = ("evaluate", "export", "verify:run", "resume:run", "train")
SWEEP_ENTRIES = ("report", "resume:sweep")


def special_file_payload(case: Case) -> None:
    """kind special: a file of the run or sweep made a FIFO, a link to a device that never
    ends, or a hard link to a file outside (a copy of what was there)."""
    rng = case.rng
    folder, name, entries = rng.choice(
        [
            (case.run, rng.choice(SPECIAL_RUN), RUN_ENTRIES),
            (case.sweep, rng.choice(SPECIAL_SWEEP), SWEEP_ENTRIES),
        ]
    )
    path = folder / name
    how = rng.choice(["a FIFO", "a link to /dev/zero", "a link to /dev/urandom", "a hard link"])
    case.links += 1
    if how == "a hard link":
        target = case.outside / f"hard-{case.links}-{path.name.lstrip('.')}"
        shutil.copy2(path, target) if path.is_file() else target.write_text("{}\n")
    path.unlink(missing_ok=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "a FIFO":
        os.mkfifo(path)
    elif how == "a hard link":
        os.link(target, path)
    else:
        path.symlink_to(how.rsplit(" ", 1)[-1])
    case.note(f"{path.relative_to(case.root)} made {how}", *entries)


def bomb_payload(case: Case) -> None:
    """kind bomb: a small file that asks for unbounded time or memory: shared references in a
    checkpoint, an alias bomb in a YAML record, JSON nested 100,000 deep."""
    rng = case.rng
    which = rng.choice(["shared references", "alias bomb", "deep JSON"])
    if which == "shared references":
        nested: list = []
        for _ in range(40):
            nested = [nested] * 4
        for path in sorted((case.run / "checkpoints").glob("*.pt")):
            state = torch.load(path, weights_only=True)
            state[rng.choice(["extra", "config"])] = {"model": nested}
            path.unlink()
            torch.save(state, path)  # no digest: computing one would walk the 4**40 values
        case.note(
            "checkpoints with shared references, 4**40 deep",
            "evaluate",
            "export",
            "predict",
            "resume:run",
        )
        return
    if which == "alias bomb":
        lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x]"]
        lines += [f"a{n}: &a{n} [" + ", ".join([f"*a{n - 1}"] * 9) + "]" for n in range(1, 12)]
        name, entries = rng.choice(
            [
                ("resolved_config.yaml", ("verify:run",)),
                (".hydra/hydra.yaml", ("resume:run",)),
                ("multirun.yaml", SWEEP_ENTRIES),
            ]
        )
        path = (case.sweep if name == "multirun.yaml" else case.run) / name
        path.write_text("\n".join(lines) + "\n")
        case.note(f"{path.relative_to(case.root)}: an alias bomb", *entries)
        return
    path, entries = rng.choice(
        [
            (case.run / "attempts.jsonl", RUN_ENTRIES),
            (case.sweep / "0" / "summary.json", SWEEP_ENTRIES),
        ]
    )
    path.write_text("[" * 100_000 + "]" * 100_000 + "\n")
    case.note(f"{path.relative_to(case.root)}: JSON nested 100,000 deep", *entries)


KINDS: dict[str, Callable[[Case], None]] = {
    "ckpt_target": lambda case: stored_config_payload(case, "ckpt_target"),
    "ckpt_interp": lambda case: stored_config_payload(case, "ckpt_interp"),
    "ckpt_send": lambda case: stored_config_payload(case, "ckpt_send"),
    "record": record_payload,
    "run_overrides": run_overrides_payload,
    "sweep_overrides": sweep_overrides_payload,
    "run_symlink": run_symlink_payload,
    "sweep_symlink": sweep_symlink_payload,
    "junk": junk_payload,
    "special": special_file_payload,
    "bomb": bomb_payload,
}
APPLY_ORDER = {"junk": 1, "bomb": 1, "run_symlink": 2, "sweep_symlink": 2, "special": 2}
RELAUNCHED = ("run_overrides", "sweep_overrides", "run_symlink", "sweep_symlink", "junk", "special")


def kind_of(seed: int) -> str:
    return list(KINDS)[seed % len(KINDS)]


def case_id(seed: int) -> str:
    return f"{seed:04d}-{kind_of(seed)}"


# -- entry points ---------------------------------------------------------------------------


@dataclass
class Outcome:
    entry: str
    command: str
    code: int | str
    out: str
    err: str


class EntryTimeoutError(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum, frame):
        raise EntryTimeoutError(f"no answer within {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def in_process(main: Callable[[list[str]], None], argv: list[str]) -> tuple[Any, str]:
    """`main(argv)` as `python -m` runs it: its exit code, and the traceback of an exception
    that escaped (a user would see it)."""
    escaped = ""
    try:
        with time_limit(ENTRY_TIMEOUT_S):
            main(argv)
        code: Any = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
        if isinstance(done.code, str):
            sys.stderr.write(done.code + "\n")
    except BaseException:  # whatever escapes is what a user would see
        code, escaped = "exception", traceback.format_exc()
    return code, escaped


def run_entry(case: Case, entry: str, capfd) -> Outcome:
    """Run one entry point on the case's files; output captured at the file descriptors, so
    the `python -m repro.train` a resume launches is captured too."""
    work = case.root / "work"
    work.mkdir(exist_ok=True)
    n = len(list(work.iterdir()))
    fmt = case.rng.choice(["torchscript", "safetensors"])
    ckpt_arg = case.run if case.rng.random() < 0.25 else case.ckpt
    calls: dict[str, tuple[Callable[[list[str]], None], list[str]]] = {
        "evaluate": (evaluate.main, [f"ckpt={case.ckpt}"]),
        "predict": (
            predict.main,
            [f"ckpt={case.ckpt}", f"images={case.images}", f"out={work}/predictions-{n}.csv"],
        ),
        "export": (
            export.main,
            [f"ckpt={ckpt_arg}", f"format={fmt}", f"out={work}/model-{n}.{fmt}"],
        ),
        "verify:run": (verify.main, [str(case.run), "steps=1"]),
        "verify:job": (verify.main, [str(case.sweep / "0"), "steps=1"]),
        "resume:run": (resume.main, [str(case.run)]),
        "resume:sweep": (resume.main, [str(case.sweep)]),
        "report": (report.main, [str(case.sweep)]),
    }
    capfd.readouterr()
    if entry == "train":
        args = [f"hydra.run.dir={case.run}", *RUN]
        command = "python -m repro.train " + " ".join(args)
        try:
            done = run_cli("repro.train", *args, timeout=ENTRY_TIMEOUT_S)
            code, out, err = done.returncode, done.stdout, done.stderr
        except subprocess.TimeoutExpired as error:
            code, out, err = "timeout", str(error.stdout or ""), str(error.stderr or "")
        return Outcome(entry, command, code, out, err)
    main, argv = calls[entry]
    module = entry.split(":")[0]
    code, escaped = in_process(main, argv)
    out, err = capfd.readouterr()
    return Outcome(entry, f"python -m repro.{module} {' '.join(argv)}", code, out, err + escaped)


def judge(outcome: Outcome) -> list[str]:
    """What is wrong with how an entry point answered (the files are judged apart)."""
    wrong = []
    if "Traceback" in outcome.out + outcome.err:
        wrong.append("a traceback")
    if outcome.code != 0:
        lines = [line for line in outcome.err.splitlines() if line.strip()]
        if len(lines) != 1:
            wrong.append(f"exit {outcome.code} with {len(lines)} lines on stderr, not one")
    return wrong


def tail(text: str, lines: int = 6) -> str:
    """The last lines of `text`; of a traceback, the innermost frame in this project's code
    and the exception."""
    kept = [line for line in text.splitlines() if line.strip()]
    if "Traceback" in text:
        ours = [i for i, line in enumerate(kept) if "/repro/" in line and "File " in line]
        kept = (kept[ours[-1] : ours[-1] + 2] if ours else []) + kept[-2:]
    return "\n".join(f"      | {line[:300]}" for line in kept[-lines:])


# -- the cases ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def base(tmp_path_factory) -> dict[str, Any]:
    """A killed run, a sweep with one job complete and one killed, and a few images: made with
    the real command, once for the module."""
    root = tmp_path_factory.mktemp("fuzz-base")
    killed = run_cli("repro.train", *RUN, f"hydra.run.dir={root / 'run'}", env=KILL)
    assert killed.returncode == -9, killed.stderr[-3000:]
    swept = run_cli("repro.train", "-m", *SWEEP, f"hydra.sweep.dir={root / 'sweep'}", env=KILL)
    assert swept.returncode == -9, swept.stderr[-3000:]
    assert (root / "sweep" / "0" / "summary.json").is_file()
    assert (root / "sweep" / "1" / "checkpoints" / "last.pt").is_file()
    assert not (root / "run" / "summary.json").exists()
    make_image_tree(root / "images", 1, classes=("circle", "bar"), side=32)
    return {"root": root, "snapshot": snapshot(root)}


def isolate(monkeypatch, case: Case) -> None:
    """Nothing an entry point does reaches the network or a tracker's default store; relative
    paths land in the case's folder."""
    for name in ("MLFLOW_TRACKING_URI", "REPRO_FAULT", "REPRO_DATA", "NO_PROXY", "no_proxy",
                 "WANDB_API_KEY", "HYDRA_FULL_ERROR"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    for name in ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy"):
        monkeypatch.setenv(name, "http://127.0.0.1:9")  # nothing listens there
    monkeypatch.setenv("WANDB_MODE", "offline")
    (case.root / "cwd").mkdir()
    monkeypatch.chdir(case.root / "cwd")


def make_case(seed: int, base: dict[str, Any], folder: Path) -> Case:
    root = base["root"]
    case = Case(
        seed, folder, folder / "run", folder / "sweep", root / "images", folder / "outside",
        random.Random(seed),
    )  # fmt: skip
    shutil.copytree(root / "run", case.run, symlinks=True)
    shutil.copytree(root / "sweep", case.sweep, symlinks=True)
    plant_decoys(case.outside, case.marker)
    kinds = [kind_of(seed), *case.rng.choices(list(KINDS), k=case.rng.choice([0, 0, 1, 2]))]
    # Edits first, then junk, then links (an edit after them would fail or write through one).
    for index, kind in sorted(enumerate(kinds), key=lambda pair: APPLY_ORDER.get(pair[1], 0)):
        if index == 0:
            case.primary = len(case.entries)
        try:
            KINDS[kind](case)
        except Exception as error:  # an earlier payload left the file unreadable or gone
            case.note(f"{kind}: not applied ({type(error).__name__}: {error})".splitlines()[0])
    return case


def entry_points(case: Case, fast: bool) -> list[str]:
    """The entry points that read what the payloads changed. Fast (make test): those that run in
    this process, and at most one that launches a training, for the first payload only, and
    only where that is the point of its kind (a relaunch, a write through a symlink)."""
    chosen = set().union(*case.entries)
    if fast:
        chosen -= set(EXPENSIVE)
        expensive = sorted(case.entries[case.primary] & set(EXPENSIVE))
        if kind_of(case.seed) in RELAUNCHED and expensive:  # in turn over the kind's cases
            chosen.add(expensive[case.seed // len(KINDS) % len(expensive)])
    return sorted(chosen, key=ORDER.index)


ORDER = ("evaluate", "predict", "export", "verify:run", "verify:job", "report", *EXPENSIVE)


def fuzz(seed: int, base: dict[str, Any], tmp_path: Path, capfd, monkeypatch, fast: bool):
    case = make_case(seed, base, tmp_path / "case")
    isolate(monkeypatch, case)
    found: list[str] = []
    before = snapshot(case.outside)
    for entry in entry_points(case, fast):
        outcome = run_entry(case, entry, capfd)
        wrong = judge(outcome)
        if marker_made(case.marker):
            wrong.append("THE MARKER WAS CREATED")
        after = snapshot(case.outside)
        if after != before:
            wrong.append(f"outside/ changed: {differences(before, after)}")
        before = after
        now = snapshot(base["root"])
        if now != base["snapshot"]:
            wrong.append(f"the base folder changed: {differences(base['snapshot'], now)}")
            base["snapshot"] = now
        if wrong:
            found.append(
                f"  {outcome.command}\n    exit {outcome.code}: {'; '.join(wrong)}\n"
                f"    stderr:\n{tail(outcome.err)}\n    stdout:\n{tail(outcome.out, 3)}"
            )
    if found:
        payloads = "\n".join(f"  - {p}" for p in case.payloads)
        pytest.fail(
            f"case {case_id(seed)} (random.Random({seed})), payloads:\n{payloads}\n"
            + "\n".join(found),
            pytrace=False,
        )


@pytest.mark.parametrize("seed", [pytest.param(s, id=case_id(s)) for s in range(FAST_CASES)])
@pytest.mark.slow
def test_fuzz_fast(seed, base, tmp_path, capfd, monkeypatch):
    fuzz(seed, base, tmp_path, capfd, monkeypatch, fast=True)


@pytest.mark.slow
@pytest.mark.parametrize(
    "seed", [pytest.param(s, id=case_id(s)) for s in range(1000, 1000 + MANY_CASES)]
)
def test_fuzz_many(seed, base, tmp_path, capfd, monkeypatch):
    fuzz(seed, base, tmp_path, capfd, monkeypatch, fast=False)


# -- the fuzzer's own checks ----------------------------------------------------------------


def test_the_payloads_are_live(tmp_path):
    """A payload that could not create the marker would prove nothing: the targets (but the
    few that only name something to refuse), the pickle and the decoy package all do."""
    outside = tmp_path / "outside"
    marker = outside / "pwned"
    plant_decoys(outside, marker)
    for node in harmful_nodes(marker, outside):
        if node["_target_"] in NOT_LIVE:
            continue
        with contextlib.suppress(Exception):
            instantiate(node)
        made = marker_made(marker)
        assert len(made) == 1, node
        made = made[0]
        shutil.rmtree(made) if made.is_dir() and not made.is_symlink() else made.unlink()
    pickle.loads((outside / "evil.pickle").read_bytes())
    assert marker.exists()
    marker.unlink()
    # Live for any process with the working folder on its path (`python -m repro.X` re-runs
    # itself without it: tests/test_received_boundary.py), even before the checkout's src/.
    path = os.pathsep.join(filter(None, [str(ROOT / "src"), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    subprocess.run([sys.executable, "-c", "import repro.train"], cwd=outside, env=env, check=True)
    assert marker.exists()


@pytest.mark.slow
def test_a_case_is_drawn_the_same_every_time(base, tmp_path):
    """A failing case's id replays it: the same payloads, the same entry points."""
    drawn = []
    for attempt in ("a", "b"):
        case = make_case(17, base, tmp_path / attempt)
        payloads = [p.replace(str(case.root), "") for p in case.payloads]
        drawn.append((payloads, entry_points(case, fast=True), entry_points(case, fast=False)))
    assert drawn[0] == drawn[1]
