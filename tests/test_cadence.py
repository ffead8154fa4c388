"""When the loop evaluates and checkpoints."""

from __future__ import annotations

from repro.engine.cadence import Cadence
from repro.engine.position import Position


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
