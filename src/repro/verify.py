"""Re-run a recorded run and say whether it reproduces: `python -m repro.verify RUN_DIR [steps=N]`.

The recorded config (resolved_config.yaml) is trained again in a temporary folder, all of it or
its first N steps, and the per-step fingerprints (loss to full precision, weights hash every K
steps) are compared. Prints "identical" or the first divergent step and what diverged, plus
every difference between the recorded and the current environment. Exit code 0 only when
identical.
"""

from __future__ import annotations

if __name__ == "__main__":  # before torch is imported, so the re-exec costs next to nothing
    from repro.launch import pin_hash_seed

    pin_hash_seed("repro.verify")

import json
import logging
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import OmegaConf

from repro import config
from repro.errors import ConfigError, DataError, UserError, exit_with
from repro.runtime import determinism, environment
from repro.runtime.transfer import select_device
from repro.train import train


@dataclass
class Verdict:
    steps_compared: int
    divergence: str | None = None
    environment: list[str] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.divergence is None


def read_fingerprints(path: Path) -> list[tuple[int, str, str]]:
    """(step, loss as written, weights hash or '') per line."""
    rows = []
    for line in path.read_text().splitlines():
        if line:
            step, loss, digest = line.split(",")
            rows.append((int(step), loss, digest))
    return rows


def first_divergence(
    recorded: list[tuple[int, str, str]], rerun: list[tuple[int, str, str]]
) -> str | None:
    for (step, loss, digest), (_, new_loss, new_digest) in zip(recorded, rerun, strict=False):
        if loss != new_loss:
            return f"step {step}: loss {loss} recorded, {new_loss} now"
        if digest and new_digest and digest != new_digest:
            return f"step {step}: weights hash {digest[:16]} recorded, {new_digest[:16]} now"
    return None


def environment_changes(recorded: dict, current: dict) -> list[str]:
    return [
        f"{key}: {recorded.get(key)!r} recorded, {current.get(key)!r} now"
        for key in sorted(recorded.keys() | current.keys())
        if recorded.get(key) != current.get(key)
    ]


def verify(run_dir: Path, steps: int | None = None) -> Verdict:
    """Re-run `run_dir`'s config (its first `steps` steps) and compare with what it recorded."""
    resolved = run_dir / "resolved_config.yaml"
    fingerprints = run_dir / "fingerprints.csv"
    if not resolved.is_file() or not fingerprints.is_file():
        raise DataError(
            f"{run_dir}: not a run folder (needs resolved_config.yaml, fingerprints.csv)"
        )
    recorded = read_fingerprints(fingerprints)
    if not recorded:
        raise DataError(f"{fingerprints}: empty, the run recorded no step")
    if steps is not None and steps > recorded[-1][0]:
        raise ConfigError("steps", steps, f"at most the {recorded[-1][0]} steps the run recorded")

    config.register()
    cfg = OmegaConf.merge(OmegaConf.structured(config.Config), OmegaConf.load(resolved))
    cfg.seed.mode = "fixed"  # the recorded value is the seed that was used, even if drawn
    cfg.trainer.resume = "never"
    cfg.trainer.halt_at_step = steps
    cfg.logger.plot = cfg.logger.tensorboard = False
    with tempfile.TemporaryDirectory(prefix="repro-verify-") as work:
        summary = train(cfg, Path(work))
        rerun = read_fingerprints(Path(work) / "fingerprints.csv")
    compared = min(len(recorded), len(rerun))
    verdict = Verdict(compared, first_divergence(recorded[:compared], rerun[:compared]))

    summary_file = run_dir / "summary.json"
    if summary_file.is_file():
        before = json.loads(summary_file.read_text())
        now_env = environment.describe(select_device(cfg.trainer.device))
        verdict.environment = environment_changes(before.get("env", {}), now_env)
        verdict.environment += environment_changes(before.get("flags", {}), determinism.snapshot())
        full_rerun = steps is None and before.get("completed")
        if (
            verdict.identical
            and full_rerun
            and before["weights_sha256"] != summary["weights_sha256"]
        ):
            verdict.divergence = "final weights_sha256 differs although every step matched"
    return verdict


def main(argv: list[str]) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        if not argv or argv[0].startswith("steps="):
            raise ConfigError("RUN_DIR", None, "usage: python -m repro.verify RUN_DIR [steps=N]")
        run_dir = Path(argv[0])
        steps = None
        for arg in argv[1:]:
            key, _, value = arg.partition("=")
            if key != "steps" or not value.isdigit() or int(value) < 1:
                raise ConfigError(key, value, "only steps=N with N >= 1")
            steps = int(value)
        print(f"re-running {run_dir} ({f'first {steps} steps' if steps else 'all steps'}) ...")
        verdict = verify(run_dir, steps)
    except UserError as error:
        exit_with(error)
    for change in verdict.environment:
        print(f"environment differs: {change}")
    if verdict.identical:
        print(f"identical: {verdict.steps_compared} steps, every loss and weights hash matches")
        raise SystemExit(0)
    print(f"diverged at {verdict.divergence}")
    raise SystemExit(1)


if __name__ == "__main__":
    main(sys.argv[1:])
