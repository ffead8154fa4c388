"""torchrun with DistributedDataParallel: one folder, rank-aware exactness, disjoint shards."""

from __future__ import annotations

import json
import os
import signal
from types import SimpleNamespace

import pytest
import torch

from repro.core.data.samplers import EpochBatches
from repro.core.runs import run_lock, signals

from conftest import read_summary, run_cli, tiny, torchrun

# 384 images, 2 ranks x 32 per step: 6 steps per epoch.
DDP = tiny(
    "trainer.batch_size=32",
    "trainer.epochs=2",
    "trainer.checkpoint_every_steps=2",
    "dataloader.num_workers=0",
)


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    base = tmp_path_factory.mktemp("ddp")
    # The folder name is resolved by each rank on its own: one folder proves they agree.
    done = torchrun(*DDP, f"hydra.run.dir={base}/${{run_stamp:}}-${{run_id:}}")
    assert done.returncode == 0, done.stderr[-3000:]
    folders = [p for p in base.rglob("summary.json")]
    assert len(folders) == 1, folders
    return folders[0].parent


@pytest.mark.e2e
@pytest.mark.slow
def test_two_processes_one_folder_one_summary_rank0_writes(straight):
    summary = read_summary(straight)
    assert summary["world_size"] == 2 and summary["completed"]
    assert summary["total_steps"] == 12
    assert (straight / ".hydra" / "config.yaml").exists()
    log = (straight / "train.log").read_text()
    assert log.count("done | val_acc") == 1, "rank 1 must not write the log"
    steps = [line.split(",")[0] for line in (straight / "fingerprints.csv").read_text().split()]
    assert steps == [str(s) for s in range(1, 13)], "one fingerprint per step, written once"
    # Validation was sharded over the ranks and summed: every image counted exactly once, by
    # the checkpointed model (rank 0's BatchNorm statistics on every rank, not each rank's own).
    out = straight / "evaluated.json"
    evaluated = run_cli(
        "repro.evaluate", f"ckpt={straight / 'checkpoints' / 'last.pt'}", "split=val", f"out={out}"
    )
    assert evaluated.returncode == 0, evaluated.stderr
    result = json.loads(out.read_text())
    assert result["acc"] == summary["val_acc"]
    # Each rank's own statistics moved the loss by ~1e-5 (relative); batching, by ~1e-8 at most.
    assert result["loss"] == pytest.approx(summary["val_loss"], rel=1e-7, abs=0)


# Two torchrun jobs: in make test-all only. make test keeps two processes' exactness in
# test_world_invariant (two processes give the weights of one).
@pytest.mark.e2e
@pytest.mark.slow
def test_rerun_gives_the_same_weights(straight, tmp_path):
    done = torchrun(*DDP, f"hydra.run.dir={tmp_path / 'again'}")
    assert done.returncode == 0, done.stderr[-3000:]
    assert (
        read_summary(tmp_path / "again")["weights_sha256"]
        == read_summary(straight)["weights_sha256"]
    )


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkill_of_the_whole_job_then_resume_is_exact(straight, tmp_path):
    run_dir = tmp_path / "killed"
    killed = torchrun(*DDP, f"hydra.run.dir={run_dir}", env={"REPRO_FAULT": "step:9"})
    assert killed.returncode != 0
    assert not (run_dir / "summary.json").exists()
    resumed = torchrun(*DDP, f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 8
    assert summary["weights_sha256"] == read_summary(straight)["weights_sha256"]


def test_ranks_see_disjoint_shards_that_cover_the_epoch():
    ranks = [EpochBatches(100, 8, root_seed=3, rank=r, world=2) for r in (0, 1)]
    seen = []
    for sampler in ranks:
        sampler.set_epoch(5)
        seen.append([index for batch in sampler for epoch, index in batch])
    assert not set(seen[0]) & set(seen[1])
    assert len(seen[0]) == len(seen[1]) == 6 * 8  # 100 // (8 * 2) steps of 8 per rank
    order = ranks[0].order(5).tolist()
    assert sorted(seen[0] + seen[1]) == sorted(order[: 6 * 16])  # the dropped tail is 4 images
    single = EpochBatches(100, 16, root_seed=3)
    single.set_epoch(5)
    for step, (a, b, both) in enumerate(zip(*(list(s) for s in ranks), single, strict=True)):
        assert a + b == both, f"step {step}: the ranks together take the single-process batch"


def test_sync_batchnorm_on_cpu_is_a_clear_config_error():
    import torch

    from repro.core import build
    from repro.core.errors import ConfigError
    from repro.core.runtime.distributed import Context
    from repro.extras.models.small_cnn import SmallCNN

    with pytest.raises(ConfigError, match=r"trainer\.sync_batchnorm"):
        build.data_parallel(SmallCNN(), True, Context(rank=0, world=2), torch.device("cpu"))
    model = SmallCNN()
    assert build.data_parallel(model, True, Context(), torch.device("cpu")) is model


def test_ranks_agree_on_a_stop_signal_every_ten_steps_only(monkeypatch):
    """A stop flag read back from an all-reduce waits for the GPU: not on every step."""
    reduced = []

    def fake_max(tensor, context):
        assert context is torchrun_context  # the job's ranks, not another group
        reduced.append(int(tensor.item()))
        return torch.tensor([max(reduced[-1], signal.SIGTERM)])  # another rank got SIGTERM

    monkeypatch.setattr(signals.distributed, "max_tensor", fake_max)
    no_signal_here = signals.StopRequest()
    torchrun_context = SimpleNamespace(enabled=True)
    agreed = [no_signal_here.agreed(step, torchrun_context) for step in range(1, 31)]
    assert [s for s, a in enumerate(agreed, 1) if a is not None] == [10, 20, 30]
    assert set(agreed) == {None, signal.SIGTERM} and reduced == [0, 0, 0]


def test_a_stop_signal_is_caught_noted_once_and_the_handlers_put_back(caplog):
    """In the block a stop signal asks for a checkpoint instead of ending the process."""
    assert set(signals.STOP_SIGNALS) == {signal.SIGTERM, signal.SIGINT, signal.SIGUSR1}
    outside = []  # the handlers outside the block: a signal there is recorded, not fatal
    originals = {n: signal.signal(n, lambda n, f: outside.append(n)) for n in signals.STOP_SIGNALS}
    try:
        _stop_request_in_the_main_thread(caplog, outside)
    finally:
        for signum, handler in originals.items():
            signal.signal(signum, handler)


def _stop_request_in_the_main_thread(caplog, outside):
    import threading

    before = {signum: signal.getsignal(signum) for signum in signals.STOP_SIGNALS}
    alone = SimpleNamespace(enabled=False)  # no torchrun: this process decides alone
    with signals.StopRequest() as stop:
        assert stop.agreed(3, alone) is None
        os.kill(os.getpid(), signal.SIGUSR1)
        assert stop.signum == signal.SIGUSR1 and stop.agreed(3, alone) == signal.SIGUSR1
        os.kill(os.getpid(), signal.SIGTERM)  # a second one: the latest is kept, not noted
        assert stop.agreed(4, alone) == signal.SIGTERM
    noted = [r.getMessage() for r in caplog.records if r.name == "repro.core.runs.signals"]
    assert noted == ["got SIGUSR1: saving a checkpoint at the end of this step"]
    assert {signum: signal.getsignal(signum) for signum in before} == before and outside == []
    os.kill(os.getpid(), signal.SIGUSR1)  # after the block: the handler from before again
    assert outside == [signal.SIGUSR1] and stop.signum == signal.SIGTERM
    installed = []  # off the main thread Python cannot install a handler: none is tried
    worker = threading.Thread(target=lambda: installed.append(signals.StopRequest().__enter__()))
    worker.start()
    worker.join()
    assert installed[0]._previous == {}


@pytest.mark.e2e
@pytest.mark.slow
def test_the_ranks_test_the_best_pt_its_last_checkpoint_wrote(tmp_path):
    # One epoch, one evaluation: best.pt appears only with the run's last checkpoint, which
    # rank 0 writes in the background; every rank must test those same weights.
    run_dir = tmp_path / "run"
    overrides = tiny("trainer.batch_size=32", "dataloader.num_workers=0")
    done = torchrun(*overrides, f"hydra.run.dir={run_dir}", timeout=180)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = read_summary(run_dir)
    assert summary["test_weights"] == "best" and summary["best_step"] == 6
    out = run_dir / "tested.json"
    best = run_dir / "checkpoints" / "best.pt"
    tested = run_cli("repro.evaluate", f"ckpt={best}", "split=test", f"out={out}")
    assert tested.returncode == 0, tested.stderr
    assert json.loads(out.read_text())["acc"] == summary["test_acc"]


@pytest.mark.e2e
@pytest.mark.slow
def test_every_rank_refuses_a_folder_that_a_live_run_owns(tmp_path):
    """Rank 0 takes the folder's lock for all ranks: when it is taken, every rank stops."""
    run_dir = tmp_path / "run"
    assert run_lock.try_claim(run_dir) is None  # this test process is the live owner
    try:
        done = torchrun(*DDP, f"hydra.run.dir={run_dir}")
    finally:
        run_lock.release(run_dir)
    assert done.returncode != 0
    refusals = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(refusals) == 2, done.stderr[-3000:]  # one line from each rank
    assert all(f"in use by a live run (pid {os.getpid()} on " in line for line in refusals)
    assert [path.name for path in run_dir.iterdir()] == ["train.log"]  # Hydra's, empty
