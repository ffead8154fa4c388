"""Statistics that use the sweep's design (paired over shared seeds, else Welch), any metric a run
records, and the adaptive seed sweeper: it stops when the answer is clear or the budget is spent,
and the same command continues where it stopped."""

from __future__ import annotations

import dataclasses
import json
import math
import re
import shutil
import statistics

import pytest
import yaml
from omegaconf import OmegaConf
from scipy import stats

from hydra_plugins.repro.adaptive_seeds import AdaptiveSeeds, Rule, look, round_line
from repro.core.errors import ConfigError, UserError
from repro.core.sweeps import render, report, verdict
from repro.core.sweeps.stats import difference_of_means, paired_difference

from conftest import IMAGEFOLDER, make_image_tree, run_cli, sweep_said, tiny

A = [0.912, 0.905, 0.921, 0.899, 0.915, 0.908]
B = [0.925, 0.911, 0.934, 0.910, 0.921, 0.920]  # B[i] beats A[i] by about 0.01: a paired design


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_paired_and_welch_intervals_equal_scipys(confidence):
    paired = paired_difference(A, B, confidence)
    expected = stats.ttest_rel(B, A).confidence_interval(confidence)
    assert (paired.ci_low, paired.ci_high) == pytest.approx((expected.low, expected.high))
    assert paired.dof == len(A) - 1
    welch = difference_of_means(A, B[:4], confidence)
    expected = stats.ttest_ind(B[:4], A, equal_var=False).confidence_interval(confidence)
    assert (welch.ci_low, welch.ci_high) == pytest.approx((expected.low, expected.high))
    # Pairing takes out what a seed does to both: here it resolves what Welch's cannot.
    assert paired.ci_low > 0 > difference_of_means(A, B).ci_low


def _nan(*values: float) -> bool:
    return all(isinstance(v, float) and math.isnan(v) for v in values)


def test_welch_with_two_values_a_side_equals_scipys_and_one_value_gives_no_interval():
    welch = difference_of_means(A[:2], B[:2])
    expected = stats.ttest_ind(B[:2], A[:2], equal_var=False)
    interval = expected.confidence_interval()
    assert (welch.ci_low, welch.ci_high) == pytest.approx((interval.low, interval.high))
    assert welch.dof == pytest.approx(expected.df)
    for a, b in ((A[:1], B), (A, B[:1])):  # either side with one value: a difference, no interval
        alone = difference_of_means(a, b)
        assert alone.difference == pytest.approx(statistics.fmean(b) - statistics.fmean(a))
        assert _nan(alone.ci_low, alone.ci_high, alone.dof)


def test_welch_of_constant_groups_is_their_difference_exactly():
    same = difference_of_means([0.5, 0.5], [0.75, 0.75, 0.75])
    assert (same.difference, same.ci_low, same.ci_high, same.dof) == (0.25, 0.25, 0.25, math.inf)


def test_paired_needs_pairs_and_one_pair_gives_no_interval():
    with pytest.raises(ValueError):
        paired_difference(A, B[:5])
    one = paired_difference(A[:1], B[:1])
    assert one.difference == pytest.approx(B[0] - A[0]) and _nan(one.ci_low, one.ci_high, one.dof)
    two = paired_difference(A[:2], B[:2])
    assert two.dof == 1 and two.ci_low < two.difference < two.ci_high


def test_a_single_value_summarises_as_itself_without_spread():
    from repro.core.sweeps.stats import summarize

    alone = summarize([0.25])
    assert (alone.count, alone.mean, alone.min, alone.max) == (1, 0.25, 0.25, 0.25)
    assert _nan(alone.std, alone.ci_low, alone.ci_high)


def fake_job(sweep_dir, num, overrides, seed, **summary):
    folder = sweep_dir / str(num)
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    values = {"val_acc": 0.5, "val_loss": 1.0, "train_loss": 1.0, "wall_s": 1.0, **summary}
    (folder / "summary.json").write_text(json.dumps({**values, "seed": seed, "completed": True}))


def test_the_report_pairs_groups_that_share_seeds_and_says_which_test_it_used(tmp_path):
    for seed, (a, b) in enumerate(zip(A, B, strict=True)):
        fake_job(tmp_path, 2 * seed, ["amp=off", f"seed.value={seed}"], seed, val_acc=a)
        fake_job(tmp_path, 2 * seed + 1, ["amp=bf16", f"seed.value={seed}"], seed, val_acc=b)
    for seed, c in enumerate([0.90, 0.93, 0.91], start=10):  # seeds no other group ran
        fake_job(tmp_path, 20 + seed, ["amp=fp16", f"seed.value={seed}"], seed, val_acc=c)
    comparisons = {(c["a"], c["b"]): c["val_acc"] for c in report.build(tmp_path).comparisons}

    paired = comparisons["amp=off", "amp=bf16"]
    assert paired["test"] == "paired: 6 shared seeds"
    expected = stats.ttest_rel(B, A).confidence_interval()
    assert (paired["ci_low"], paired["ci_high"]) == pytest.approx((expected.low, expected.high))
    beside = stats.ttest_ind(B, A, equal_var=False).confidence_interval()
    welch = paired["welch"]
    assert (welch["ci_low"], welch["ci_high"]) == pytest.approx((beside.low, beside.high))

    unpaired = comparisons["amp=off", "amp=fp16"]
    assert unpaired["test"] == "Welch: seeds not shared" and unpaired["paired"] is None
    text = render.markdown(report.build(tmp_path))
    assert "| paired: 6 shared seeds |" in text and "| Welch: seeds not shared |" in text


def test_a_failed_partner_leaves_its_seed_out_of_the_pairs(tmp_path):
    for seed in range(3):
        fake_job(tmp_path, 2 * seed, ["amp=off", f"seed.value={seed}"], seed, val_acc=A[seed])
        fake_job(tmp_path, 2 * seed + 1, ["amp=bf16", f"seed.value={seed}"], seed, val_acc=B[seed])
    (tmp_path / "5" / "summary.json").unlink()
    (tmp_path / "5" / "error.txt").write_text("ConfigError: ...\n")
    (comparison,) = report.build(tmp_path).comparisons
    assert comparison["val_acc"]["test"] == "paired: 2 shared seeds (1 unmatched jobs left out)"
    expected = stats.ttest_rel(B[:2], A[:2]).confidence_interval()
    got = comparison["val_acc"]
    assert (got["ci_low"], got["ci_high"]) == pytest.approx((expected.low, expected.high))


@pytest.mark.e2e
def test_any_number_a_run_records_can_be_summarised_by_name(tmp_path):
    for seed in range(2):
        fake_job(
            tmp_path, seed, [f"seed.value={seed}"], seed,
            best_val_acc=0.6 + seed / 10, calibration={"ece": 0.1 * (seed + 1)}, flag=True,
        )  # fmt: skip
    built = report.build(tmp_path, ["best_val_acc", "calibration.ece"])
    group = built.groups["all"]
    assert group["best_val_acc"]["mean"] == pytest.approx(0.65)
    assert group["calibration.ece"]["mean"] == pytest.approx(0.15)
    assert "best_val_acc" not in report.build(tmp_path).groups["all"]  # only when named
    done = run_cli("repro.report", str(tmp_path), "best_val_acc", "flag")
    assert done.returncode == 2 and "flag: no finished job's summary.json" in done.stderr
    done = run_cli("repro.report", str(tmp_path), "calibration.ece")
    assert done.returncode == 0 and "| all | calibration.ece | 2 |" in done.stdout


def test_looks_fall_after_each_round_and_share_the_error_rate():
    rule = Rule("val_acc", round=3, budget=10, target_width=None, confidence=0.95)
    assert rule.looks() == [3, 6, 9, 10]
    assert rule.look_confidence == pytest.approx(1 - 0.05 / 4)
    assert Rule("val_acc", 1, 3, None, 0.9).look_confidence == pytest.approx(1 - 0.1 / 2)  # 2, 3
    with pytest.raises(ConfigError, match=re.escape("hydra.sweeper.budget=1 is not allowed")):
        Rule("val_acc", round=2, budget=1, target_width=None, confidence=0.95).check()


def test_a_look_stops_when_the_interval_excludes_zero_or_is_narrow_enough():
    rule = Rule("val_loss", round=2, budget=6, target_width=None, confidence=0.95)
    clear = [-0.31, -0.28, -0.30, -0.27]
    seen, why = look(clear, rule)
    expected = stats.ttest_1samp(clear, 0).confidence_interval(rule.look_confidence)
    assert (seen["ci_low"], seen["ci_high"]) == pytest.approx((expected.low, expected.high))
    assert "excludes 0: b gives the lower val_loss" in why
    assert look([0.01, -0.012, 0.004, -0.002], rule)[1] is None  # holds 0: go on
    narrow = Rule("val_loss", round=2, budget=6, target_width=0.1, confidence=0.95)
    assert (
        "narrower than hydra.sweeper.target_width=0.1"
        in look([0.01, -0.012, 0.004, -0.002], narrow)[1]
    )
    # No spread (identical configs give 0 on every seed): no interval, no decision either way.
    assert look([0.0, 0.0, 0.0], narrow) == ({"seeds": 3, "difference": 0.0, "ci_low": 0.0,
                                              "ci_high": 0.0}, None)  # fmt: skip


def sweeper_over(sweep_dir, metric="val_acc", budget=4):
    """The sweeper on a folder whose jobs already ran: it decides without launching any."""
    sweeper = AdaptiveSeeds(metric, round=2, budget=budget, target_width=None, confidence=0.95)
    sweeper.config, sweeper.launcher, sweeper.sweep_dir = OmegaConf.create({}), None, sweep_dir
    sweeper.shared, sweeper.configs = ["trainer.epochs=3"], ["amp=off", "amp=bf16"]
    return sweeper


def test_the_sweeper_reads_back_finished_jobs_and_refuses_a_folder_of_another_comparison(
    tmp_path,
):
    for seed in range(4):
        for which, (config, values) in enumerate((("amp=off", A), ("amp=bf16", B))):
            overrides = ["trainer.epochs=3", config, f"seed.value={seed}"]
            fake_job(tmp_path, 2 * seed + which, overrides, seed, val_acc=values[seed])
    decision = sweeper_over(tmp_path)._run()  # a launch would fail: there is no launcher
    assert (
        decision["resolved"]
        and decision["seeds"] == 4
        and decision["why"].startswith("resolved after 4 seeds")
    )
    assert json.loads((tmp_path / "adaptive_seeds.json").read_text()) == decision
    assert "## Adaptive seeds: val_acc of b = amp=bf16 vs a = amp=off" in render.markdown(
        report.build(tmp_path)
    )
    with pytest.raises(ConfigError, match=re.escape("hydra.sweeper.metric='val_accuracy'")):
        sweeper_over(tmp_path, metric="val_accuracy")._run()
    other = sweeper_over(tmp_path)
    other.configs = ["amp=off", "amp=fp16"]
    with pytest.raises(UserError, match=re.escape("job 1 there ran trainer.epochs=3 amp=bf16")):
        other._run()


# The sweeper's command: the two configs are the two values of the one swept key.
ADAPTIVE = ["-m", "hydra/sweeper=adaptive_seeds", "hydra.sweeper.round=2"]


def trained(sweep_dir):
    """Job folder -> (attempts recorded, summary.json's time): what a rerun must not touch."""
    return {
        job.name: (len((job / "attempts.jsonl").read_text().splitlines()),
                   (job / "summary.json").stat().st_mtime_ns)
        for job in sweep_dir.iterdir() if (job / "summary.json").is_file()
    }  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
def test_a_real_difference_stops_before_the_budget_and_a_rerun_continues(tmp_path):
    # Three shapes: a network that learns (lr 0.05) against one that cannot (lr 0).
    root = make_image_tree(tmp_path / "data")
    sweep_dir = tmp_path / "sweep"
    command = [
        *ADAPTIVE, *(o for o in IMAGEFOLDER if not o.startswith("optimizer.lr")),
        f"data.root={root}", "optimizer.lr=0.05,0",
        "hydra.sweeper.metric=val_loss", "hydra.sweeper.budget=6", f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    done = run_cli("repro.train", *command)
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    decision = json.loads((sweep_dir / "adaptive_seeds.json").read_text())
    assert decision["resolved"] and decision["seeds"] < 6, decision["why"]
    assert "b gives the higher val_loss" in decision["why"]  # b: the one that does not learn
    jobs = 2 * decision["seeds"]
    assert sorted(trained(sweep_dir), key=int) == [str(job) for job in range(jobs)]
    assert decision["why"] in done.stdout  # the printed report says how it ended
    rounds = re.findall(
        r"^.*\d+ seeds per config: val_loss\(b\) - val_loss\(a\) = .*$",
        done.stdout + done.stderr,
        re.MULTILINE,
    )  # one line a round
    assert len(rounds) == len(decision["looks"]) and rounds[-1].endswith("; resolved"), rounds
    summary = json.loads((sweep_dir / "sweep_summary.json").read_text())
    assert summary["adaptive"] == decision
    paired = summary["comparisons"][0]["val_loss"]
    assert paired["test"] == f"paired: {decision['seeds']} shared seeds"

    # As if the sweep had been killed in its last round: the same command again runs only the
    # missing jobs, to the same weights, and reaches the same decision.
    before = trained(sweep_dir)
    last = [str(jobs - 2), str(jobs - 1)]
    hashes = {job: json.loads((sweep_dir / job / "summary.json").read_text()) for job in last}
    for job in last:
        shutil.rmtree(sweep_dir / job)
    (sweep_dir / "adaptive_seeds.json").unlink()
    again = run_cli("repro.train", *command)
    assert again.returncode == 0, sweep_said(again, sweep_dir)
    after = trained(sweep_dir)
    assert {job: after[job] for job in before if job not in last} == {
        job: before[job] for job in before if job not in last
    }
    for job in last:
        rerun = json.loads((sweep_dir / job / "summary.json").read_text())
        assert rerun["weights_sha256"] == hashes[job]["weights_sha256"]
    assert json.loads((sweep_dir / "adaptive_seeds.json").read_text()) == decision


@pytest.mark.e2e
@pytest.mark.slow
def test_identical_configs_spend_the_budget_unresolved_and_a_larger_budget_goes_on(tmp_path):
    sweep_dir = tmp_path / "sweep"
    # logger.progress changes nothing trained: for each seed both configs give the same weights.
    command = [
        *ADAPTIVE, *tiny("trainer.num_threads=1", "dataloader.num_workers=1"),
        "logger.progress=off,auto", f"hydra.sweep.dir={sweep_dir}",
    ]  # fmt: skip
    named = "hydra.callbacks.sweep_report.metrics=[best_val_acc]"  # a number to summarise too
    done = run_cli("repro.train", *command, "hydra.sweeper.budget=2", named)
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    groups = json.loads((sweep_dir / "sweep_summary.json").read_text())["groups"]
    assert groups["logger.progress=off"]["best_val_acc"]["count"] == 2
    decision = json.loads((sweep_dir / "adaptive_seeds.json").read_text())
    assert not decision["resolved"] and decision["seeds"] == 2
    assert decision["why"].startswith("not resolved: the budget of 2 seeds per config is spent")
    assert "every seed gave the same difference (0)" in decision["why"]
    assert "not resolved" in (sweep_dir / "sweep_summary.md").read_text()

    # A larger budget goes on; the jobs run in the configured launcher (joblib, two at a time).
    before = trained(sweep_dir)
    parallel = ["hydra/launcher=joblib", "hydra.launcher.n_jobs=2"]
    done = run_cli("repro.train", *command, *parallel, "hydra.sweeper.budget=4")
    assert done.returncode == 0, sweep_said(done, sweep_dir)
    after = trained(sweep_dir)
    assert {job: after[job] for job in before} == before  # the first round is not retrained
    assert sorted(after, key=int) == [str(job) for job in range(8)]
    decision = json.loads((sweep_dir / "adaptive_seeds.json").read_text())
    assert not decision["resolved"] and [look["seeds"] for look in decision["looks"]] == [2, 4]
    summaries = [
        json.loads((sweep_dir / str(job) / "summary.json").read_text()) for job in range(8)
    ]
    assert [s["seed"] for s in summaries] == [0, 0, 1, 1, 2, 2, 3, 3]  # job 2s and 2s + 1: seed s
    assert all(
        a["weights_sha256"] == b["weights_sha256"]
        for a, b in zip(summaries[::2], summaries[1::2], strict=True)
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_the_sweeper_refuses_what_is_not_two_configs_in_one_line(tmp_path):
    for arguments, message in (
        (["amp=off,bf16", "optimizer.lr=0.1,0.2"], "these arguments sweep 2 keys"),
        (["amp=off,bf16", "seed=0,1"], "runs seeds 0, 1, 2, ... itself"),
    ):
        done = run_cli("repro.train", *ADAPTIVE, *arguments, f"hydra.sweep.dir={tmp_path}")
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


# ---- the unit: the report's choice of test (fast, in-process) ------------------------------


def test_one_shared_seed_falls_back_to_welch_and_two_make_a_paired_headline():
    a = [(0, 0.50), (1, 0.55), (2, 0.52)]
    one_shared = [(2, 0.60), (7, 0.58), (8, 0.61)]
    found = report.compare(a, one_shared)
    welch = difference_of_means([v for _, v in a], [v for _, v in one_shared])
    assert found["test"] == "Welch: seeds not shared" and found["paired"] is None
    assert (found["difference"], found["ci_low"], found["ci_high"]) == (
        welch.difference, welch.ci_low, welch.ci_high,
    )  # fmt: skip
    two_shared = [(1, 0.60), (2, 0.58), (9, 0.70)]
    found = report.compare(a, two_shared)
    paired = paired_difference([0.55, 0.52], [0.60, 0.58])
    assert found["test"] == "paired: 2 shared seeds (2 unmatched jobs left out)"
    assert found["difference"] == pytest.approx(0.055) == paired.difference
    assert (found["ci_low"], found["ci_high"]) == (paired.ci_low, paired.ci_high)
    assert found["welch"]["difference"] == pytest.approx(
        statistics.fmean([0.6, 0.58, 0.7]) - 0.52333333
    )


def test_a_look_stops_on_the_intervals_width_not_its_half_width():
    differences = [0.01, -0.012, 0.004, -0.002]
    rule = Rule("val_loss", round=2, budget=6, target_width=None, confidence=0.95)
    seen, _ = look(differences, rule)
    width = seen["ci_high"] - seen["ci_low"]
    wider = Rule("val_loss", round=2, budget=6, target_width=width * 1.01, confidence=0.95)
    between = Rule("val_loss", round=2, budget=6, target_width=width * 0.75, confidence=0.95)
    assert "narrower than" in look(differences, wider)[1]
    assert look(differences, between)[1] is None  # the half-width is below it; the width is not


# ---- the unit: the verdicts (fast, in-process) ---------------------------------------------


def paired_sweep(sweep_dir, configs, a_values, b_values):
    """Jobs 2s (config a) and 2s + 1 (config b) under seed s; `*_values`: seed -> summary."""
    for seed, (a, b) in enumerate(zip(a_values, b_values, strict=True)):
        fake_job(sweep_dir, 2 * seed, [configs[0], f"seed.value={seed}"], seed, **a)
        fake_job(sweep_dir, 2 * seed + 1, [configs[1], f"seed.value={seed}"], seed, **b)
    (comparison,) = report.build(sweep_dir).comparisons
    return comparison


NOISE = [0.004, -0.006, 0.001, 0.005, -0.003, -0.002]  # b - a about 0: an interval holding 0


def test_the_verdict_names_the_better_group_by_the_metrics_direction(tmp_path):
    # bf16 (b) has the higher val_acc and the higher val_loss: better by one, worse by the other.
    a_values = [{"val_acc": x, "val_loss": 1.0 - x, "train_loss": 0.5} for x in A]
    b_values = [
        {"val_acc": x, "val_loss": 1.05 - a + n, "train_loss": 0.5 + n}
        for x, a, n in zip(B, A, NOISE, strict=True)
    ]
    got = paired_sweep(tmp_path, ["amp=off", "amp=bf16"], a_values, b_values)
    assert got["val_acc"]["ci_low"] > 0 and got["val_loss"]["ci_low"] > 0  # both b - a > 0
    assert (got["val_acc"]["verdict"], got["val_acc"]["better"]) == (
        "amp=bf16 better than amp=off", "b",
    )  # fmt: skip
    assert (got["val_loss"]["verdict"], got["val_loss"]["better"]) == (
        "amp=off better than amp=bf16", "a",
    )  # fmt: skip
    assert got["train_loss"]["ci_low"] < 0 < got["train_loss"]["ci_high"]
    assert (got["train_loss"]["verdict"], got["train_loss"]["better"]) == (
        "no difference shown", None,
    )  # fmt: skip
    built = report.build(tmp_path)
    text = render.markdown(built)
    assert "| Welch 95% CI | verdict |" in text
    assert re.search(r"\| val_acc \|.*\| amp=bf16 better than amp=off \|\n", text)
    assert re.search(r"\| train_loss \|.*\| no difference shown \|\n", text)
    render.write(built)
    written = json.loads((tmp_path / "sweep_summary.json").read_text())["comparisons"][0]
    assert written["val_loss"]["verdict"] == "amp=off better than amp=bf16"


def test_losses_under_two_objectives_are_not_compared_and_accuracy_still_is(tmp_path):
    swept = ["objective=cross_entropy", "objective=focal"]
    a_values = [{"val_acc": x, "val_loss": 1.0, "train_loss": 1.0, "val_top5": 0.9} for x in A]
    b_values = [
        {"val_acc": x, "val_loss": 0.3 + n, "train_loss": 0.3 + n, "val_top5": 0.9 + n}
        for x, n in zip(B, NOISE, strict=True)
    ]
    got = paired_sweep(tmp_path, swept, a_values, b_values)
    assert got["val_loss"]["ci_high"] < 0  # a clear difference, of two other quantities
    for loss in ("val_loss", "train_loss"):
        assert (got[loss]["verdict"], got[loss]["better"]) == (
            "not comparable: the objective differs", None,
        )  # fmt: skip
    assert got["val_acc"]["verdict"] == "objective=focal better than objective=cross_entropy"
    assert got["val_top5"]["verdict"] == "no difference shown"  # a score, not a loss
    text = render.markdown(report.build(tmp_path))
    assert re.search(r"\| val_loss \|.*\| not comparable: the objective differs \|\n", text)


@pytest.mark.parametrize(
    ("keys", "metric", "why"),
    [
        (["objective"], "val_loss", "the objective differs"),
        (["+objective.gamma"], "test_loss", "the objective differs"),
        (["objective._target_"], "best_val_loss", "the objective differs"),
        (["objective"], "ema_val_logit_penalty", "the objective differs"),  # a term (`terms`)
        (["objective"], "train_logit_penalty", "the objective differs"),  # every train_ column
        (["objective"], "val_acc", None),
        (["objective"], "val_f1", None),
        (["objective"], "train_s", None),  # a time
        (["data"], "val_acc", "the data differ"),
        (["data.val_size"], "test_acc", "the data differ"),
        (["data.root"], "train_loss", "the data differ"),
        (["data"], "wall_s", None),
        (["data.cache", "data.augment", "data.mean"], "val_acc", None),  # the same images
        (["augment.mixup_alpha"], "val_loss", None),
        (["amp", "optimizer.lr", "dataloader.num_workers=2"], "val_loss", None),
    ],
)
def test_which_swept_keys_make_a_metric_another_quantity(keys, metric, why):
    assert verdict.incomparable(metric, keys, terms={"logit_penalty"}) == why


def test_a_columns_direction_comes_from_its_name_else_from_the_monitor_mode(tmp_path):
    assert verdict.verdict("val_loss", -0.2, -0.1).verdict == "b better than a"
    assert verdict.verdict("test_acc", -0.2, -0.1).verdict == "a better than b"
    assert verdict.verdict("wall_s", 1.0, 2.0).verdict == "a better than b"
    assert verdict.verdict("val_class_acc_3", 0.1, 0.2).verdict == "b better than a"
    assert verdict.verdict("val_acc", 0.0, 0.0).verdict == "no difference shown"  # no spread
    unknown = verdict.verdict("val_margin", -0.2, -0.1, "x", "y")
    assert unknown.as_dict() == {
        "better": None, "verdict": "x higher than y (which is better is not known)",
    }  # fmt: skip
    # A column the jobs monitored takes trainer.monitor_mode, as best.pt did.
    a_values = [{"val_margin": 0.5} for _ in A]
    b_values = [{"val_margin": 0.6 + n} for n in NOISE]
    got = paired_sweep(tmp_path, ["amp=off", "amp=bf16"], a_values, b_values)
    assert (
        got["val_margin"]["verdict"]
        == "amp=bf16 higher than amp=off (which is better is not known)"
    )
    for job in tmp_path.glob("*/.hydra"):
        trainer = {"monitor": "val_margin", "monitor_mode": "min"}
        (job / "config.yaml").write_text(yaml.safe_dump({"trainer": trainer}))
    (comparison,) = report.build(tmp_path).comparisons
    assert comparison["val_margin"]["verdict"] == "amp=off better than amp=bf16"
    (tmp_path / "0" / ".hydra" / "config.yaml").write_text("trainer: [damaged")
    (comparison,) = report.build(tmp_path).comparisons  # one job that does not say: still known
    assert comparison["val_margin"]["better"] == "a"


def test_each_round_of_the_adaptive_sweeper_is_one_line_saying_what_comes_next():
    rule = Rule("val_acc", round=2, budget=4, target_width=None, confidence=0.95)
    seen, stop = look([0.01, 0.02], rule)
    line = round_line(seen, rule, stop, last=False)
    assert line.startswith("2 seeds per config: val_acc(b) - val_acc(a) = 0.015, interval [")
    assert line.endswith("; another round") and "\n" not in line
    same, _ = look([0.01, 0.01], rule)  # no spread: no interval to show
    assert round_line(same, rule, None, last=True) == (
        "2 seeds per config: val_acc(b) - val_acc(a) = 0.01; budget spent"
    )
    clear, why = look([-0.03, -0.028, -0.031, -0.027], rule)
    assert why and round_line(clear, rule, why, last=True).endswith("; resolved")


def test_the_adaptive_sweeper_says_better_and_refuses_a_metric_the_swept_key_changes(tmp_path):
    rule = Rule("val_acc", round=2, budget=6, target_width=None, confidence=0.95)
    _, why = look([-0.03, -0.028, -0.031, -0.027], rule)
    assert why.endswith("excludes 0: b gives the lower val_acc (a better than b)")
    sweeper = sweeper_over(tmp_path, metric="val_loss")
    sweeper.configs = ["objective=cross_entropy", "objective=focal"]
    allowed = "objective changes it: the objective differs"
    with pytest.raises(
        ConfigError,
        match=re.escape(
            f"hydra.sweeper.metric='val_loss' is not allowed: a metric both configs measure alike; {allowed}"
        ),
    ):
        sweeper._check_metric()
    sweeper_over(tmp_path, metric="val_acc")._check_metric()  # accuracy: the same quantity


# ---- verdict's units to the exact answer ---------------------------------------------------


@pytest.mark.parametrize(
    ("low", "high", "said"),
    [(0.1, 0.3, "higher"), (-0.3, -0.1, "lower"), (0.0, 1.0, None), (-1.0, 0.0, None),
     (0.5, 0.5, None), (math.nan, -1.0, None), (1.0, math.nan, None), (-0.2, 0.2, None)],
)  # fmt: skip
def test_an_interval_says_a_side_only_when_it_has_width_and_leaves_out_zero(low, high, said):
    assert verdict.side(low, high) == said


def test_a_metrics_direction_comes_from_its_name_else_from_the_monitor_mode():
    assert verdict.higher_is_better("val_acc") and verdict.higher_is_better("test_class_acc_3")
    assert verdict.higher_is_better("best_val_loss") is False
    assert verdict.higher_is_better("wall_s") is False
    modes = {"val_dice": "max", "val_penalty": "min"}
    assert verdict.higher_is_better("best_val_dice", modes) is True
    assert verdict.higher_is_better("val_penalty", modes) is False
    assert verdict.higher_is_better("val_other", modes) is None
    assert verdict.higher_is_better("parameters") is None  # a number of no split


def test_the_comparability_rule_reads_each_override_key_as_a_whole():
    # A number of no split never measures the data.
    assert verdict.incomparable("parameters", ["data.root=/a"]) is None
    # data.cache keeps the splits; a value holding "=" does not make another key of it.
    assert verdict.incomparable("val_acc", ["data.cache=memory=x"]) is None
    # Under two objectives every train_ column is another quantity, accuracy included.
    assert verdict.incomparable("train_acc", ["objective=focal"]) == "the objective differs"
    said = verdict.verdict("val_focal", -0.3, -0.1, keys=["objective=focal"], terms=["focal"])
    assert said.verdict == "not comparable: the objective differs" and said.better is None


# ---- report's units: reading a job's records, its numbers and groups ------------------------


def job_folder(sweep_dir, name, overrides=("amp=off",), summary=None, error=None, config=None):
    folder = sweep_dir / name
    (folder / ".hydra").mkdir(parents=True)
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(list(overrides)))
    if summary is not None:
        (folder / "summary.json").write_text(json.dumps(summary))
    if error is not None:
        (folder / "error.txt").write_text(error)
    if config is not None:
        (folder / ".hydra" / "config.yaml").write_text(config)
    return folder


def test_a_jobs_error_is_its_last_line_unless_a_later_summary_made_it_good(tmp_path):
    import os

    failed = job_folder(tmp_path, "0", error="Traceback\nValueError: lr\n")
    assert report.read_job(failed).error == "ValueError: lr" and not report.read_job(failed).ok
    assert report.read_job(job_folder(tmp_path, "1", error="")).error == "?"
    fixed = job_folder(tmp_path, "2", summary={"completed": True}, error="ValueError: lr\n")
    os.utime(fixed / "error.txt", ns=(1, 1))  # the error came first, the summary after it
    assert report.read_job(fixed).error is None and report.read_job(fixed).status == "ok"
    stale = job_folder(tmp_path, "3", summary={"completed": True}, error="OSError: full\n")
    os.utime(stale / "summary.json", ns=(1, 1))  # the summary is the older one
    assert report.read_job(stale).error == "OSError: full"
    assert report.read_job(job_folder(tmp_path, "4")).error == (
        "no summary.json (the job was killed or is still running)"
    )
    stopped = {"completed": False, "step": 40, "stopped_by_signal": 15}
    assert report.read_job(job_folder(tmp_path, "5", summary=stopped)).error == (
        "stopped at step 40 (signal 15)"
    )
    done = report.read_job(job_folder(tmp_path, "6", ["seed=1", "amp=off"], {"val_acc": 0.5}))
    assert (done.name, done.overrides, done.summary, done.error) == (
        "6", ["seed=1", "amp=off"], {"val_acc": 0.5}, None,
    )  # fmt: skip


NO_LIST = "records unreadable: .hydra/overrides.yaml holds no list of overrides"
NO_JSON = "records unreadable: not valid JSON"


@pytest.mark.parametrize(
    ("overrides", "summary", "error"),
    [
        ("- 3\n", None, NO_LIST),
        ("a: 1\n", None, NO_LIST),
        ("[a, [b]]\n", None, NO_LIST),
        ("- a\n", "[1]", "records unreadable: summary.json holds no mapping"),
        (
            "- a\n",
            "{",
            f"{NO_JSON} (Expecting property name enclosed in double quotes at line 1 column 2)",
        ),
        (
            "[\n",
            None,
            "records unreadable: not valid YAML at line 2 (did not find expected node content)",
        ),
        ("- a\n", "\n\n", f"{NO_JSON} (Expecting value at line 3 column 1)"),
    ],
)
def test_records_that_cannot_be_read_make_a_failed_job_saying_so(
    tmp_path, overrides, summary, error
):
    folder = job_folder(tmp_path, "7")
    (folder / ".hydra" / "overrides.yaml").write_text(overrides)
    if summary is not None:
        (folder / "summary.json").write_text(summary)
    job = report.read_job(folder)
    assert (job.name, job.overrides, job.summary, job.error) == ("7", [], None, error)
    assert job.status == "failed"


def test_an_empty_overrides_file_is_no_overrides_and_an_unreadable_one_names_its_error(tmp_path):
    empty = job_folder(tmp_path, "0", summary={"val_acc": 0.5})
    (empty / ".hydra" / "overrides.yaml").write_text("")
    assert report.read_job(empty).overrides == [] and report.read_job(empty).ok
    gone = job_folder(tmp_path, "1")
    (gone / ".hydra" / "overrides.yaml").unlink()
    (gone / ".hydra" / "overrides.yaml").mkdir()  # an OSError with a message
    assert report.read_job(gone).error.startswith(
        "records unreadable: a folder, not a regular file"
    )


@pytest.mark.parametrize(
    ("config", "monitor"),
    [("trainer:\n  monitor: val_loss\n  monitor_mode: min\n", ("val_loss", "min")),
     ("trainer:\n  monitor: 3\n  monitor_mode: max\n", ("3", "max")),
     ("trainer: {}\n", None), ("trainer: 3\n", None), ("[\n", None), ("", None), (None, None)],
)  # fmt: skip
def test_a_jobs_monitor_is_read_from_its_config_or_left_unknown(tmp_path, config, monitor):
    folder = job_folder(tmp_path, "0", summary={"val_acc": 0.5}, config=config)
    assert report.read_job(folder).monitor == monitor


def test_a_number_is_found_by_name_or_dotted_path_and_nothing_else_counts():
    summary = {"val_acc": 0.5, "step": 7, "completed": True, "name": "x", "env": {"threads": 4},
               "a.b": 2.5, "deep": {"er": {"x": 1}}}  # fmt: skip
    assert report.number(summary, "val_acc") == 0.5 and report.number(summary, "step") == 7.0
    assert isinstance(report.number(summary, "step"), float)
    assert report.number(summary, "env.threads") == 4.0 and report.number(summary, "a.b") == 2.5
    assert report.number(summary, "deep.er.x") == 1.0
    for missing in ("completed", "name", "env", "env.cores", "val_acc.x", "nothing"):
        assert report.number(summary, missing) is None, missing


def test_the_metrics_are_the_usual_then_the_runs_own_prefixed_numbers_then_the_named():
    jobs = [
        report.Job("0", [], {"val_acc": 0.5, "val_margin": 0.1, "train_ce": 1.0, "val_note": "x",
                             "ema_val_acc": 0.6, "best_val_acc": 0.7, "test_flag": True}, None),
        report.Job("1", [], {"test_zz": 1.0, "val_acc": 0.5}, None),
        report.Job("2", [], None, "failed"),
    ]  # fmt: skip
    assert report.metrics_of(jobs, ["best_val_acc", "val_acc", "best_val_acc", "env.seed"]) == [
        *report.METRICS, "ema_val_acc", "test_zz", "train_ce", "val_margin", "best_val_acc",
        "env.seed",
    ]  # fmt: skip


def test_the_seed_override_in_any_spelling_is_not_a_group():
    for seed in ("seed=1", "+seed=1", "~seed", "seed.value=2", "++seed.value=2"):
        assert report._is_seed(seed), seed
    for other in ("seeds=1", "seed.mode=x", "data.seed=1", "trainer.seed=3"):
        assert not report._is_seed(other), other


def test_jobs_are_read_in_number_order_and_grouped_by_what_they_do_not_share(tmp_path):
    for name, overrides in [("10", ["e=3", "amp=off", "seed=2"]), ("2", ["e=3", "amp=bf16", "seed=1"]),
                            ("1", ["e=3", "seed=0", "amp=off", "lr=2"])]:  # fmt: skip
        job_folder(tmp_path, name, overrides, {"val_acc": 0.5})
    (tmp_path / "not_a_job").mkdir()
    jobs = report.collect(tmp_path)
    assert [(j.name, j.group) for j in jobs] == [("1", "amp=off lr=2"), ("2", "amp=bf16"),
                                                 ("10", "amp=off")]  # fmt: skip
    one = tmp_path / "one"
    job_folder(one, "0", ["seed=0", "amp=off"], {"val_acc": 0.5})
    assert [j.group for j in report.collect(one)] == ["all"]
    assert report.collect(tmp_path / "empty") == []


def test_a_paired_comparison_says_how_many_jobs_had_no_partner():
    a = [(0, 0.5), (1, 0.6), (2, 0.55), (2, 0.9), (None, 0.1)]  # seed 2 twice: no single partner
    b = [(0, 0.52), (1, 0.63), (3, 0.7)]
    found = report.compare(a, b)
    assert found["test"] == "paired: 2 shared seeds (4 unmatched jobs left out)"
    expected = paired_difference([0.5, 0.6], [0.52, 0.63]).as_dict()
    assert {k: found[k] for k in expected} == expected and found["paired"] == expected
    assert found["welch"] == difference_of_means([v for _, v in a], [v for _, v in b]).as_dict()
    both = report.compare([(0, 0.5), (1, 0.6)], [(1, 0.61), (0, 0.52)])
    assert both["test"] == "paired: 2 shared seeds"


# ---- the adaptive sweeper's own run, with a launcher that writes the jobs' records ----------


class RecordingLauncher:
    """Writes each launched job's folder as a finished job whose val_acc comes from `values`
    (config -> seed -> value); a value of None leaves the job failed."""

    def __init__(self, sweep_dir, values):
        self.sweep_dir, self.values, self.batches = sweep_dir, values, []

    def launch(self, batch, initial_job_idx):
        self.batches.append((initial_job_idx, [list(o) for o in batch]))
        for offset, overrides in enumerate(batch):
            config, seed = overrides[-2], int(overrides[-1].split("=")[1])
            value = self.values[config][seed]
            summary = {"val_acc": value} if value is not None else None
            fake_job(self.sweep_dir, initial_job_idx + offset, list(overrides), seed,
                     **(summary or {}))  # fmt: skip
            if value is None:
                (self.sweep_dir / str(initial_job_idx + offset) / "error.txt").write_text("boom\n")


def launched_sweeper(sweep_dir, values, budget=4, target_width=None):
    sweeper = AdaptiveSeeds("val_acc", round=2, budget=budget, target_width=target_width,
                            confidence=0.95)  # fmt: skip
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(sweep_dir)}}})
    sweeper.sweep_dir, sweeper.launcher = sweep_dir, RecordingLauncher(sweep_dir, values)
    sweeper.shared, sweeper.configs = ["trainer.epochs=3"], ["amp=off", "amp=bf16"]
    sweeper.validate_batch_is_legal = lambda batch: None  # Hydra's check needs its loader
    return sweeper


def test_the_sweeper_launches_rounds_of_seeds_until_the_answer_is_clear(tmp_path):
    values = {"amp=off": A, "amp=bf16": B}
    sweeper = launched_sweeper(tmp_path, values, budget=6)
    decision = sweeper._run()
    jobs = [
        ["trainer.epochs=3", config, f"seed.value={seed}"]
        for seed in range(4) for config in ("amp=off", "amp=bf16")
    ]  # fmt: skip
    assert sweeper.launcher.batches == [(0, jobs[:4]), (4, jobs[4:8])]  # two rounds of two seeds
    assert decision["resolved"] and decision["seeds"] == 4 and len(decision["looks"]) == 2
    assert decision["why"].startswith("resolved after 4 seeds: the ")
    assert {k: decision[k] for k in ("a", "b", "metric", "round", "budget")} == {
        "a": "amp=off", "b": "amp=bf16", "metric": "val_acc", "round": 2, "budget": 6,
    }  # fmt: skip
    assert decision["look_confidence"] == sweeper.rule.look_confidence
    assert json.loads((tmp_path / "adaptive_seeds.json").read_text()) == decision
    assert (tmp_path / "multirun.yaml").read_text() == OmegaConf.to_yaml(sweeper.config)
    again = launched_sweeper(tmp_path, values, budget=6)
    assert again._run() == decision and again.launcher.batches == []  # read back, none run


def test_a_job_missing_from_a_batch_is_launched_alone_and_a_failed_one_stops_the_sweep(tmp_path):
    values = {"amp=off": [0.5, None], "amp=bf16": [0.6, 0.7]}
    fake_job(tmp_path, 1, ["trainer.epochs=3", "amp=bf16", "seed.value=0"], 0, val_acc=0.6)
    sweeper = launched_sweeper(tmp_path, values)
    decision = sweeper._run()
    assert [(first, len(batch)) for first, batch in sweeper.launcher.batches] == [(0, 1), (2, 2)]
    assert not decision["resolved"] and decision["seeds"] == 0 and decision["looks"] == []
    assert decision["why"] == (
        "stopped at 2 seeds: job 2 (trainer.epochs=3 amp=off seed.value=1) did not finish (see "
        f"its folder); fix it and run the same command with hydra.sweep.dir={tmp_path} to continue"
    )


def test_a_spent_budget_says_why_nothing_was_resolved(tmp_path):
    same = {"amp=off": [0.5, 0.6, 0.7, 0.8], "amp=bf16": [0.5, 0.6, 0.7, 0.8]}
    decision = launched_sweeper(tmp_path / "same", same)._run()
    assert decision["why"] == (
        "not resolved: the budget of 4 seeds per config is spent and every seed gave the same "
        "difference (0), so no interval can be formed (the two configs may train the same "
        "weights); raise hydra.sweeper.budget and run the same command with "
        f"hydra.sweep.dir={tmp_path / 'same'} to go on"
    )
    noisy = {"amp=off": [0.5, 0.6, 0.7, 0.8], "amp=bf16": [0.51, 0.58, 0.72, 0.79]}
    decision = launched_sweeper(tmp_path / "noisy", noisy)._run()
    last = decision["looks"][-1]
    assert decision["why"].startswith(
        "not resolved: the budget of 4 seeds per config is spent and the interval "
        f"[{last['ci_low']:.4g}, {last['ci_high']:.4g}] still holds 0; raise "
    )
    assert decision["seeds"] == 4 and not decision["resolved"]


@pytest.mark.parametrize(
    ("arguments", "message"),
    [(["lr=0.1,0.2", "seed=3"], "seed='3' is not allowed: the adaptive sweeper runs seeds 0, 1, "
      "2, ... itself: leave it out"),
     (["lr=0.1,0.2", "+seed.value=3"], "+seed.value='3' is not allowed: the adaptive sweeper "
      "runs seeds 0, 1, 2, ... itself: leave it out"),
     (["lr=interval(0,1)"], "lr='interval(0,1)' is not allowed: two values to compare: a,b"),
     (["lr=0.1,0.2,0.3"], "hydra/sweeper=adaptive_seeds compares two configs: give one key two "
      "values (e.g. optimizer.lr=0.2,0.1); these arguments sweep 1 keys: lr=0.1,0.2,0.3"),
     (["lr=0.1", "wd=1,2", "amp=a,b"], "hydra/sweeper=adaptive_seeds compares two configs: give "
      "one key two values (e.g. optimizer.lr=0.2,0.1); these arguments sweep 2 keys: lr=0.1 "
      "wd=1,2 amp=a,b")],
)  # fmt: skip
def test_the_two_configs_come_from_one_key_with_two_values(arguments, message):
    from types import SimpleNamespace

    sweeper = AdaptiveSeeds("val_acc", round=2, budget=4, target_width=None, confidence=0.95)
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    with pytest.raises(UserError) as refused:
        sweeper._two_configs(arguments)
    assert str(refused.value) == message
    shared, configs = sweeper._two_configs(["trainer.epochs=3", "lr=0.2,0.1", "~x"])
    # `~x=null` deletes x whatever its value, as `~x` does (Hydra parses both to no value).
    assert (shared, configs) == (["trainer.epochs=3", "~x=null"], ["lr=0.2", "lr=0.1"])


def test_a_sweep_with_another_subdir_or_rule_is_one_line(tmp_path, capsys):
    from types import SimpleNamespace

    sweeper = AdaptiveSeeds("val_acc", round=0, budget=4, target_width=None, confidence=0.95)
    sweeper.config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "x"}}})
    sweeper.hydra_context, sweeper.sweep_dir = SimpleNamespace(config_loader=None), tmp_path
    with pytest.raises(SystemExit):
        sweeper.sweep(["lr=0.1,0.2"])
    assert (
        capsys.readouterr().err == "error: hydra.sweeper.round=0 is not allowed: an integer >= 1\n"
    )
    sweeper.rule = Rule("val_acc", 2, 4, None, 0.95)
    with pytest.raises(SystemExit):
        sweeper.sweep(["lr=0.1,0.2"])
    assert capsys.readouterr().err == (
        "error: hydra.sweep.subdir='x' is not allowed: ${hydra.job.num}, the default\n"
    )
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("rule", "message"),
    [(Rule("m", True, 4, None, 0.9), "hydra.sweeper.round=True is not allowed: an integer >= 1"),
     (Rule("m", 2, 1.5, None, 0.9), "hydra.sweeper.budget=1.5 is not allowed: an integer >= 2 (seeds)"),
     (Rule("m", 2, 4, 0, 0.9), "hydra.sweeper.target_width=0 is not allowed: null or > 0"),
     (Rule("m", 2, 4, None, 1.0), "hydra.sweeper.confidence=1.0 is not allowed: between 0 and 1"),
     (Rule("m", 2, 4, None, 0), "hydra.sweeper.confidence=0 is not allowed: between 0 and 1")],
)  # fmt: skip
def test_each_setting_of_the_rule_is_refused_naming_what_is_allowed(rule, message):
    with pytest.raises(ConfigError) as refused:
        rule.check()
    assert str(refused.value) == message
    Rule("m", 1, 2, 0.5, 0.5).check()  # the least allowed of each


def test_an_error_without_words_is_named_by_its_type(tmp_path, monkeypatch):
    def silent(*_):
        raise ValueError()

    monkeypatch.setattr(report.received, "load_yaml", silent)
    job = report.read_job(job_folder(tmp_path, "0"))
    assert job.error == "records unreadable: ValueError"


def test_an_error_file_as_old_as_the_summary_still_fails_the_job(tmp_path):
    import os

    folder = job_folder(tmp_path, "0", summary={"completed": True}, error="OSError: full\n")
    for name in ("summary.json", "error.txt"):
        os.utime(folder / name, ns=(5_000_000_000, 5_000_000_000))
    assert report.read_job(folder).error == "OSError: full"


def test_the_seed_override_is_read_by_its_key_alone():
    assert report._is_seed("seed.value=a=b")  # the key is what comes before the first "="
    assert not report._is_seed("Xseed=1") and not report._is_seed("Xseed.value=1")


def test_a_stopped_job_is_left_out_and_a_metric_one_group_lacks_is_not_compared(tmp_path):
    fake_job(tmp_path, 0, ["amp=off", "seed.value=0"], 0, val_acc=0.5, val_margin=0.1)
    fake_job(tmp_path, 1, ["amp=off", "seed.value=1"], 1, val_acc=0.6, val_margin=0.2)
    fake_job(tmp_path, 2, ["amp=bf16", "seed.value=0"], 0, val_acc=0.7)
    fake_job(tmp_path, 3, ["amp=bf16", "seed.value=1"], 1, val_acc=0.8)
    stopped = tmp_path / "4"
    fake_job(tmp_path, 4, ["amp=bf16", "seed.value=2"], 2, val_acc=0.0)
    summary = json.loads((stopped / "summary.json").read_text())
    (stopped / "summary.json").write_text(json.dumps({**summary, "completed": False}))
    built = report.build(tmp_path)
    assert built.groups["amp=bf16"]["val_acc"]["count"] == 2  # the stopped job is not counted
    (comparison,) = built.comparisons
    assert "val_acc" in comparison and "val_margin" not in comparison
    assert "val_margin" in built.groups["amp=off"] and "val_margin" not in built.groups["amp=bf16"]


def test_the_adaptive_sweepers_metric_is_summarised_whatever_its_name(tmp_path):
    for seed in range(2):
        fake_job(tmp_path, 2 * seed, ["amp=off", f"seed.value={seed}"], seed, best_val_acc=0.5)
        fake_job(tmp_path, 2 * seed + 1, ["amp=bf16", f"seed.value={seed}"], seed, best_val_acc=0.6)
    (tmp_path / "adaptive_seeds.json").write_text(json.dumps({"metric": "best_val_acc"}))
    built = report.build(tmp_path)
    assert built.metrics[-1] == "best_val_acc" and "best_val_acc" in built.groups["amp=off"]
    assert built.adaptive == {"metric": "best_val_acc"}


def test_an_objectives_own_terms_are_not_compared_across_objectives(tmp_path):
    swept = ["objective=cross_entropy", "objective=focal"]
    a_values = [{"val_acc": x, "train_logit_penalty": 0.1, "val_logit_penalty": 0.1,
                 "train_s": 5.0} for x in A]  # fmt: skip
    b_values = [{"val_acc": x, "train_logit_penalty": 0.5 + n, "val_logit_penalty": 0.5 + n,
                 "train_s": 5.0 + n} for x, n in zip(B, NOISE, strict=True)]  # fmt: skip
    got = paired_sweep(tmp_path, swept, a_values, b_values)
    assert got["val_logit_penalty"]["verdict"] == "not comparable: the objective differs"
    assert got["train_s"]["verdict"] == "no difference shown"  # a time, not a term


def test_a_seed_one_group_ran_twice_has_no_single_partner():
    a = [(0, 0.5), (1, 0.6), (2, 0.55), (2, 0.9)]
    found = report.compare(a, [(0, 0.52), (1, 0.63), (2, 0.7)])
    assert found["test"] == "paired: 2 shared seeds (3 unmatched jobs left out)"
    assert report._by_seed(a) == {0: 0.5, 1: 0.6}


def test_the_sweepers_setup_and_sweep_run_the_whole_comparison(tmp_path, monkeypatch, caplog):
    import logging
    from types import SimpleNamespace

    from hydra_plugins.repro import adaptive_seeds

    made = []
    launcher = RecordingLauncher(tmp_path, {"lr=0.2": A, "lr=0.1": B})

    def instantiate_launcher(**given):
        made.append(given)
        return launcher

    plugins = SimpleNamespace(instantiate_launcher=instantiate_launcher)
    monkeypatch.setattr(adaptive_seeds.Plugins, "instance", lambda: plugins)
    sweeper = AdaptiveSeeds("val_acc", round=2, budget=4, target_width=None, confidence=0.95)
    config = OmegaConf.create(
        {"hydra": {"sweep": {"dir": str(tmp_path), "subdir": "${hydra.job.num}"}}}
    )
    context = SimpleNamespace(config_loader=None)
    sweeper.setup(hydra_context=context, task_function=len, config=config)
    assert made == [{"hydra_context": context, "task_function": len, "config": config}]
    assert (sweeper.config, sweeper.hydra_context, sweeper.sweep_dir) == (config, context, tmp_path)
    sweeper.validate_batch_is_legal = lambda batch: None
    with caplog.at_level(logging.INFO, logger="hydra_plugins.repro.adaptive_seeds"):
        decision = sweeper.sweep(["trainer.epochs=3", "lr=0.2,0.1"])
    assert decision["resolved"] and (decision["a"], decision["b"]) == ("lr=0.2", "lr=0.1")
    assert launcher.batches[0][1][0] == ["trainer.epochs=3", "lr=0.2", "seed.value=0"]
    *rounds, said = [r.getMessage() for r in caplog.records if r.name.endswith("adaptive_seeds")]
    assert [line.rsplit("; ", 1)[1] for line in rounds] == ["another round", "resolved"]
    assert said == f"{decision['why']} ({tmp_path / 'adaptive_seeds.json'})"


def test_a_look_decides_from_two_seeds_and_names_an_unknown_direction_plainly():
    rule = Rule("val_margin", round=2, budget=6, target_width=None, confidence=0.95)
    seen, why = look([1.0, 1.0001], rule)  # two seeds: an interval, here far from 0
    assert seen["seeds"] == 2 and why.endswith("excludes 0: b gives the higher val_margin")
    held = [0.01, -0.012, 0.004, -0.002]
    width = look(held, rule)[0]["ci_high"] - look(held, rule)[0]["ci_low"]
    exactly = Rule("val_margin", round=2, budget=6, target_width=width, confidence=0.95)
    assert look(held, exactly)[1] is None  # narrower than, not as narrow as
    # Fields, not the class: Hydra's plugin scan may import the module a second time.
    assert dataclasses.astuple(AdaptiveSeeds("m", 2, 4, 0.5, 0.9).rule) == ("m", 2, 4, 0.5, 0.9)


def test_a_spent_budget_of_three_looks_reports_the_last(tmp_path):
    same = {"amp=off": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0], "amp=bf16": [0.5, 0.6, 0.7, 0.8, 0.9, 1.0]}
    sweeper = launched_sweeper(tmp_path / "deep" / "er", same, budget=6)  # folders made
    seen = []
    sweeper.validate_batch_is_legal = seen.append
    decision = sweeper._run()
    assert [look["seeds"] for look in decision["looks"]] == [2, 4, 6] and decision["seeds"] == 6
    assert decision["why"].startswith("not resolved: the budget of 6 seeds per config is spent")
    assert seen == [batch for _, batch in sweeper.launcher.batches]  # each batch checked


def test_a_folder_of_another_comparison_or_metric_is_refused_word_for_word(tmp_path):
    for seed in range(2):
        for which, config in enumerate(("amp=off", "amp=bf16")):
            fake_job(tmp_path, 2 * seed + which, ["trainer.epochs=3", config, f"seed.value={seed}"],
                     seed, val_acc=0.5)  # fmt: skip
    other = sweeper_over(tmp_path)
    other.configs = ["amp=off", "amp=fp16"]
    with pytest.raises(UserError) as refused:
        other._run()
    assert str(refused.value) == (
        f"hydra.sweep.dir={tmp_path}: job 1 there ran trainer.epochs=3 amp=bf16 seed.value=0, not "
        "trainer.epochs=3 amp=fp16 seed.value=0; give another comparison its own folder"
    )
    with pytest.raises(ConfigError) as refused:
        sweeper_over(tmp_path, metric="val_accuracy")._run()
    assert str(refused.value) == (
        "hydra.sweeper.metric='val_accuracy' is not allowed: one of val_acc, val_loss, train_loss, "
        "wall_s, seed"
    )


def test_a_seed_given_with_the_comparison_is_refused_showing_its_whole_value():
    from types import SimpleNamespace

    sweeper = AdaptiveSeeds("val_acc", round=2, budget=4, target_width=None, confidence=0.95)
    sweeper.hydra_context = SimpleNamespace(config_loader=None)
    with pytest.raises(ConfigError) as refused:
        sweeper._two_configs(["lr=0.1,0.2", "seed='x=y'"])
    assert refused.value.value == "'x=y'"
    assert sweeper._two_configs(["lr=0.1,0.2", "Xseed=3"])[0] == ["Xseed=3"]  # not the seed
