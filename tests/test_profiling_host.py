"""trainer.profile_steps writes the host's side of its window: the loop's spans, then the ops
with the most self CPU time (what the host does while a GPU waits for its next batch)."""

from __future__ import annotations

from repro.core.watch.profiling import HOST_ROWS

from conftest import tiny, train_in_process


def test_a_three_step_window_writes_the_host_table_naming_each_step(tmp_path):
    train_in_process(tmp_path, *tiny("trainer.max_steps=3", "trainer.profile_steps=[1,3]"))
    text = (tmp_path / "profile" / "steps-1-3-host.txt").read_text()
    spans, ops = text.split(f"The {HOST_ROWS} ops with the most self CPU time")
    rows = {line.split("  ")[0].strip(): line.split() for line in spans.splitlines()[3:] if line}
    assert list(rows)[:3] == ["step 1", "step 2", "step 3"]  # each step, in order, first
    assert all(rows[f"step {n}"][2] == "1" for n in (1, 2, 3))  # one call each
    assert any(name.startswith("Optimizer.step") for name in rows)
    assert any(name.startswith("enumerate(DataLoader)") for name in rows)  # the hand-off
    for name, cells in rows.items():
        total, own = float(cells[-2]), float(cells[-1])
        assert 0 <= own <= total, name
    assert "Self CPU" in ops and "aten::" in ops
    table = [line for line in ops.splitlines() if line.strip() and not line.startswith("-")]
    assert 2 < len(table) - 2 <= HOST_ROWS  # the header and the total line apart
