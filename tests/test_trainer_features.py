"""Best checkpoint, test after training, early stopping and gradient accumulation."""

from __future__ import annotations

import contextlib
import csv
import json
import logging
import time

import pytest
import torch

from repro import evaluate
from repro.core import tasks
from repro.core.engine.evaluation import evaluate as evaluate_batches
from repro.core.engine.evaluation import predict
from repro.core.engine.loop import Trainer
from repro.core.errors import CheckpointError, ConfigError

from conftest import StepCounter, compose_config, save_test_resnet, tiny, train_in_process

TWO_EPOCHS = tiny("trainer.epochs=2", "trainer.eval_every_steps=2")


def rows(run_dir) -> list[dict[str, str]]:
    with (run_dir / "metrics.csv").open() as handle:
        return list(csv.DictReader(handle))


@pytest.mark.slow
def test_best_pt_holds_the_best_evaluation_and_the_test_split_is_evaluated(tmp_path):
    summary = train_in_process(tmp_path, *TWO_EPOCHS)
    evaluations = rows(tmp_path)
    best = max(evaluations, key=lambda row: float(row["val_acc"]))  # the first of equals
    assert summary["best_val_acc"] == float(best["val_acc"])
    assert summary["best_step"] == int(best["step"])
    assert 0 <= summary["test_acc"] <= 1 and summary["test_weights"] == "best"
    again = evaluate.evaluate_checkpoint(tmp_path / "checkpoints" / "best.pt", split="val")
    assert again["acc"] == summary["best_val_acc"] and again["step"] == summary["best_step"]
    tested = evaluate.evaluate_checkpoint(tmp_path / "checkpoints" / "best.pt", split="test")
    assert tested["acc"] == summary["test_acc"] and tested["loss"] == summary["test_loss"]


@pytest.mark.parametrize(
    "sizes",
    [
        # the model's own size: data's resize scaled to it; the evaluation flips
        [
            "data.resize=36",
            "model.image_size=16",
            "model.interpolation=bicubic",
            "trainer.tta=flip",
        ],
        # data's size and no resize: image files of any size are resized all the same
        ["data.resize=null", "model.image_size=32", "trainer.tta=none"],
    ],
)
def test_the_test_split_is_evaluated_as_validation_is(sizes, image_tree, tmp_path, caplog):
    """Without test/, val/ stands in for it: the test after training must then report what the
    last validation did, with the same objective, metrics and flips, and the model's own
    normalisation (a pretrained model's image size, resize, mean and std, not data's)."""
    weights = save_test_resnet(tmp_path / "test_resnet.safetensors")
    caplog.set_level(logging.INFO, logger="repro.core.engine.final_test")
    summary = train_in_process(
        tmp_path / "run", "data=imagefolder", f"data.root={image_tree}", "data.image_size=32",
        *sizes, "model=timm", "model.name=test_resnet", f"model.pretrained={weights}",
        "trainer.batch_size=12", "trainer.eval_batch_size=16",
        "trainer.epochs=1", "dataloader=debug", "logger.plot=false", "trainer.test_weights=last",
        "objective.label_smoothing=0.2", "metrics=[f1,confusion_matrix]",
    )  # fmt: skip
    assert summary["normalisation"]["mean"] != list(compose_config("data=imagefolder").data.mean)
    (last,) = rows(tmp_path / "run")[-1:]
    for name in ("loss", "acc", "f1"):
        assert summary[f"test_{name}"] == pytest.approx(float(last[f"val_{name}"]), abs=1e-6)
    matrix = json.loads((tmp_path / "run" / "summary.json").read_text())["test_confusion_matrix"]
    assert sum(map(sum, matrix)) == 3 * 12  # every val image, counted once
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.core.engine.final_test"]
    assert said == (
        f"test (last weights) | loss {summary['test_loss']:.4f} acc {summary['test_acc']:.4f}"
    )


def test_a_loss_monitor_keeps_the_lowest_loss(tmp_path):
    summary = train_in_process(
        tmp_path, *TWO_EPOCHS, "trainer.monitor=val_loss", "trainer.monitor_mode=min",
        "trainer.test_weights=last",
    )  # fmt: skip
    losses = {int(row["step"]): float(row["val_loss"]) for row in rows(tmp_path)}
    assert summary["best_val_loss"] == min(losses.values())
    assert losses[summary["best_step"]] == summary["best_val_loss"]
    assert summary["test_weights"] == "last"


def test_patience_stops_a_run_that_no_longer_improves_and_a_rerun_has_nothing_to_do(tmp_path):
    # lr 0: the weights never change, so no evaluation after the first is better.
    frozen = tiny("optimizer.lr=0", "trainer.eval_every_steps=1", "trainer.patience=2")
    summary = train_in_process(tmp_path, *frozen)
    assert summary["stopped_early"] and summary["completed"]
    assert summary["step"] == 3 and summary["best_step"] == 1  # evaluations at 1, 2, 3
    assert summary["total_steps"] == 6 and "test_acc" in summary
    assert summary["stop_reason"] == "trainer.patience: 2 evaluations without a better val_acc"
    again = train_in_process(tmp_path, *frozen)
    assert again.get("already_complete") and again["step"] == 3


class StopAtStep:
    """A callback that stops the run once `step` steps are done."""

    def __init__(self, step: int) -> None:
        self.step = step

    def after_step(self, loop) -> None:
        if loop.state.position.step == self.step:
            loop.stop(f"reached step {self.step}")


def test_a_callback_stops_a_run_which_ends_completed_and_resumes_to_the_same_end(tmp_path):
    stopping = tiny("trainer.epochs=2", f"+callbacks.stop._target_={__name__}.StopAtStep",
                    "+callbacks.stop.step=5")  # fmt: skip
    summary = train_in_process(tmp_path / "whole", *stopping)
    assert summary["step"] == 5 and summary["total_steps"] == 12
    assert summary["completed"] and summary["stop_reason"] == "reached step 5"
    assert "test_acc" in summary and summary["val_acc"] == summary["best_val_acc"]
    attempts = (tmp_path / "whole" / "attempts.jsonl").read_text().splitlines()
    assert json.loads(attempts[-1])["result"] == "completed, stopped early: reached step 5"
    # Halted at step 3, then resumed: the same end, weights and figures.
    train_in_process(tmp_path / "halted", *stopping, "trainer.halt_at_step=3")
    resumed = train_in_process(tmp_path / "halted", *stopping)
    assert resumed["step"] == 5 and resumed["stop_reason"] == "reached step 5"
    assert resumed["weights_sha256"] == summary["weights_sha256"]
    assert rows(tmp_path / "halted")[-1]["val_loss"] == rows(tmp_path / "whole")[-1]["val_loss"]
    again = train_in_process(tmp_path / "halted", *stopping)
    assert again.get("already_complete") and again["step"] == 5


def test_the_first_stop_reason_stands():
    from repro.core.runs.position import RunState

    loop = Trainer.__new__(Trainer)  # only its state is touched
    loop.state = RunState()
    loop.stop("the first")
    loop.stop("the second")
    assert loop.state.stopped_early and loop.state.stop_reason == "the first"


def test_without_test_after_fit_the_test_split_is_left_alone(tmp_path):
    summary = train_in_process(tmp_path, *tiny("trainer.test_after_fit=false"))
    assert summary["completed"] and "test_acc" not in summary and "test_weights" not in summary


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["trainer.test_weights=ema"], "trainer.test_weights"),
        (["trainer.monitor=val_ac"], "trainer.monitor"),
        (["trainer.accumulate_steps=3"], "trainer.accumulate_steps"),
        (["trainer.monitor_mode=up"], "trainer.monitor_mode"),
        (["trainer.test_weights=first"], "trainer.test_weights"),
        (["trainer.patience=0"], "trainer.patience"),
        (["augment.mixup_alpha=-1"], "augment.mixup_alpha"),
        (["augment.cutmix_alpha=-0.5"], "augment.cutmix_alpha"),
        (["data.cache=disk"], "data.cache"),
        (["data.cache_budget_gib=-1"], "data.cache_budget_gib"),
        (["trainer.tta=mirror"], "trainer.tta"),
        (["augment.cutout=33"], "augment.cutout"),
        (["augment.cutout=-1"], "augment.cutout"),
        (["optimizer.decay_biases_and_norms=maybe"], "optimizer.decay_biases_and_norms"),
        (["optimizer.lr_scale_biases_and_norms=0"], "optimizer.lr_scale_biases_and_norms"),
        (
            [
                "optimizer._target_=torch.optim.Nope",
                "~optimizer.weight_decay",
                "optimizer.lr_scale_biases_and_norms=2",
            ],
            "optimizer._target_",
        ),
        (["augment.flip=sometimes"], "augment.flip"),
        (["augment.crop_padding_mode=wrap"], "augment.crop_padding_mode"),
        (["augment.crop_padding_mode=reflect", "data.crop_padding=32"], "data.crop_padding"),
    ],
)
def test_settings_that_cannot_work_are_refused(overrides, key, tmp_path):
    with pytest.raises(ConfigError, match=key):
        train_in_process(tmp_path, *tiny(*overrides))


NO_BATCHNORM = tiny("model.batchnorm=false", "trainer.max_steps=3", "data.augment=false")


def test_accumulating_two_half_batches_is_one_batch_up_to_rounding(tmp_path):
    # Not bitwise: the two halves' gradients are summed after each is reduced over its own
    # 32 images, a different order of float additions than one reduction over 64.
    whole = train_in_process(tmp_path / "whole", *NO_BATCHNORM)
    halves = train_in_process(tmp_path / "halves", *NO_BATCHNORM, "trainer.accumulate_steps=2")
    assert whole["weights_sha256"] != halves["weights_sha256"]
    first = torch.load(tmp_path / "whole" / "checkpoints" / "last.pt", weights_only=True)
    second = torch.load(tmp_path / "halves" / "checkpoints" / "last.pt", weights_only=True)
    for name, weights in first["model"].items():
        assert torch.allclose(weights, second["model"][name], rtol=1e-4, atol=1e-6), name
    assert halves["val_loss"] == pytest.approx(whole["val_loss"], rel=1e-4)


def test_the_new_keys_compose_from_the_defaults():
    cfg = compose_config()
    trainer = cfg.trainer
    assert (trainer.monitor, trainer.monitor_mode, trainer.test_weights) == ("auto", "max", "best")
    assert tasks.monitor(cfg) == "val_acc"  # what auto is for cross-entropy
    assert trainer.test_after_fit and trainer.accumulate_steps == 1
    assert compose_config().components == {}  # no weight average, no lookahead


def test_flip_averaging_evaluates_each_image_and_its_mirror_image():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 4, 5))
    images, labels = torch.randn(6, 2, 3, 4), torch.arange(6) % 5
    mirrored = torch.flip(images, dims=[3])
    expected = (model(images) + model(mirrored)) / 2
    assert torch.equal(predict(model, images, "flip"), expected)
    assert not torch.allclose(predict(model, images, "none"), expected)  # not mirror-symmetric
    result = evaluate_batches(model, [(images, labels)], lambda x, y: (x, y), lambda x: x,
                              contextlib.nullcontext, tta="flip")  # fmt: skip
    loss = torch.nn.functional.cross_entropy(expected, labels).item()
    assert result["loss"] == pytest.approx(loss, rel=1e-6)
    assert result["acc"] == (expected.argmax(1) == labels).sum().item() / len(labels)


def test_shifted_views_add_one_pixel_translations_with_the_edge_reflected():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(2 * 3 * 4, 5))
    images = torch.randn(6, 2, 3, 4)
    rows, cols = [1, 0, 1, 2, 1], [1, 0, 1, 2, 3, 2]  # reflect-padded rows and columns
    up_left = images[:, :, rows[:3]][:, :, :, cols[:4]]  # content moves down and right
    down_right = images[:, :, rows[2:]][:, :, :, cols[2:]]
    views = [images, up_left, down_right]
    flip = [predict(model, view, "flip") for view in views]
    expected = (flip[0] + (flip[1] + flip[2]) / 2) / 2
    assert torch.allclose(predict(model, images, "flip_translate"), expected, atol=1e-6)


@pytest.mark.slow
def test_tta_changes_every_evaluation_and_never_the_weights(tmp_path):
    last = "trainer.test_weights=last"  # both test the same weights
    plain = train_in_process(tmp_path / "plain", *TWO_EPOCHS, last)
    flipped = train_in_process(tmp_path / "flip", *TWO_EPOCHS, last, "trainer.tta=flip")
    assert flipped["weights_sha256"] == plain["weights_sha256"]
    assert flipped["val_loss"] != plain["val_loss"] and flipped["test_loss"] != plain["test_loss"]
    last = tmp_path / "flip" / "checkpoints" / "last.pt"
    again = evaluate.evaluate_checkpoint(last, split="val")  # the run's own tta
    assert again["tta"] == "flip" and again["loss"] == flipped["val_loss"]
    without = evaluate.evaluate_checkpoint(last, split="val", tta="none")
    assert without["loss"] == plain["val_loss"]


def test_train_seconds_leave_evaluations_out_and_add_up_over_attempts(tmp_path, monkeypatch):
    evaluate_model = Trainer.evaluate

    def slow(self, model, **options):
        time.sleep(0.5)
        return evaluate_model(self, model, **options)

    monkeypatch.setattr(Trainer, "evaluate", slow)
    run = tiny("trainer.epochs=2", "trainer.eval_every_steps=2")  # 6 evaluations, 3 s asleep
    halted = train_in_process(tmp_path, *run, "trainer.halt_at_step=5")
    summary = train_in_process(tmp_path, *run)
    assert 0 < halted["train_s"] < summary["train_s"] < summary["wall_s"] + halted["wall_s"] - 3
    seconds = [float(row["train_s"]) for row in rows(tmp_path)]
    assert len(seconds) == 6 and seconds == sorted(seconds)
    assert seconds[-1] == pytest.approx(summary["train_s"], abs=0.01)  # then the checkpoint


# ---- the unit: one optimizer step's micro-batches (fast, in-process) -----------------------


def _one_step(accumulate_steps: int) -> tuple[dict[str, torch.Tensor], list[torch.Tensor]]:
    """One SGD step of a linear model on 8 fixed images, as `accumulate_steps` micro-batches;
    the objective's extra term is 1.0 per image. Returns the step's terms and the gradients."""
    from torch.nn import functional

    from repro.core.engine.settings import LoopSettings
    from repro.core.engine.step import OptimizerStep
    from repro.core.runtime.memory_format import MemoryFormat
    from repro.core.runtime.precision import Precision

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # the gradients stay to be read
    images, labels = torch.randn(8, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])

    def objective(logits, targets):
        per_image = functional.cross_entropy(logits, targets.labels, reduction="none")
        return {"loss": per_image, "ones": torch.ones(len(per_image)), "batch": per_image.sum()}

    step = OptimizerStep(
        model=model, forward_model=model, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        precision=Precision("off", torch.device("cpu")), memory_format=MemoryFormat("contiguous"),
        settings=LoopSettings(accumulate_steps=accumulate_steps), objective=objective,
    )  # fmt: skip
    terms = step(images, labels, epoch=0, batch=0)
    return terms, [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize("pieces", [2, 4])
def test_accumulation_logs_each_term_as_the_whole_batchs_mean_and_keeps_its_gradient(pieces):
    whole, whole_grads = _one_step(1)
    split, split_grads = _one_step(pieces)
    assert float(split["ones"]) == 1.0 == float(whole["ones"])  # a term, not only the total
    assert float(split["loss"]) == pytest.approx(float(whole["loss"]), rel=1e-6)
    # A 0-d term is the micro-batch's own value: its mean over the pieces, not their sum.
    assert float(split["batch"]) == pytest.approx(float(whole["batch"]) / pieces, rel=1e-6)
    for got, expected in zip(split_grads, whole_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("pieces", [1, 2, 3])
def test_under_ddp_the_gradients_are_all_reduced_once_with_the_last_micro_batch(pieces, tmp_path):
    """A one-process gloo group in this process: DDP's reduction is seen through a comm hook
    that records how many forward passes had run when it fired."""
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from repro.core.engine.settings import LoopSettings
    from repro.core.engine.step import OptimizerStep
    from repro.core.runtime.memory_format import MemoryFormat
    from repro.core.runtime.precision import Precision

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
        forwards, reduced_after = [], []
        model.register_forward_hook(lambda *_: forwards.append(1))
        wrapped = DistributedDataParallel(model)

        def count(_, bucket):
            reduced_after.append(len(forwards))
            future = torch.futures.Future()
            future.set_result(bucket.buffer())
            return future

        wrapped.register_comm_hook(None, count)

        def per_image(logits, targets):
            return {"loss": torch.nn.functional.cross_entropy(logits, targets.labels,
                                                              reduction="none")}  # fmt: skip

        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        step = OptimizerStep(
            model=model, forward_model=wrapped, optimizer=optimizer,
            scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
            precision=Precision("off", torch.device("cpu")),
            memory_format=MemoryFormat("contiguous"),
            settings=LoopSettings(accumulate_steps=pieces), objective=per_image,
        )  # fmt: skip
        images, labels = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
        for _ in range(2):
            step(images, labels, epoch=0, batch=0)
        assert reduced_after == [pieces, 2 * pieces]  # one reduction a step, after its last
    finally:
        dist.destroy_process_group()


def _step_for(model, optimizer, precision, objective=None, mixer=None, **settings):
    from repro.core.engine.settings import LoopSettings
    from repro.core.engine.step import OptimizerStep
    from repro.core.runtime.memory_format import MemoryFormat

    def per_image(logits, targets):
        return {"loss": torch.nn.functional.cross_entropy(logits, targets.labels,
                                                          reduction="none")}  # fmt: skip

    return OptimizerStep(
        model=model, forward_model=model, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        precision=precision, memory_format=MemoryFormat("contiguous"),
        settings=LoopSettings(**settings), objective=objective or per_image, mixer=mixer,
    )  # fmt: skip


class _SometimesBranch(torch.nn.Module):
    """A classifier whose extra branch joins only while `use_branch` is set (conditional
    computation, as in mixture-of-experts layers)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.head, self.branch = torch.nn.Linear(12, 3), torch.nn.Linear(12, 3)
        self.use_branch = True

    def forward(self, images):
        flat = images.flatten(1)
        return self.head(flat) + (self.branch(flat) if self.use_branch else 0)


def test_a_parameter_left_out_of_a_step_is_not_moved_by_momentum_or_weight_decay():
    from repro.core.runtime.precision import Precision

    model = _SometimesBranch()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=0.1)
    step = _step_for(model, optimizer, Precision("off", torch.device("cpu")))
    images, labels = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    step(images, labels, epoch=0, batch=0)
    after_first = model.branch.weight.detach().clone()
    model.use_branch = False
    step(images, labels, epoch=0, batch=1)  # its gradient is gone, not zero: SGD skips it
    assert torch.equal(model.branch.weight, after_first)


def test_clipping_under_a_loss_scaler_clips_the_unscaled_gradients(monkeypatch):
    from repro.core.runtime import precision as precision_module
    from repro.core.runtime.precision import Precision

    monkeypatch.setattr(precision_module, "_supports", lambda device, mode: True)
    fp16 = Precision("fp16", torch.device("cpu"))
    assert fp16.scaler.is_enabled() and fp16.scaler.get_scale() > 1
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    before = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    step = _step_for(model, optimizer, fp16, grad_clip=0.01)
    images, labels = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    for batch in range(30):  # the scaler skips the steps whose fp16 gradients overflow
        step(images, labels, epoch=0, batch=batch)
        moved = torch.cat([(p - b).detach().flatten()
                           for p, b in zip(model.parameters(), before, strict=True)])  # fmt: skip
        if moved.any():
            break
    # lr 1: the update is the clipped gradient, of norm 0.01, once the scale is divided out.
    assert float(moved.norm()) == pytest.approx(0.01, rel=1e-3)


def test_the_step_trains_on_the_batch_mixed_for_its_place_with_the_partners_labels():
    from repro.core.engine.mixing import BatchMixer
    from repro.core.runtime.precision import Precision

    seen = []

    def recording(logits, targets, batch):
        seen.append((batch.images, targets))
        return {"loss": torch.nn.functional.cross_entropy(logits, targets.labels,
                                                          reduction="none")}  # fmt: skip

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    mixer = BatchMixer(mixup_alpha=0.4, cutmix_alpha=0.0, root_seed=3)
    step = _step_for(model, optimizer, Precision("off", torch.device("cpu")), recording, mixer)
    images, labels = torch.randn(6, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2])
    for epoch, batch in ((1, 5), (2, 5), (1, 6)):
        step(images, labels, epoch=epoch, batch=batch)
    for (mixed_images, targets), place in zip(seen, ((1, 5), (2, 5), (1, 6)), strict=True):
        expected = BatchMixer(0.4, 0.0, root_seed=3)(images, labels, *place)
        assert torch.equal(mixed_images, expected.images) and torch.equal(targets.labels, labels)
        assert torch.equal(targets.partners, expected.partner_labels)
        assert targets.weight == expected.weight
    assert len({targets.weight for _, targets in seen}) == 3  # each place its own draw


# ---- the unit: the loop's own bookkeeping ---------------------------------------------------


def bare_loop(world=1, invariant=False, **settings):
    """A Trainer with a small model and only the parts the bookkeeping touches."""
    from types import SimpleNamespace

    from repro.core.engine.settings import LoopSettings
    from repro.core.runs.position import RunState
    from repro.core.runtime.distributed import Context
    from repro.core.runtime.precision import Precision
    from repro.core.tasks.objectives import CrossEntropy
    from repro.core.watch.callbacks import Callbacks

    loop = Trainer.__new__(Trainer)
    loop.model = torch.nn.Linear(2, 2)
    loop.optimizer = torch.optim.SGD(loop.model.parameters(), lr=0.1)
    loop.scheduler = torch.optim.lr_scheduler.LambdaLR(loop.optimizer, lambda step: 1.0)
    loop.knobs = SimpleNamespace(precision=Precision("off", torch.device("cpu")))
    loop.callbacks, loop.state, loop.dist = Callbacks(), RunState(), Context(rank=0, world=world)
    loop.settings = LoopSettings(world_invariant=invariant, **settings)
    loop.extra_state = {"config": {"seed": 1}}
    loop.objective = CrossEntropy(0.0)  # no state of its own: the checkpoint has no "objective"

    class OneImage(list):  # a validation loader of no batches over a split of one image
        dataset = (None,)

    loop.data = SimpleNamespace(val_loader=OneImage(), to_device=None)
    saved = []
    loop.outputs = SimpleNamespace(checkpointer=SimpleNamespace(
        save_best=lambda state, step: saved.append(step)))  # fmt: skip
    return loop, saved


def test_a_monitor_the_evaluation_does_not_report_is_one_line_naming_those_it_does():
    loop, _ = bare_loop(monitor="val_f1")
    loop.state.last_eval = {"step": 3, "train_loss": 1.0, "val_loss": 1.0, "val_acc": 0.5,
                            "ema_val_acc": 0.6}  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        loop._track_best()
    assert str(refused.value) == (
        "trainer.monitor='val_f1' is not allowed: one of this run's ema_val_acc, val_acc, val_loss"
    )


def test_a_better_value_writes_best_pt_and_patience_stops_the_run(monkeypatch):
    loop, saved = bare_loop(monitor="val_loss", monitor_mode="min", patience=2)
    monkeypatch.setattr(loop, "state_dict", lambda: {"whole": "state"})
    for step, value in ((1, 0.9), (2, 0.8), (3, 0.85), (4, 0.8)):
        loop.state.position.step = step
        loop.state.last_eval = {"val_loss": value}
        loop._track_best()
    assert saved == [1, 2] and loop.state.best.step == 2
    assert loop.state.stopped_early
    assert loop.state.stop_reason == "trainer.patience: 2 evaluations without a better val_loss"
    rising, saved = bare_loop(monitor="val_acc", monitor_mode="max")
    monkeypatch.setattr(rising, "state_dict", lambda: {"whole": "state"})
    for step, value in ((1, 0.5), (2, 0.4), (3, 0.6)):
        rising.state.position.step, rising.state.last_eval = step, {"val_acc": value}
        rising._track_best()
    assert saved == [1, 3] and rising.state.best.value == 0.6
    quiet, kept = bare_loop(save_checkpoints=False)
    quiet.state.last_eval = {"val_acc": 0.5}
    quiet._track_best()
    assert kept == [] and quiet.state.best.value == 0.5 and not quiet.state.stopped_early


@pytest.mark.parametrize("invariant", [False, True])
def test_a_checkpoints_random_states_are_every_ranks_unless_the_run_is_world_invariant(
    invariant, monkeypatch
):
    from repro.core.engine import loop as loop_module

    loop, _ = bare_loop(world=2, invariant=invariant)
    monkeypatch.setattr(loop_module.distributed, "gather", lambda value, dist: [value, "rank 1"])
    states = loop._rng_states()
    assert len(states) == (1 if invariant else 2) and states[0]["device"] is None
    state = loop.state_dict()
    assert state["config"] == {"seed": 1} and state["stopped_early"] is False
    assert state["position"]["step"] == 0 and state["components"] == {} and state["callbacks"] == {}


def test_a_checkpoint_of_another_world_size_resumes_only_when_world_invariant():
    from repro.core.runs.checkpoint import capture_rng

    written, _ = bare_loop()
    written.state.position.step = 7
    written.state.last_eval = {"step": 7, "val_acc": 0.5}
    state = {**written.state_dict(), "rng": [capture_rng(torch.device("cpu"))]}
    two, _ = bare_loop(world=2)
    with pytest.raises(CheckpointError) as refused:
        two.load_state_dict(state)
    assert str(refused.value) == (
        "the checkpoint was written by 1 process(es), this run has 2; resume with the same "
        "torchrun --nproc_per_node (or train with trainer.world_invariant=true)"
    )
    invariant, _ = bare_loop(world=2, invariant=True)
    invariant.load_state_dict(state)
    assert invariant.state.position.step == 7 and invariant.state.last_eval["val_acc"] == 0.5
    assert torch.equal(invariant.model.weight, written.model.weight)


def test_a_checkpoint_restores_the_best_value_the_stop_and_the_callbacks_state():
    from repro.core.runs.position import Best
    from repro.core.watch.callbacks import Callbacks

    written, _ = bare_loop()
    written.callbacks = Callbacks({"count": StepCounter()})
    written.callbacks.get("count").steps = 5
    written.state.best = Best(value=0.25, step=4, stale=2)
    written.state.stopped_early, written.state.stop_reason = True, "enough"
    state = written.state_dict()
    resumed, _ = bare_loop()
    resumed.callbacks = Callbacks({"count": StepCounter()})
    resumed.load_state_dict(state)
    assert vars(resumed.state.best) == {"value": 0.25, "step": 4, "stale": 2}
    assert (resumed.state.stopped_early, resumed.state.stop_reason) == (True, "enough")
    assert resumed.callbacks.get("count").steps == 5
    # A checkpoint written before these were kept: a run that never stopped, nothing best yet.
    older = {k: v for k, v in state.items() if k not in ("best", "stopped_early", "stop_reason",
                                                         "callbacks")}  # fmt: skip
    fresh, _ = bare_loop()
    fresh.callbacks = Callbacks({"count": StepCounter()})
    fresh.load_state_dict(older)
    assert vars(fresh.state.best) == vars(Best())
    assert (fresh.state.stopped_early, fresh.state.stop_reason) == (False, None)
    assert fresh.callbacks.get("count").steps == 0


@pytest.mark.parametrize(("rank", "values", "written"), [(0, [1.5, 2.5], True), (0, [], False),
                                                          (1, [1.5, 2.5], False)])  # fmt: skip
def test_flushed_losses_are_logged_by_rank_0_from_the_step_of_the_first(rank, values, written):
    from types import SimpleNamespace

    from repro.core.runtime.distributed import Context

    loop, _ = bare_loop()
    loop.dist = Context(rank=rank, world=2)
    loop.state.position.step = 7
    asked, logged = [], []
    loop.losses = SimpleNamespace(flush=lambda position, model: asked.append(position) or values)
    loop.outputs.metrics = SimpleNamespace(
        losses=lambda first, values: logged.append((first, values))
    )
    loop.flush_losses()
    assert asked == [loop.state.position]
    assert logged == ([(6, [1.5, 2.5])] if written else [])


def test_a_step_is_told_its_place_and_an_evaluation_keeps_no_predictions_unless_asked(
    monkeypatch,
):
    from types import SimpleNamespace

    from repro.core.engine import loop as loop_module

    loop, _ = bare_loop()
    loop.state.position.epoch, loop.state.position.batch = 3, 9
    places = []
    loop.step = lambda images, labels, epoch, batch: places.append((epoch, batch)) or {}
    loop.train_step(torch.zeros(1), torch.zeros(1))
    assert places == [(3, 9)]
    asked = {}

    def evaluate(*args, **kwargs):
        asked.update(kwargs, dist=args[5])
        return {}

    monkeypatch.setattr(loop_module, "evaluate", evaluate)
    loop.val_batches = SimpleNamespace(take=lambda count: [])
    loop.knobs.memory_format = SimpleNamespace(batch=None)
    loop.objective, loop.scores = "objective", "scores"
    loop.evaluate(loop.model)
    assert asked["keep_predictions"] is False and asked["dist"] is loop.dist
    assert (asked["objective"], asked["scores"]) == ("objective", "scores")


def test_each_step_passes_its_fault_point_and_losses_are_hashed_at_their_cadence(
    tmp_path, monkeypatch
):
    from repro.core.engine import loop as loop_module
    from repro.core.runs.fingerprint_log import FingerprintLog

    points = []
    monkeypatch.setattr(
        loop_module.faults,
        "point",
        lambda name, step, settle=None: points.append((name, step, settle)),
    )
    train_in_process(tmp_path, *tiny("logger.fingerprint_every_steps=2", "trainer.epochs=1"))
    steps = [(step, settle) for name, step, settle in points if name == "step"]
    assert [step for step, _ in steps] == list(range(1, 7))  # the checkpoints' points aside
    assert all(callable(settle) for _, settle in steps)
    rows = FingerprintLog.of_run(tmp_path).read()
    assert [r.step for r in rows] == list(range(1, 7))
    assert [r.step for r in rows if r.weights_sha256] == [2, 4, 6]
