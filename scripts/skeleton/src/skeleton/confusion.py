"""A callback with state: every evaluation's confusion matrix, in confusion.json.

Its state is saved with each checkpoint (`state_dict`), so a run killed and resumed writes the
same file as one that went straight through; it writes on rank 0 only, atomically."""

from __future__ import annotations

from typing import Any

from repro.api import write_json_atomic


class ConfusionLog:
    """After every evaluation, confusion.json: each evaluation's validation confusion matrix
    (rows: true class, columns: predicted), by step."""

    def __init__(self) -> None:
        self.matrices: dict[str, list[list[int]]] = {}

    def after_evaluation(self, loop: Any, row: dict, predictions: Any) -> None:
        matrix = predictions.confusion(len(loop.classes))  # every rank takes part
        self.matrices[str(loop.state.position.step)] = matrix.tolist()
        if loop.dist.is_main:
            write_json_atomic(loop.run_dir / "confusion.json", self.matrices)

    def state_dict(self) -> dict:
        return {"matrices": self.matrices}

    def load_state_dict(self, state: dict) -> None:
        self.matrices = state["matrices"]
