"""Re-run a recorded run and say whether it reproduces:
`python -m repro.verify RUN_DIR [steps=N] [threads=N] [trust=true] [download=true]`.

The data is loaded and compared with the run's data fingerprint first: other data is reported
without training. Then the recorded config (resolved_config.yaml) is trained again in a
temporary folder with the recorded thread count, all of it or its first N steps, and the
per-step fingerprints (loss to full precision, weights hash every K steps) are compared.
Prints every difference between the recorded and the current environment, those known to
change floating-point results first, then "identical" or the first divergent step. Exit code
0 only when identical. A recorded config naming a target this checkout does not trust is
refused before anything is built or imported, unless `trust=true` (see repro.core.runs.trust).
The rerun logs to no tracker and reaches no network (`download=true` lets it fetch data or
weights): the recorded config decides results, not what this machine sends.
"""

from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from repro.core import build, schema
from repro.core.data import fingerprint
from repro.core.errors import (
    BARE,
    ConfigError,
    DataError,
    UserError,
    exit_with,
    one_line,
    warnings_to_stderr,
)
from repro.core.guards import received
from repro.core.guards.network import offline
from repro.core.run import train
from repro.core.runs import resume
from repro.core.runs.fingerprint_log import FingerprintLog, first_divergence
from repro.core.runs.trust import as_data
from repro.core.runtime import determinism, environment
from repro.core.runtime.devices import select_device
from repro.core.text import for_terminal

USAGE = "python -m repro.verify RUN_DIR [steps=N] [threads=N] [trust=true] [download=true]"


@dataclass
class Verdict:
    steps_compared: int
    divergence: str | None = None
    environment: list[str] = field(default_factory=list)
    data: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None


def environment_changes(recorded: dict, current: dict) -> list[str]:
    """One line per difference; those known to change floating-point results first, marked."""
    before, now = schema.flatten(recorded), schema.flatten(current)
    lines = []
    for key in sorted(before.keys() | now.keys()):
        if before.get(key) != now.get(key):
            marked = key.rsplit(".", 1)[-1] in environment.CHANGES_RESULTS
            mark = " (changes floating-point results)" if marked else ""
            lines.append(
                (not marked, f"{key}: {before.get(key)!r} recorded, {now.get(key)!r} now{mark}")
            )
    return [line for _, line in sorted(lines, key=lambda pair: pair[0])]


def data_changes(recorded: dict, current: dict) -> list[str]:
    """The splits whose images differ from the recorded run's."""
    if recorded.get("sha256") == current.get("sha256"):
        return []
    changes = []
    for split, now in current["splits"].items():
        before = recorded.get("splits", {}).get(split, {})
        if before != now:
            changes.append(
                f"{split}: {before.get('images')} images {str(before.get('sha256'))[:12]} "
                f"recorded, {now['images']} images {now['sha256'][:12]} now"
            )
    return changes or [f"classes: {recorded.get('classes')} recorded, {current['classes']} now"]


def _recorded_config(
    resolved: Path,
    steps: int | None,
    threads: int | None,
    env: dict,
    trust: bool = False,
    download: bool = False,
) -> Any:
    recorded = received.load_yaml(resolved)  # plain YAML: nothing resolved, shape capped
    if isinstance(recorded, dict):
        recorded = resume.upgrade(recorded)
    recorded = as_data(recorded, resolved, trust)  # what would be built, checked
    try:
        cfg = OmegaConf.merge(OmegaConf.structured(schema.Config), recorded)
    except OmegaConfBaseException as error:
        raise DataError(f"{resolved}: not a config of this template ({one_line(error)})") from None
    cfg.data.download = download
    resume.fill_declared(cfg)  # recorded before some keys existed
    cfg.seed.mode = "fixed"  # the recorded value is the seed that was used, even if drawn
    cfg.trainer.resume = "never"
    cfg.trainer.halt_at_step = steps
    cfg.logger.plot = cfg.logger.tensorboard = False
    # The recorded thread count: another one splits the sums differently.
    cfg.trainer.num_threads = threads or env.get("num_threads") or cfg.trainer.num_threads
    return cfg


def _summary(path: Path) -> dict[str, Any]:
    """A run's summary.json, {} if it has none; a file that is no summary is one error line."""
    if not path.exists() and not path.is_symlink():
        return {}
    summary = received.load_json(path)
    if not isinstance(summary, dict):
        raise DataError(f"{path}: not a summary repro can read (no mapping)")
    data = summary.get("data", {})
    shapes = {  # what verify reads of it, each of the type a run writes
        "env": isinstance(summary.get("env", {}), dict),
        "flags": isinstance(summary.get("flags", {}), dict),
        "weights_sha256": isinstance(summary.get("weights_sha256", ""), str),
        "data": isinstance(data, dict)
        and isinstance(data.get("splits", {}), dict)
        and all(isinstance(split, dict) for split in data.get("splits", {}).values()),
    }
    wrong = [key for key, right in shapes.items() if not right]
    if wrong:
        raise DataError(f"{path}: not a summary repro can read ({', '.join(wrong)} malformed)")
    return summary


def verify(
    run_dir: Path,
    steps: int | None = None,
    threads: int | None = None,
    trust: bool = False,
    download: bool = False,
) -> Verdict:
    """Re-run `run_dir`'s config (its first `steps` steps, with its thread count unless
    `threads` is given) and compare with what it recorded. Data that differs from the
    recorded run's is reported without training. `trust`: build targets this checkout does
    not know of (see repro.core.runs.trust); `download`: fetch missing data (the recorded config's
    `data.download` is never followed, nor its trackers)."""
    resolved = run_dir / "resolved_config.yaml"
    fingerprints = FingerprintLog.of_run(run_dir).path
    if not resolved.is_file() or not fingerprints.is_file():
        raise DataError(
            f"{run_dir}: not a run folder (needs resolved_config.yaml, fingerprints.csv)"
        )
    try:
        recorded = FingerprintLog(fingerprints).read()
    except (OSError, ValueError) as error:
        raise DataError(f"{fingerprints}: not a fingerprint log ({error})") from None
    if not recorded:
        raise DataError(f"{fingerprints}: empty, the run recorded no step")
    if steps is not None and steps > recorded[-1][0]:
        raise ConfigError("steps", steps, f"at most the {recorded[-1][0]} steps the run recorded")
    before = _summary(run_dir / "summary.json")
    env = before.get("env") if isinstance(before.get("env"), dict) else {}
    cfg = _recorded_config(resolved, steps, threads, env, trust, download)

    verdict = Verdict(0)
    if before:
        now_env = environment.describe(select_device(cfg.trainer.device))
        now_env["num_threads"] = cfg.trainer.num_threads or now_env["num_threads"]  # as rerun
        verdict.environment = environment_changes(before.get("env", {}), now_env)
    if "data" in before:
        now = fingerprint.fingerprint(build.splits(cfg, cfg.seed.value), cfg.data.root)
        verdict.data = data_changes(before["data"], now)
        if verdict.data:
            verdict.divergence = "the data, before any step (nothing was trained)"
            return verdict
    with tempfile.TemporaryDirectory(prefix="repro-verify-") as work:
        summary = train(cfg, Path(work))
        rerun = FingerprintLog.of_run(Path(work)).read()
    verdict.steps_compared = min(len(recorded), len(rerun))
    compared = verdict.steps_compared
    verdict.divergence = first_divergence(recorded[:compared], rerun[:compared])
    if before:
        verdict.environment += environment_changes(before.get("flags", {}), determinism.snapshot())
        full_rerun = steps is None and before.get("completed")
        if (
            verdict.identical
            and full_rerun
            and before.get("weights_sha256") != summary["weights_sha256"]
        ):
            verdict.divergence = "final weights_sha256 differs although every step matched"
    return verdict


def main(argv: list[str]) -> None:
    warnings_to_stderr(BARE)
    try:
        if not argv or "=" in argv[0]:
            raise ConfigError("RUN_DIR", None, f"usage: {USAGE}")
        run_dir = Path(argv[0])
        options: dict[str, int] = {}
        switches = {"trust": False, "download": False}
        for arg in argv[1:]:
            key, _, value = arg.partition("=")
            if key in switches and value in ("true", "false"):
                switches[key] = value == "true"
                continue
            if key not in ("steps", "threads") or not value.isdigit() or int(value) < 1:
                allowed = "only steps=N and threads=N with N >= 1, trust=true, download=true"
                raise ConfigError(key, value, f"{allowed} ({USAGE})")
            options[key] = int(value)
        steps = options.get("steps")
        print(f"re-running {run_dir} ({f'first {steps} steps' if steps else 'all steps'}) ...")
        with offline(f"the config comes from {run_dir}", switches["download"]):
            verdict = verify(run_dir, steps, options.get("threads"), **switches)
    except UserError as error:
        exit_with(error)
    for change in verdict.data:
        print(for_terminal(f"data differs: {change}"))
    for change in verdict.environment:
        print(for_terminal(f"environment differs: {change}"))
    if verdict.identical:
        print(f"identical: {verdict.steps_compared} steps, every loss and weights hash matches")
        raise SystemExit(0)
    print(for_terminal(f"diverged at {verdict.divergence}"))
    raise SystemExit(1)
