"""engine/loop.py on a trainer assembled in this process over a few images (two steps an
epoch): where the loop stops and why, what each evaluation row holds, what it checkpoints, and
its state's round trip."""

from __future__ import annotations

import csv
import dataclasses

import pytest
import torch

from repro.core import build
from repro.core.engine import assembly
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs.checkpoint import Checkpointer
from repro.core.runtime.distributed import Context
from repro.core.watch.callbacks import Callbacks

from conftest import StepCounter, compose_config, tiny

SEED = 3
SIZES = ("data.train_size=64", "data.val_size=32", "data.test_size=16")
BATCHES = ("trainer.batch_size=32", "trainer.eval_batch_size=16", "trainer.epochs=2")
SMALL = tiny(*SIZES, *BATCHES, "logger.fingerprint_every_steps=1", "memory_format=contiguous")


def assembled(tmp_path, *overrides: str):
    """A run's trainer as train.py makes it, at step 0, writing into `tmp_path`."""
    cfg = compose_config(*SMALL, *overrides)
    tmp_path.mkdir(parents=True, exist_ok=True)
    knobs = assembly.apply_knobs(cfg, Context())
    parts = assembly.build_parts(cfg, knobs, SEED, build.splits(cfg, SEED))
    checkpointer = Checkpointer(tmp_path / "checkpoints", cfg.trainer.keep_checkpoints)
    outputs = assembly.outputs(cfg, tmp_path, checkpointer, Context())
    saved = {"classes": list(parts.data.classes), "root_seed": SEED}
    return assembly.trainer(cfg, knobs, parts, outputs, saved)


def rows(tmp_path, name: str = "metrics.csv") -> list[dict[str, str]]:
    with (tmp_path / name).open(newline="") as file:
        return list(csv.DictReader(file))


def losses(tmp_path) -> dict[int, float]:
    lines = (tmp_path / "fingerprints.csv").read_text().splitlines()
    return {int(step): float(loss) for step, loss, _ in (line.split(",") for line in lines)}


def test_a_run_trains_to_its_end_and_each_epochs_row_holds_its_own_losses(tmp_path):
    trainer = assembled(tmp_path)
    assert trainer.total_steps == 4 and trainer.validates
    last = trainer.fit()
    trainer.outputs.metrics.close()
    pos = trainer.state.position
    assert (pos.epoch, pos.batch, pos.step) == (2, 0, 4) and pos.train_seconds > 0
    written = rows(tmp_path)
    assert [(r["epoch"], r["step"]) for r in written] == [("1", "2"), ("2", "4")]
    step_loss = losses(tmp_path)
    assert sorted(step_loss) == [1, 2, 3, 4]
    for row, steps in zip(written, ((1, 2), (3, 4)), strict=True):
        mean = sum(step_loss[s] for s in steps) / 2
        assert float(row["train_loss"]) == pytest.approx(mean, rel=1e-6)
        assert float(row["images_per_s"]) > 0
        assert 0 <= float(row["data_wait_frac"]) <= 1 and float(row["train_s"]) > 0
    assert float(written[1]["train_s"]) > float(written[0]["train_s"])
    assert float(written[0]["lr"]) > 0  # mid-schedule; the row holds the optimizer's own
    assert float(written[1]["lr"]) == pytest.approx(trainer.optimizer.param_groups[0]["lr"])
    assert last == trainer.state.last_eval and last["step"] == 4
    assert (last["val_loss"], last["val_acc"]) == (
        pytest.approx(float(written[1]["val_loss"])),
        pytest.approx(float(written[1]["val_acc"])),
    )
    again = trainer.evaluate(trainer.model)  # the row's figures are the model's at the end
    assert again["loss"] == pytest.approx(last["val_loss"], rel=1e-6)
    assert again["acc"] == pytest.approx(last["val_acc"], abs=1e-12)
    assert (pos.loss_sum, pos.loss_count, pos.term_sums) == (0.0, 0, {})  # reset by the row
    files = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "step-00000004.pt" in files and "last.pt" in files
    assert trainer.state.stopped_by is None and not trainer.state.stopped_early


def test_a_halt_ends_the_run_at_its_step_with_a_checkpoint_there(tmp_path):
    trainer = assembled(tmp_path, "trainer.halt_at_step=3", "trainer.keep_checkpoints=5")
    last = trainer.fit()
    assert trainer.state.position.step == 3 and last["step"] == 2
    steps = sorted(p.name for p in (tmp_path / "checkpoints").glob("step-*.pt"))
    assert steps == ["step-00000002.pt", "step-00000003.pt"]
    assert not trainer.state.stopped_early


def test_a_stop_ends_the_run_after_its_step_as_a_completed_one_and_the_first_reason_stands(
    tmp_path,
):
    trainer = assembled(tmp_path)

    class StopAtOne:
        def after_step(self, trainer):
            if trainer.state.position.step == 1:
                trainer.stop("enough")
                trainer.stop("a second reason")

    with_callback(trainer, "stopper", StopAtOne())
    last = trainer.fit()
    assert trainer.state.position.step == 1 and last["step"] == 1  # evaluated where it stopped
    assert trainer.state.stopped_early and trainer.state.stop_reason == "enough"
    assert (tmp_path / "checkpoints" / "step-00000001.pt").is_file()


def with_callback(trainer, name: str, callback) -> None:
    named = {**trainer.callbacks.named, name: callback}
    trainer.callbacks = Callbacks(named, trainer.callbacks.components)


class Flat:
    """A column whose value never improves: the same every evaluation."""

    def extra_metrics(self, trainer) -> dict[str, float]:
        return {"val_flat": 0.5}


def test_patience_stops_a_run_whose_monitored_value_no_longer_improves(tmp_path):
    patient = ("trainer.eval_every_steps=1", "trainer.patience=1", "trainer.monitor=val_flat")
    trainer = assembled(tmp_path, *patient)
    with_callback(trainer, "flat", Flat())
    trainer.fit()
    assert trainer.state.position.step == 2  # best at step 1, the same value at 2
    assert trainer.state.stop_reason == "trainer.patience: 1 evaluations without a better val_flat"
    assert trainer.state.best.step == 1 and trainer.state.best.stale == 1
    assert [r["step"] for r in rows(tmp_path)] == ["1", "2"]
    best = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert "best.pt" in best  # the best of step 1, promoted by the checkpoint of step 2


def test_a_monitor_the_rows_do_not_hold_is_refused_naming_those_they_do(tmp_path):
    trainer = assembled(tmp_path)
    trainer.settings = dataclasses.replace(trainer.settings, monitor="val_nope")
    with pytest.raises(ConfigError) as refused:
        trainer.fit()
    assert str(refused.value) == (
        "trainer.monitor='val_nope' is not allowed: one of this run's val_acc, val_loss"
    )


def test_without_checkpoints_nothing_is_saved_and_the_best_is_still_followed(tmp_path):
    trainer = assembled(tmp_path, "trainer.save_checkpoints=false")
    trainer.fit()
    assert not list((tmp_path / "checkpoints").glob("*.pt"))
    assert trainer.state.best.step in (2, 4) and trainer.state.best.value is not None


def test_without_a_validation_split_nothing_is_evaluated_or_selected(tmp_path):
    trainer = assembled(tmp_path, "data.val_size=0", "trainer.test_after_fit=false")
    assert not trainer.validates and trainer.evaluate(trainer.model) == {}
    last = trainer.fit()
    assert "val_loss" not in last and trainer.state.best.step is None
    assert last["step"] == 4 and "train_loss" in last


def test_a_resume_onto_an_unevaluated_end_evaluates_and_checkpoints_once(tmp_path):
    trainer = assembled(tmp_path)
    trainer.state.position.step = trainer.total_steps
    trainer.state.position.epoch = 2
    last = trainer.fit()
    assert last["step"] == 4 and len(rows(tmp_path)) == 1
    assert (tmp_path / "checkpoints" / "step-00000004.pt").is_file()


def test_the_state_round_trips_and_a_checkpoint_of_another_world_is_refused(tmp_path):
    trainer = assembled(tmp_path / "a", "trainer.halt_at_step=3")
    trainer.fit()
    trainer.stop("noted")
    state = trainer.state_dict()
    other = assembled(tmp_path / "b")
    other.load_state_dict(state)
    assert other.state.position == trainer.state.position
    assert (
        other.state.last_eval == trainer.state.last_eval and other.state.best == trainer.state.best
    )
    assert other.state.stopped_early and other.state.stop_reason == "noted"
    assert all(
        torch.equal(a, b)
        for a, b in zip(other.model.state_dict().values(), state["model"].values(), strict=True)
    )
    assert torch.equal(torch.get_rng_state(), state["rng"][0]["torch"])
    state["rng"] = state["rng"] * 2
    with pytest.raises(CheckpointError) as refused:
        assembled(tmp_path / "c").load_state_dict(state)
    assert str(refused.value) == (
        "the checkpoint was written by 2 process(es), this run has 1; resume with the same "
        "torchrun --nproc_per_node (or train with trainer.world_invariant=true)"
    )
    invariant = assembled(tmp_path / "d")
    invariant.settings = dataclasses.replace(invariant.settings, world_invariant=True)
    torch.manual_seed(99)
    invariant.load_state_dict(state)  # rank 0's random state serves any world
    assert torch.equal(torch.get_rng_state(), state["rng"][0]["torch"])


class Counting:
    """An objective that keeps state between calls: how often it was called."""

    def __init__(self, objective) -> None:
        self.objective, self.calls = objective, 0

    def __call__(self, logits, targets):
        self.calls += 1
        return self.objective(logits, targets)

    def state_dict(self) -> dict:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict) -> None:
        self.calls = state["calls"]


def with_state(tmp_path):
    """A trainer whose every part keeps state: a callback, the average, an objective, and a
    loss scaler in use."""
    trainer = assembled(tmp_path, "+components=ema")
    named = {**trainer.callbacks.named, "counter": StepCounter()}
    trainer.callbacks = Callbacks(named, trainer.callbacks.components)
    trainer.objective = Counting(trainer.objective)
    trainer.knobs.precision.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**10)
    return trainer


def test_every_part_that_keeps_state_is_saved_and_restored_under_its_own_key(tmp_path):
    trainer = with_state(tmp_path / "a")
    trainer.callbacks.named["counter"].steps, trainer.objective.calls = 5, 7
    average = trainer.callbacks.components["ema"]
    with torch.no_grad():
        for tensor in average.model.parameters():
            tensor.add_(1)
    state = trainer.state_dict()
    assert state["callbacks"]["counter"] == {"steps": 5} and state["objective"] == {"calls": 7}
    assert set(state["components"]) == {"ema"} and state["scaler"]["scale"] == 2.0**10
    other = with_state(tmp_path / "b")
    other.load_state_dict(state)
    assert other.callbacks.named["counter"].steps == 5 and other.objective.calls == 7
    assert other.knobs.precision.scaler.get_scale() == 2.0**10
    restored = other.callbacks.components["ema"].model.state_dict()
    assert all(torch.equal(v, restored[k]) for k, v in average.model.state_dict().items())
    # A checkpoint from before a key existed: each part starts as a new run's would.
    older = {k: v for k, v in state.items() if k not in ("objective", "best", "stopped_early")}
    third = with_state(tmp_path / "c")
    third.objective.calls = 2
    third.load_state_dict({**older, "callbacks": None})
    assert third.objective.calls == 2 and third.callbacks.named["counter"].steps == 0
    assert third.state.best == type(third.state.best)() and third.state.stopped_early is False
    plain = assembled(tmp_path / "d").state_dict()
    assert "objective" not in plain and plain["callbacks"] == {} and plain["components"] == {}


def test_rank_0s_random_state_alone_is_kept_and_restored_in_a_world_invariant_run(
    tmp_path, monkeypatch
):
    from repro.core.engine import loop

    trainer = assembled(tmp_path / "a")
    torch.manual_seed(1)
    first = loop.capture_rng(trainer.device)
    torch.manual_seed(2)
    second = loop.capture_rng(trainer.device)
    monkeypatch.setattr(loop.distributed, "gather", lambda value, dist: [first, second])
    assert [id(s) for s in trainer._rng_states()] == [id(first), id(second)]
    trainer.settings = dataclasses.replace(trainer.settings, world_invariant=True)
    assert [id(s) for s in trainer._rng_states()] == [id(first)]
    state = {**trainer.state_dict(), "rng": [first, second]}
    torch.manual_seed(99)
    trainer.load_state_dict(state)
    assert torch.equal(torch.get_rng_state(), first["torch"])


def test_the_losses_reach_the_trackers_from_their_first_step_every_nth_step_or_evaluation(
    tmp_path,
):
    trainer = assembled(tmp_path, "logger.fingerprint_every_steps=3")
    calls, losses_to = [], trainer.outputs.metrics.losses

    def losses(first_step, values):
        calls.append((first_step, list(values)))
        losses_to(first_step, values)

    trainer.outputs.metrics.losses = losses
    trainer.fit()
    trainer.outputs.metrics.close()
    lines = (tmp_path / "fingerprints.csv").read_text().splitlines()
    written = {int(line.split(",")[0]): float(line.split(",")[1]) for line in lines}
    # Evaluations at steps 2 and 4 flush what is pending; step 3 is on the hashing cadence.
    assert [(first, len(values)) for first, values in calls] == [(1, 2), (3, 1), (4, 1)]
    assert [v for _, values in calls for v in values] == [written[s] for s in (1, 2, 3, 4)]
    hashed = [line.split(",")[0] for line in lines if line.split(",")[2]]
    assert hashed == ["3"]


def test_training_time_adds_up_from_where_training_last_went_on(tmp_path, monkeypatch):
    from repro.core.engine import loop

    trainer = assembled(tmp_path)
    trainer.state.position.train_seconds, trainer._training_since = 2.0, 10.0
    monkeypatch.setattr(loop.time, "perf_counter", lambda: 15.0)
    trainer._count_training_time()
    assert trainer.state.position.train_seconds == 7.0 and trainer._training_since == 15.0


def test_each_step_gets_its_position_the_callbacks_the_trainer_and_a_fault_point_that_settles(
    tmp_path, monkeypatch
):
    from repro.core.engine import loop

    trainer = assembled(tmp_path)
    seen, points, step = [], [], trainer.step

    class Before:
        def before_step(self, loop_given):
            seen.append(loop_given is trainer)

    def recording(images, labels, epoch, batch):
        seen.append((epoch, batch))
        return step(images, labels, epoch, batch)

    def point(name, at, settle=None):  # the checkpoint writer's own points aside
        if name != "checkpoint":
            points.append((name, at, settle == trainer.outputs.checkpointer.wait))

    with_callback(trainer, "before", Before())
    trainer.step = recording
    monkeypatch.setattr(loop.faults, "point", point)
    trainer.fit()
    assert seen == [True, (0, 0), True, (0, 1), True, (1, 0), True, (1, 1)]
    assert points == [("step", step, True) for step in (1, 2, 3, 4)]


def test_a_fault_named_for_a_step_fires_after_it_with_the_checkpoint_before_on_disk(
    tmp_path, monkeypatch
):
    from repro.core.runs import faults

    monkeypatch.setenv(faults.VARIABLE, "step:3:EIO")
    trainer = assembled(tmp_path)
    with pytest.raises(OSError, match="Input/output error"):
        trainer.run()
    assert trainer.state.position.step == 3
    assert trainer.outputs.checkpointer._writer is None  # settled before the fault
    assert (tmp_path / "checkpoints" / "step-00000002.pt").is_file()
    trainer.close()


def test_a_run_that_ends_inside_an_epoch_is_evaluated_then_checkpointed_once_at_its_end(
    tmp_path,
):
    trainer = assembled(tmp_path, "trainer.max_steps=3")
    saved, save = [], trainer.outputs.checkpointer.save

    def counting(state, step):
        saved.append(step)
        return save(state, step)

    trainer.outputs.checkpointer.save = counting
    last = trainer.fit()
    trainer.outputs.metrics.close()
    assert trainer.total_steps == 3 and last["step"] == 3
    assert [r["step"] for r in rows(tmp_path)] == ["2", "3"]
    assert saved == [2, 3]


def test_a_stop_signal_ends_the_run_after_its_step_with_a_checkpoint_and_the_signal(tmp_path):
    import os
    import signal

    trainer = assembled(tmp_path)

    class Terminate:
        def after_step(self, trainer):
            if trainer.state.position.step == 1:
                os.kill(os.getpid(), signal.SIGTERM)

    with_callback(trainer, "terminate", Terminate())
    trainer.fit()
    assert trainer.state.stopped_by == signal.SIGTERM and trainer.state.position.step == 1
    assert not trainer.state.stopped_early
    assert (tmp_path / "checkpoints" / "step-00000001.pt").is_file()


def test_a_non_finite_loss_stops_the_run_naming_where_the_last_good_checkpoint_is(tmp_path):
    from repro.core.engine.losses import NonFiniteLossError

    trainer = assembled(tmp_path)

    class Poison:
        def after_step(self, trainer):
            if trainer.state.position.step == 2:
                with torch.no_grad():
                    next(trainer.model.parameters()).fill_(float("nan"))

    with_callback(trainer, "poison", Poison())
    with pytest.raises(NonFiniteLossError) as stopped:
        trainer.fit()
    assert str(stopped.value) == (
        f"loss is nan at step 3; the last good checkpoint is kept in {tmp_path / 'checkpoints'} "
        "(lower optimizer.lr or set trainer.grad_clip)"
    )


@pytest.mark.parametrize(("mode", "pick"), [("max", max), ("min", min)])
def test_the_best_is_the_monitored_columns_best_in_the_runs_mode(tmp_path, mode, pick):
    monitored = ("trainer.eval_every_steps=1", "trainer.monitor=val_loss")
    trainer = assembled(tmp_path, *monitored, f"trainer.monitor_mode={mode}")
    trainer.fit()
    trainer.outputs.metrics.close()
    values = {int(r["step"]): float(r["val_loss"]) for r in rows(tmp_path)}
    assert len(set(values.values())) == 4, "four different losses to choose from"
    best = pick(values, key=values.get)
    assert trainer.state.best.step == best
    assert trainer.state.best.value == pytest.approx(values[best])


def test_an_absent_monitor_is_refused_naming_the_averages_columns_too(tmp_path):
    trainer = assembled(tmp_path, "+components=ema")
    trainer.settings = dataclasses.replace(trainer.settings, monitor="val_nope")
    with pytest.raises(ConfigError) as refused:
        trainer.fit()
    assert str(refused.value) == (
        "trainer.monitor='val_nope' is not allowed: one of this run's ema_val_acc, "
        "ema_val_loss, val_acc, val_loss"
    )


def by_hand(trainer, tta: str = "none") -> float:
    """The validation loss of the trained model, its objective's, from the loader's batches."""
    from repro.core.data.loader import Batches
    from repro.core.engine.evaluation import predict

    loader, total, images = trainer.data.val_loader, 0.0, 0
    smoothing = trainer.objective.objective.label_smoothing
    with Batches(loader) as batches, torch.no_grad():
        trainer.model.eval()
        for batch, labels in batches.take(len(loader)):
            inputs, targets = trainer.data.to_device(batch, labels)
            logits = predict(trainer.model, inputs, tta)
            loss = torch.nn.functional.cross_entropy(
                logits, targets, label_smoothing=smoothing, reduction="sum"
            )
            total, images = total + loss.item(), images + len(targets)
    return total / images


@pytest.mark.parametrize("tta", ["none", "flip"])
def test_an_evaluation_is_the_objectives_loss_under_the_runs_tta_with_its_metrics(tmp_path, tta):
    trainer = assembled(
        tmp_path, f"trainer.tta={tta}", "objective.label_smoothing=0.2", "metrics=[top5]"
    )
    result = trainer.evaluate(trainer.model)
    assert result["loss"] == pytest.approx(by_hand(trainer, tta), rel=1e-6)
    assert 0 <= result["top5"] <= 1 and "predictions" not in result


def test_the_callbacks_get_the_predictions_of_each_evaluation(tmp_path):
    trainer = assembled(tmp_path)
    seen = []

    class Watcher:
        def after_evaluation(self, trainer, row, predictions):
            seen.append((row["step"], predictions.outputs().indices.tolist()))

    with_callback(trainer, "watcher", Watcher())
    trainer.fit()
    assert seen == [(2, list(range(32))), (4, list(range(32)))]


def test_a_multi_label_evaluation_names_each_labels_columns_after_the_data(tmp_path):
    from repro.core import tasks

    trainer = assembled(tmp_path, "objective=multilabel_bce", "data=synthetic_multilabel")
    result = trainer.evaluate(trainer.model)
    names = tasks.column_names(trainer.classes)
    assert trainer.classes and all(f"ap_{name}" in result for name in names)
    assert not any(key.startswith("ap_0") for key in result)
