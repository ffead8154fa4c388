"""Seeds until the answer is clear: a Hydra sweeper that trains two configs under seeds 0, 1,
2, ... in rounds, until the paired interval of a metric's difference excludes 0, or is narrower
than a target, or the seed budget is spent.

    python -m repro.train -m hydra/sweeper=adaptive_seeds optimizer.lr=0.2,0.1 \\
        hydra.sweeper.metric=val_acc hydra.sweep.dir=outputs/lr_study

The two configs, a and b, are the two values of the one swept key, in the order written; the
other arguments are shared. Seed s of a is job 2s and of b job 2s + 1, so every job has the same
folder on every run of the command: a rerun reads back the jobs that finished, launches those
missing (a killed one resumes from its checkpoint), then new rounds, and reaches the decision an
unbroken run would have.

After each round, a look: the paired t interval of metric(b) - metric(a) over the seeds so far.
Looking again and again gives chance more tries, so each look uses the confidence
1 - (1 - confidence) / looks, with `looks` those the budget allows (Bonferroni): the chance that
any look excludes 0 for configs that do not differ stays under 1 - confidence. When every seed
gives the same difference (identical configs give 0 on every seed) there is no spread to form an
interval from: no look decides, and the budget is spent.
"""

# No `from __future__ import annotations`: Hydra's plugin scan runs this module before it is in
# sys.modules, where dataclasses look up string annotations.

import logging
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.plugins import Plugins
from hydra.plugins.sweeper import Sweeper
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig, OmegaConf

from repro.core.errors import ConfigError, UserError, exit_with
from repro.core.files import write_json_atomic, write_text_atomic
from repro.core.sweeps import DECISION_FILE, verdict
from repro.core.sweeps.report import number, read_job
from repro.core.sweeps.stats import summarize

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Rule:
    """When the sweeper looks and what stops it: hydra.sweeper's settings."""

    metric: str
    round: int  # new seeds per config in a round
    budget: int  # the most seeds per config
    target_width: float | None  # also stop once the interval (holding 0) is narrower than this
    confidence: float  # over all looks together

    def check(self) -> None:
        def positive_int(value: Any, least: int) -> bool:
            return isinstance(value, int) and not isinstance(value, bool) and value >= least

        if not positive_int(self.round, 1):
            raise ConfigError("hydra.sweeper.round", self.round, "an integer >= 1")
        if not positive_int(self.budget, 2):
            raise ConfigError("hydra.sweeper.budget", self.budget, "an integer >= 2 (seeds)")
        if self.target_width is not None and not self.target_width > 0:
            raise ConfigError("hydra.sweeper.target_width", self.target_width, "null or > 0")
        if not 0 < self.confidence < 1:
            raise ConfigError("hydra.sweeper.confidence", self.confidence, "between 0 and 1")

    def looks(self) -> list[int]:
        """Seeds per config at each look: after every round, the budget last."""
        rounds = math.ceil(self.budget / self.round)
        return [min(k * self.round, self.budget) for k in range(1, rounds + 1)]

    @property
    def look_confidence(self) -> float:
        deciding = sum(n >= 2 for n in self.looks())  # an interval needs two seeds
        return 1 - (1 - self.confidence) / deciding


def look(differences: list[float], rule: Rule) -> tuple[dict[str, Any], str | None]:
    """One look at the per-seed differences b - a: the interval, and why to stop (None: go on)."""
    s = summarize(differences, rule.look_confidence)
    seen = {"seeds": s.count, "difference": s.mean, "ci_low": s.ci_low, "ci_high": s.ci_high}
    if s.count < 2 or s.std == 0:  # no spread, no interval: it says nothing of seeds to come
        return seen, None
    where = (
        f"the {rule.look_confidence:.2%} interval of {rule.metric}(b) - {rule.metric}(a), "
        f"[{s.ci_low:.4g}, {s.ci_high:.4g}],"
    )
    if side := verdict.side(s.ci_low, s.ci_high):
        said = verdict.verdict(rule.metric, s.ci_low, s.ci_high)  # the report's words
        better = f" ({said.verdict})" if said.better else ""  # where the direction is known
        return seen, f"{where} excludes 0: b gives the {side} {rule.metric}{better}"
    if rule.target_width is not None and s.ci_high - s.ci_low < rule.target_width:
        width = f"hydra.sweeper.target_width={rule.target_width}"
        return seen, f"{where} holds 0 and is narrower than {width}: no difference that large"
    return seen, None


def round_line(seen: dict[str, Any], rule: Rule, stop: str | None, last: bool) -> str:
    """What a round gave, in one line: the seeds so far, the mean difference, its interval and
    whether the sweep goes on (a sweep of many rounds says nothing for minutes otherwise)."""
    said = f"{seen['seeds']} seeds per config: {rule.metric}(b) - {rule.metric}(a) = "
    said += f"{seen['difference']:.4g}"
    if seen["seeds"] >= 2 and seen["ci_low"] != seen["ci_high"]:
        said += f", interval [{seen['ci_low']:.4g}, {seen['ci_high']:.4g}]"
    return f"{said}; {'resolved' if stop else 'budget spent' if last else 'another round'}"


class AdaptiveSeeds(Sweeper):
    """`hydra/sweeper=adaptive_seeds` (conf/hydra/sweeper/adaptive_seeds.yaml). Hydra builds a
    sweeper only from the hydra_plugins namespace, hence this module's place: the core never
    imports it."""

    def __init__(
        self,
        metric: str,
        round: int,  # the name a user types: hydra.sweeper.round
        budget: int,
        target_width: float | None,
        confidence: float,
    ) -> None:
        super().__init__()
        self.rule = Rule(metric, round, budget, target_width, confidence)

    def setup(
        self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig
    ) -> None:
        self.config, self.hydra_context = config, hydra_context
        self.launcher = Plugins.instance().instantiate_launcher(
            hydra_context=hydra_context, task_function=task_function, config=config
        )
        self.sweep_dir = Path(config.hydra.sweep.dir)

    def sweep(self, arguments: list[str]) -> dict[str, Any]:
        try:
            self.rule.check()
            subdir = OmegaConf.to_container(self.config.hydra.sweep)["subdir"]  # unresolved
            if subdir != "${hydra.job.num}":  # a job's number names its folder
                raise ConfigError("hydra.sweep.subdir", subdir, "${hydra.job.num}, the default")
            self.shared, self.configs = self._two_configs(arguments)
            self._check_metric()
            decision = self._run()
        except UserError as error:
            exit_with(error)
        log.info("%s (%s)", decision["why"], self.sweep_dir / DECISION_FILE)
        return decision

    def _two_configs(self, arguments: list[str]) -> tuple[list[str], list[str]]:
        """(the shared overrides, the overrides of a and of b) from the command line's."""
        parser = OverridesParser.create(config_loader=self.hydra_context.config_loader)
        shared, swept = [], []
        for text, override in zip(arguments, parser.parse_overrides(arguments), strict=True):
            key = override.get_key_element()
            if key.lstrip("+~").split(".")[0] == "seed":
                allowed = "the adaptive sweeper runs seeds 0, 1, 2, ... itself: leave it out"
                raise ConfigError(key, text.split("=", 1)[-1], allowed)
            if override.is_discrete_sweep():
                swept.append([f"{key}={value}" for value in override.sweep_string_iterator()])
            elif override.is_sweep_override():
                raise ConfigError(key, text.split("=", 1)[-1], "two values to compare: a,b")
            else:
                shared.append(f"{key}={override.get_value_element_as_str()}")
        if len(swept) != 1 or len(swept[0]) != 2:
            raise UserError(
                "hydra/sweeper=adaptive_seeds compares two configs: give one key two values "
                f"(e.g. optimizer.lr=0.2,0.1); these arguments sweep {len(swept)} keys: "
                + " ".join(arguments)
            )
        return shared, swept[0]

    def _check_metric(self) -> None:
        """Refuse a metric that the swept key changes the meaning of (val_loss under two
        objectives): seeds cannot resolve a difference between two other quantities."""
        key = self.configs[0].split("=", 1)[0]
        if why := verdict.incomparable(self.rule.metric, [key]):
            allowed = f"a metric both configs measure alike; {key} changes it: {why}"
            raise ConfigError("hydra.sweeper.metric", self.rule.metric, allowed)

    @property
    def _again(self) -> str:
        """How to continue: the same folder (a command without one gets a new folder)."""
        return f"run the same command with hydra.sweep.dir={self.sweep_dir}"

    def _overrides(self, job: int) -> list[str]:
        seed, which = divmod(job, 2)
        return [*self.shared, self.configs[which], f"seed.value={seed}"]

    def _run(self) -> dict[str, Any]:
        self.sweep_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.sweep_dir / "multirun.yaml", OmegaConf.to_yaml(self.config))
        tried: set[int] = set()  # launched by this command: a job that failed is not retried
        looks: list[dict[str, Any]] = []
        why = ""
        for seeds in self.rule.looks():
            jobs = range(2 * seeds)  # seed s: job 2s (a), job 2s + 1 (b)
            todo = [job for job in jobs if job not in tried and self._result(job) is None]
            self._launch(todo)
            tried |= set(todo)
            results = [self._result(job) for job in jobs]
            if None in results:
                job = results.index(None)
                why = (
                    f"stopped at {seeds} seeds: job {job} ({' '.join(self._overrides(job))}) did "
                    f"not finish (see its folder); fix it and {self._again} to continue"
                )
                break
            seen, stop = look(
                [b - a for a, b in zip(results[::2], results[1::2], strict=True)], self.rule
            )
            looks.append(seen)
            log.info("%s", round_line(seen, self.rule, stop, seeds == self.rule.budget))
            if stop:
                why = f"resolved after {seeds} seeds: {stop}"
                break
        a, b = self.configs
        decision = {
            "a": a, "b": b, **asdict(self.rule), "look_confidence": self.rule.look_confidence,
            "seeds": looks[-1]["seeds"] if looks else 0, "resolved": why.startswith("resolved"),
            "why": why or self._not_resolved(looks[-1]), "looks": looks,
        }  # fmt: skip
        write_json_atomic(self.sweep_dir / DECISION_FILE, decision)
        return decision

    def _not_resolved(self, last: dict[str, Any]) -> str:
        if last["ci_low"] == last["ci_high"]:  # no spread: see the module's docstring
            reason = (
                f"every seed gave the same difference ({last['difference']:.4g}), so no interval "
                "can be formed (the two configs may train the same weights)"
            )
        else:
            reason = f"the interval [{last['ci_low']:.4g}, {last['ci_high']:.4g}] still holds 0"
        return (
            f"not resolved: the budget of {self.rule.budget} seeds per config is spent and "
            f"{reason}; raise hydra.sweeper.budget and {self._again} to go on"
        )

    def _result(self, job: int) -> float | None:
        """The metric of a finished job; None for one not run, failed or unfinished."""
        folder = self.sweep_dir / str(job)
        if not (folder / ".hydra" / "overrides.yaml").is_file():
            return None
        found, expected = read_job(folder), self._overrides(job)
        if sorted(found.overrides) != sorted(expected):
            raise UserError(
                f"hydra.sweep.dir={self.sweep_dir}: job {job} there ran "
                f"{' '.join(found.overrides)}, not {' '.join(expected)}; give another comparison "
                "its own folder"
            )
        if not found.ok or found.summary is None:
            return None
        value = number(found.summary, self.rule.metric)
        if value is None:
            names = ", ".join(k for k in found.summary if number(found.summary, k) is not None)
            raise ConfigError("hydra.sweeper.metric", self.rule.metric, f"one of {names}")
        return value

    def _launch(self, jobs: list[int]) -> None:
        """Launch jobs by number, a run of consecutive numbers at a time (the launcher numbers
        a batch on from its first job, and the job's number names its folder)."""
        runs: list[list[int]] = []
        for job in jobs:
            if runs and runs[-1][-1] == job - 1:
                runs[-1].append(job)
            else:
                runs.append([job])
        for run in runs:
            batch = [self._overrides(job) for job in run]
            self.validate_batch_is_legal(batch)
            self.launcher.launch(batch, initial_job_idx=run[0])
