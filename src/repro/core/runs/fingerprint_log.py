"""fingerprints.csv, the per-step record `verify` and `diff` compare: its format in one place.

One line per optimizer step, no header: `step,loss,` with the loss as Python's `repr` of a
float64 (full precision), and at every `logger.fingerprint_every_steps`-th step the SHA-256 of
the weights in the third column. `first_divergence` names the first step two of them differ at.
"""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from repro.core.files import complete_lines, open_in_place, write_text_atomic, writing
from repro.core.guards import received

FILE_NAME = "fingerprints.csv"


class Row(NamedTuple):
    step: int
    loss: str  # as written: comparing text compares every bit of the float
    weights_sha256: str = ""  # empty between hashed steps


class FingerprintLog:
    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def of_run(cls, run_dir: Path) -> FingerprintLog:
        return cls(run_dir / FILE_NAME)

    def append(self, first_step: int, losses: list[float], weights_sha256: str = "") -> None:
        """Steps `first_step`, `first_step + 1`, ...; the hash goes on the last of them."""
        lines = [f"{first_step + offset},{loss!r}," for offset, loss in enumerate(losses)]
        lines[-1] += weights_sha256
        with writing(self.path), open_in_place(self.path) as handle:
            handle.write("\n".join(lines) + "\n")

    def read(self) -> list[Row]:
        """The complete rows (a last line torn by a kill or a full disk is not one)."""
        rows = []
        text = received.read_text(self.path, "table", root=self.path.parent)
        for line in complete_lines(text).splitlines():
            if line:
                step, loss, digest = line.split(",")
                rows.append(Row(int(step), loss, digest))
        return rows

    def truncate_after(self, step: int) -> None:
        """Drop the rows after `step` (a resume from that step's checkpoint)."""
        if self.path.exists():
            kept = [row for row in self.read() if row.step <= step]
            lines = (f"{row.step},{row.loss},{row.weights_sha256}\n" for row in kept)
            write_text_atomic(self.path, "".join(lines))


def first_divergence(
    recorded: list[Row], rerun: list[Row], names: tuple[str, str] = ("recorded", "now")
) -> str | None:
    """The first step whose loss or weights hash differs, as "step K: ...", naming each side."""
    was, now = names
    for (step, loss, digest), (_, new_loss, new_digest) in zip(recorded, rerun, strict=False):
        if loss != new_loss:
            return f"step {step}: loss {loss} {was}, {new_loss} {now}"
        if digest and new_digest and digest != new_digest:
            return f"step {step}: weights hash {digest[:16]} {was}, {new_digest[:16]} {now}"
    return None
