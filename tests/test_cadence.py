"""When the loop evaluates and checkpoints."""

from __future__ import annotations

from repro.core.engine.cadence import Cadence
from repro.core.runs.position import Position


def test_evaluations_and_checkpoints_come_at_their_cadence_and_at_the_end():
    cadence = Cadence(eval_every_epochs=2, eval_every_steps=5, checkpoint_every_steps=3)
    inside = {step: Position(epoch=1, step=step) for step in (9, 10, 11)}
    assert [cadence.evaluate(p, False, False) for p in inside.values()] == [False, True, False]
    assert [cadence.checkpoint(p, False, False) for p in inside.values()] == [True, False, False]
    # Epoch ends: every second one evaluated, each one checkpointed.
    assert cadence.evaluate(Position(epoch=2, step=12), True, False)
    assert not cadence.evaluate(Position(epoch=3, step=18), True, False)
    assert cadence.checkpoint(Position(epoch=3, step=18), True, False)
    # The run's last step, inside an epoch and off every cadence: both.
    last = Position(epoch=3, step=19)
    assert cadence.evaluate(last, False, True) and cadence.checkpoint(last, False, True)
    plain = Cadence()  # the defaults: epoch ends only
    assert not plain.evaluate(inside[10], False, False)
    assert not plain.checkpoint(inside[10], False, False)


def test_the_loop_reads_each_setting_from_the_config_once_as_a_plain_value():
    from omegaconf import OmegaConf

    from repro.core.engine.settings import LoopSettings

    trainer = {"grad_clip": 0.5, "eval_every_epochs": "3", "eval_every_steps": 4,
               "checkpoint_every_steps": 6, "halt_at_step": 9, "save_checkpoints": 0,
               "monitor": "val_loss", "monitor_mode": "min", "patience": 2,
               "accumulate_steps": "2", "world_invariant": 1, "tta": "flip"}  # fmt: skip
    cfg = OmegaConf.create({"trainer": trainer, "logger": {"fingerprint_every_steps": "7"}})
    settings = LoopSettings.from_config(cfg)
    assert settings == LoopSettings(
        grad_clip=0.5, eval_every_epochs=3, eval_every_steps=4, checkpoint_every_steps=6,
        halt_at_step=9, save_checkpoints=False, fingerprint_every_steps=7, monitor="val_loss",
        monitor_mode="min", patience=2, accumulate_steps=2, world_invariant=True, tta="flip",
    )  # fmt: skip
    assert [type(v) for v in (settings.eval_every_epochs, settings.save_checkpoints)] == [int, bool]
    assert Cadence.of(settings) == Cadence(3, 4, 6)


def test_what_a_resume_must_find_unchanged_is_the_device_amp_and_layout_in_words():
    import torch

    from repro.core.engine.settings import Knobs
    from repro.core.runtime.distributed import Context
    from repro.core.runtime.memory_format import MemoryFormat
    from repro.core.runtime.precision import Precision

    cpu = torch.device("cpu")
    knobs = Knobs(Context(), cpu, Precision("bf16", cpu), MemoryFormat("channels_last"))
    assert knobs.resolved() == {"device": "cpu", "amp": "bf16", "memory_format": "channels_last"}


def test_a_step_advances_the_position_and_the_last_batch_of_an_epoch_ends_it():
    position = Position(epoch=2, batch=1, step=7)
    ended = [position.advance(3) for _ in range(5)]
    assert ended == [False, True, False, False, True]
    assert (position.epoch, position.batch, position.step) == (4, 0, 12)


def test_a_positions_state_is_a_copy_the_loop_can_go_on_changing():
    position = Position(epoch=1, batch=2, step=3, loss_sum=0.5, loss_count=2, train_seconds=1.5,
                        term_sums={"ce": 0.25})  # fmt: skip
    saved = position.state_dict()
    position.term_sums["ce"] = 9.0
    assert saved == {"epoch": 1, "batch": 2, "step": 3, "loss_sum": 0.5, "loss_count": 2,
                     "train_seconds": 1.5, "term_sums": {"ce": 0.25}}  # fmt: skip
    assert Position(**saved) == Position(1, 2, 3, 0.5, 2, 1.5, {"ce": 0.25})


def test_the_best_value_improves_strictly_in_its_direction_and_nan_never_counts():
    from repro.core.runs.position import Best

    nan = float("nan")
    for mode, values, bests in [
        ("max", [nan, 0.5, 0.5, 0.4, nan, 0.6], [False, True, False, False, False, True]),
        ("min", [0.5, 0.5, 0.6, nan, 0.4], [True, False, False, False, True]),
    ]:
        best = Best()
        assert [best.record(v, step, mode) for step, v in enumerate(values, 1)] == bests
        assert (best.value, best.step, best.stale) == (values[-1], len(values), 0)
    best = Best(value=nan)  # a NaN kept as best (an old checkpoint) gives way to any number
    assert best.improves(-1.0, "max") and not best.improves(nan, "min")


def test_patience_is_spent_after_that_many_evaluations_without_a_better_value():
    from repro.core.runs.position import Best

    best = Best()
    best.record(0.5, 1, "max")
    stale = []
    for step in (2, 3, 4):
        best.record(0.1, step, "max")
        stale.append((best.stale, best.spent(2), best.spent(None)))
    assert stale == [(1, False, False), (2, True, False), (3, True, False)]
    assert best.spent(0) and not Best().spent(1)
