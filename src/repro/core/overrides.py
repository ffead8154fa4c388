"""What a recorded command line may relaunch: values, never code, settings or places.

`repro.resume` reruns the overrides a sweep or run folder recorded (`multirun.yaml`,
`.hydra/hydra.yaml`, attempts.jsonl), and the Optuna sweeper a killed trial's parameters
from its study's database: files that may come from someone else. Each override must be a
value of the run's own keys or an option name of a config group; of Hydra's settings only the
launcher's choice and its job count. Everything else is refused in one line, unless the user
says `trust=true` (docs/security.md). `checked_relaunch` is the whole command `repro.resume`
runs from a record (repro.train's own config, checked overrides, a hash seed Python takes);
`check_composes` composes it in this checkout before anything runs.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, NamedTuple

from repro.core.errors import DataError
from repro.core.runs import trust
from repro.core.runs.trust import UntrustedConfigError, interpolates

# Of Hydra's settings, a recorded command may choose the launcher among this checkout's
# options and how many jobs it runs at once; the rest is this checkout's.
HYDRA_ALLOWED = ("hydra/launcher", "hydra.launcher.n_jobs")
TRAIN_CONFIG = "config"  # repro.train's config name (conf/config.yaml)
REPLACED = ("hydra.mode", "hydra.run.dir", "hydra.sweep.dir")  # repro.resume sets them itself
# Keys Hydra's instantiate reads (`_target_`, `_args_`, `_partial_` ...): never from a record.
_INSTANTIATE_KEY = re.compile(r"(?:^|[./\s{,])_[a-z]+_(?:$|[.:/\s}=])")
_KEY = re.compile(r"[A-Za-z_][\w.\-]*")  # `trainer.epochs`, `seed.value`, `model`
_OPTION_NAMES = re.compile(r"[\w\-,\[\]() ]*")  # `model=resnet9`, `logger=[csv,mlflow]`
# Keys whose value is a place, not a setting: where a run reads its data, connects, writes a
# cache, or whether it downloads. A relaunch takes them from its own command line, never from
# a record (`with_places`); a tracker's destination and Hydra's folders are refused or
# replaced above.
PLACES = {
    "data.root": "the folder or bucket its data is read from",
    "data.endpoint_url": "the server its data is fetched from",
    "data.cache_dir": "where fetched shards are written",
    "data.download": "whether it downloads, and so connects",
}


def check(overrides: Any, source: object, trust: bool = False) -> list[str]:
    """Recorded command-line overrides that a relaunch may use, checked one by one: a value
    of the run's own keys or an option of a config group; of Hydra's settings only the
    launcher's choice and its job count (`HYDRA_ALLOWED`). Refused in one line: any other
    `hydra.*` key, a key Hydra's instantiate reads (`_target_`, `_args_` ...) or a value
    holding one, an interpolation, a tracker's destination, a download."""
    if not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides):
        raise UntrustedConfigError(f"{source}: its overrides are not a list of key=value strings")
    if trust is True:
        return list(overrides)
    for override in overrides:
        key, _, value = override.lstrip("~+").partition("=")
        refused = _refused_override(key.strip(), value)
        if refused:
            raise UntrustedConfigError(
                f"{source}: the recorded override {override!r} is refused: {refused}; a run "
                "folder decides values of the run's own keys only. If you made this folder, or "
                "trust whoever did, add trust=true"
            )
    return list(overrides)


def _refused_override(key: str, value: str) -> str | None:
    """Why a recorded `key=value` may not be relaunched, or None."""
    if _INSTANTIATE_KEY.search(f".{key}=") or _INSTANTIATE_KEY.search(value):
        return "it names a key Hydra's instantiate reads (_target_, _args_ ...): code to run"
    if interpolates(key) or interpolates(value):
        return "it holds an interpolation, whose resolver would run"
    if key == "hydra" or key.startswith(("hydra.", "hydra/")):
        if key in REPLACED or (key in HYDRA_ALLOWED and re.fullmatch(r"[\w-]+", value)):
            return None
        return "a Hydra setting, which decides what runs and where files go"
    if not _KEY.fullmatch(key) or ".." in key:  # `model@hydra.callbacks`, `model/..`
        return "a key of the run's config is a dotted name: no package (@), path or group path"
    if "." not in key and not _OPTION_NAMES.fullmatch(value):
        return "a config group's option is a name in this checkout's conf/, not a path"
    if key.startswith(("logger.mlflow", "logger.wandb")):
        return "it says where the run's metrics are sent"
    return None


def with_places(run: Relaunch, given: dict[str, str], source: object, trusted: bool) -> Relaunch:
    """`run` with each place (`PLACES`) the user `given` on this command line; one the record
    sets and the command line does not is refused in one line naming the key (trusted
    records keep theirs)."""
    return run._replace(task=placed(run.task, given, source, trusted))


def placed(overrides: list[str], given: dict[str, str], source: object, trusted: bool) -> list[str]:
    """Recorded `overrides` with their places replaced by the `given` ones (see with_places)."""
    kept = []
    for override in overrides:
        key = override.lstrip("~+").split("=", 1)[0].strip()
        if key in PLACES and key not in given and not trusted:
            raise UntrustedConfigError(
                f"{source}: the record sets {key} ({PLACES[key]}), refused: a record never chooses "
                f"where a run reads, connects or writes; give it on this command line: "
                f"python -m repro.resume PATH {key}=VALUE"
            )
        if key not in given:
            kept.append(override)
    return kept + [f"{key}={value}" for key, value in given.items()]


def check_network(composed: Any, given: dict[str, str], source: object, trusted: bool) -> None:
    """Refuse a relaunch whose recorded choices turn the network on through this checkout's
    defaults (`data=cifar10` downloads), unless the command line says whether to download."""
    if trusted or "data.download" in given:
        return
    if composed.data.get("download") is True:
        option = composed.hydra.runtime.choices.get("data")
        raise UntrustedConfigError(
            f"{source}: the recorded data={option} downloads by default (data.download=true), refused: a "
            "record never turns the network on; say it on this command line: python -m "
            "repro.resume PATH data.download=false (or true)"
        )


class Relaunch(NamedTuple):
    """What `python -m repro.train` is run with, every part checked (`checked_relaunch`)."""

    config_name: str
    hydra: list[str]  # the launcher's choice and settings
    task: list[str]
    hash_seed: str | None


def checked_relaunch(
    recorded: dict[str, Any], task: Any, env: dict | None, source: Path, trusted: bool
) -> Relaunch:
    """The relaunch a record asks for, refused in one line where it asks for more than
    values: see the module's docstring."""

    def own(overrides: list[str]) -> list[str]:  # where files go is resume's to say, not theirs
        return [o for o in overrides if o.lstrip("~+").split("=", 1)[0] not in REPLACED]

    hydra = own(check(recorded["overrides"]["hydra"], source, trusted))
    task = own(check(task, source, trusted))
    name = recorded["job"].get("config_name", TRAIN_CONFIG)  # absent: the entry point's own
    if name != TRAIN_CONFIG and not trusted:
        raise UntrustedConfigError(
            f"{source}: the recorded config name {name!r} is refused: repro.train's config is "
            f"{TRAIN_CONFIG!r} (conf/{TRAIN_CONFIG}.yaml), and a run folder decides values only; "
            "if you made this folder, or trust whoever did, add trust=true"
        )
    if not isinstance(name, str) or not re.fullmatch(r"[\w-]+", name):
        raise DataError(f"{source}: config name {name!r} is not a file name of conf/")
    if not (trust.CONF / f"{name}.yaml").is_file():
        raise DataError(f"{source}: config name {name!r}: this checkout has no conf/{name}.yaml")
    seed = (env or {}).get("pythonhashseed")
    digits = re.fullmatch(r"[0-9]{1,10}", str(seed))
    valid = str(seed) == "random" or (digits is not None and int(str(seed)) < 2**32)
    if seed is not None and not valid:  # else Python itself stops the child, in several lines
        raise DataError(f"{source}: recorded hash seed {seed!r} is not random or a number")
    return Relaunch(name, hydra, task, None if seed is None else str(seed))


def check_composes(run: Relaunch, task: list[str], source: Path) -> Any:
    """Compose the relaunch's config (one job's `task` overrides) before anything runs: a
    record that does not fit this checkout is one line here, not Hydra's error in the child.
    Returns the composed config."""
    from hydra import compose, initialize_config_dir
    from hydra.errors import HydraException
    from omegaconf.errors import OmegaConfBaseException

    from repro.core import config

    config.register()
    try:
        with initialize_config_dir(config_dir=str(trust.CONF), version_base="1.3"):
            return compose(run.config_name, [*run.hydra, *task], return_hydra_config=True)
    except (HydraException, OmegaConfBaseException, ValueError) as error:
        reason = (str(error).strip().splitlines() or [type(error).__name__])[0]
        raise DataError(
            f"{source}: its overrides do not compose in this checkout: {reason}"
        ) from None
