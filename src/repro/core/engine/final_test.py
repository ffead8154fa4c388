"""`trainer.test_after_fit`: the test split evaluated once after training, with the weights
`trainer.test_weights` names: `best` (checkpoints/best.pt), `last` or `ema` (the average)."""

from __future__ import annotations

import copy
import logging
from typing import Any

from torch import nn

from repro.core import build
from repro.core.data.loader import Batches
from repro.core.engine.evaluation import evaluate, evaluation_columns
from repro.core.engine.loop import Trainer
from repro.core.runs.checkpoint import BEST_FILE, best_step_of, load
from repro.core.runtime import distributed

log = logging.getLogger(__name__)


def test_after_fit(cfg: Any, trainer: Trainer, parts: Any) -> dict[str, Any]:
    """`test_loss`, `test_acc` and the weights used, for a run that trained to its end (or
    stopped early); nothing for a run stopped by a signal or a halt."""
    finished = trainer.state.stopped_early or trainer.state.position.step >= trainer.total_steps
    if not cfg.trainer.test_after_fit or not finished:
        return {}
    if len(parts.data.test) == 0:  # data.val_size=0 and no test split of its own to stand in
        log.warning("no test split (the validation split stood in for it and is empty): not tested")
        return {}
    which, model = _weights(cfg.trainer.test_weights, trainer)
    data = parts.data
    norm = parts.normalisation
    _, eval_transform = build.pipelines(cfg, data.resized, data.any_size, norm)
    loader = build.evaluation_loader(cfg, parts.data.test, eval_transform, parts.context, norm)
    prepare, autocast = trainer.knobs.memory_format.batch, trainer.knobs.precision.autocast
    with Batches(loader) as batches:
        one_pass = batches.take(len(loader))
        tta, objective = trainer.settings.tta, trainer.objective
        result = evaluate(
            model, one_pass, trainer.data.to_device, prepare, autocast, trainer.dist, tta,
            objective=objective, scores=trainer.scores, label_names=trainer.classes,
        )  # fmt: skip
    mean_ap = f" map {result['map']:.4f}" if "map" in result else ""  # multi-label
    log.info(
        "test (%s weights) | loss %.4f acc %.4f%s", which, result["loss"], result["acc"], mean_ap
    )
    # test_loss, test_acc, test_<term>, test_<metric> (a confusion matrix included)
    return {**evaluation_columns("test", result, matrices=True), "test_weights": which}


def _weights(which: str, trainer: Trainer) -> tuple[str, nn.Module]:
    if which == "ema":
        average = trainer.callbacks.get("ema")
        assert average is not None  # config.validate requires components.ema
        return which, average.model
    if which == "last":
        return which, trainer.model
    best = trainer.outputs.checkpointer.folder / BEST_FILE
    # Rank 0 wrote best.pt (its last write is on disk: Trainer.close waited) and decides for
    # every rank, so that all of them test the same weights.
    recorded = trainer.state.best.step
    usable = trainer.dist.is_main and recorded is not None and best_step_of(best) == recorded
    if not distributed.broadcast(usable, trainer.dist):  # rank 0's answer
        log.warning(
            "no %s of the best step (%s) in this run folder (checkpoints off, or resumed from "
            "another folder's checkpoint): testing the last weights", best, recorded,
        )  # fmt: skip
        return "last", trainer.model
    model = copy.deepcopy(trainer.model)
    model.load_state_dict(load(best)["model"])
    return which, model
