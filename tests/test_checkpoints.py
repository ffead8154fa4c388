"""Checkpoints: complete state, atomic files, safe loading, and clear refusals."""

from __future__ import annotations

import os
import pickle
import random
import shlex
import signal
import threading

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf, open_dict

from repro import evaluate
from repro.errors import CheckpointError
from repro.runs import checkpoint, resume
from repro.runs.checkpoint import Checkpointer, DamagedCheckpointError

from conftest import compose_config, read_summary, run_cli, tiny, train_in_process

KEEP = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2", "trainer.keep_checkpoints=3")


class Exploit:
    """Unpickling this runs a command that creates `marker`: a checkpoint must never do that."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (shlex.join(["touch", self.marker]),))


def test_the_exploit_runs_code_when_unpickled(tmp_path):
    """So that the tests below, which find no marker, could have found one."""
    pickle.loads(pickle.dumps(Exploit(tmp_path / "pwned")))
    assert (tmp_path / "pwned").exists()


def test_a_checkpoint_holds_the_whole_state_and_loads_weights_only(tmp_path):
    train_in_process(tmp_path / "run", *KEEP)
    state = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")
    for key in ("model", "optimizer", "scheduler", "scaler", "position", "rng", "config", "best"):
        assert key in state
    (rng,) = state["rng"]  # one entry per process; a single process here
    assert set(rng) == {"python", "numpy", "torch", "device"}
    assert rng["device"] is None, "a CPU run holds no GPU generator state"
    assert state["position"]["step"] == 12 and state["position"]["epoch"] == 2
    assert state["config"]["trainer"]["epochs"] == 2
    names = sorted(p.name for p in (tmp_path / "run" / "checkpoints").iterdir())
    kept = ["step-00000008.pt", "step-00000010.pt", "step-00000012.pt"]
    assert names == ["best.pt", "last.pt", *kept]  # best.pt is never pruned


def test_rng_states_round_trip():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    saved = checkpoint.capture_rng(torch.device("cpu"))
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    checkpoint.restore_rng(saved, torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_truncated_newest_falls_back_to_the_previous_good_one(tmp_path):
    train_in_process(tmp_path / "run", *KEEP)
    folder = tmp_path / "run" / "checkpoints"
    newest = folder / "step-00000012.pt"
    newest.write_bytes(newest.read_bytes()[:1000])  # last.pt is the same file (hard link)
    path, state = Checkpointer(folder, keep=3).latest_good()
    assert path.name == "step-00000010.pt" and state["position"]["step"] == 10
    assert newest.exists() and (folder / "last.pt").exists(), "nothing is deleted"
    with pytest.raises(DamagedCheckpointError):
        checkpoint.load(newest)


@pytest.mark.e2e
@pytest.mark.slow
def test_resume_after_truncation_still_ends_with_the_same_weights(tmp_path):
    reference = train_in_process(tmp_path / "ref", *KEEP)["weights_sha256"]
    run_dir = tmp_path / "run"
    command = [*KEEP, f"hydra.run.dir={run_dir}"]
    killed = run_cli("repro.train", *command, env={"REPRO_FAULT": "step:11"})
    assert killed.returncode != 0
    newest = run_dir / "checkpoints" / "step-00000010.pt"
    newest.write_bytes(newest.read_bytes()[:500])
    resumed = run_cli("repro.train", *command)
    assert resumed.returncode == 0, resumed.stderr
    assert "skipping checkpoint" in resumed.stdout + resumed.stderr
    summary = read_summary(run_dir)
    assert summary["resumed_from_step"] == 8
    assert summary["weights_sha256"] == reference


def test_foreign_and_malicious_files_are_refused(tmp_path):
    foreign = tmp_path / "foreign.pt"
    torch.save({"state_dict": {"w": torch.zeros(2)}}, foreign)
    with pytest.raises(CheckpointError, match="not a repro checkpoint"):
        checkpoint.load(foreign)

    text = tmp_path / "notes.pt"
    text.write_text("hello")
    with pytest.raises(CheckpointError, match="not a checkpoint"):
        checkpoint.load(text)

    evil = tmp_path / "evil.pt"
    payload = Exploit(tmp_path / "pwned")
    torch.save({"format": "repro-checkpoint", "version": 1, "payload": payload}, evil)
    with pytest.raises(CheckpointError, match="refused") as refused:
        checkpoint.load(evil)
    assert not isinstance(refused.value, DamagedCheckpointError)
    assert not (tmp_path / "pwned").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_a_malicious_last_pt_stops_auto_resume_and_is_kept(tmp_path):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *KEEP)
    last = run_dir / "checkpoints" / "last.pt"
    last.unlink()
    payload = Exploit(tmp_path / "pwned")
    torch.save({"format": "repro-checkpoint", "version": 1, "payload": payload}, last)
    done = run_cli("repro.train", *KEEP, f"hydra.run.dir={run_dir}")
    assert done.returncode == 2
    assert "refused" in done.stderr and "Traceback" not in done.stderr
    assert last.exists() and (run_dir / "checkpoints" / "step-00000012.pt").exists()
    assert not (tmp_path / "pwned").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_resume_path_with_a_foreign_file_is_refused(tmp_path):
    foreign = tmp_path / "model.pt"
    torch.save({"w": torch.zeros(1)}, foreign)
    done = run_cli("repro.train", *tiny(f"trainer.resume={foreign}"),
                   f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode == 2 and "not a repro checkpoint" in done.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_resuming_under_a_different_config_names_the_keys(tmp_path):
    run_dir = tmp_path / "run"
    train_in_process(run_dir, *KEEP)
    done = run_cli("repro.train", *KEEP, "optimizer.lr=0.5", "trainer.batch_size=32",
                   f"hydra.run.dir={run_dir}")  # fmt: skip
    assert done.returncode == 2
    assert "optimizer.lr: 0.2 -> 0.5" in done.stderr and "trainer.batch_size" in done.stderr
    more = run_cli("repro.train", *KEEP, "trainer.epochs=3", f"hydra.run.dir={run_dir}")
    assert more.returncode == 0, more.stderr
    assert read_summary(run_dir)["resumed_from_step"] == 12
    assert read_summary(run_dir)["step"] == 18


def test_checkpointer_keeps_the_newest_k_and_last_points_at_the_newest(tmp_path):
    keeper = Checkpointer(tmp_path, keep=2)
    for step in (1, 2, 3):
        keeper.save({"position": {"step": step}}, step)
    keeper.wait()
    assert [p.name for p in keeper.step_files()] == ["step-00000003.pt", "step-00000002.pt"]
    assert checkpoint.load(tmp_path / "last.pt")["position"]["step"] == 3
    (tmp_path / ".step-00000004.pt.123.tmp").write_bytes(b"half")
    Checkpointer(tmp_path, keep=2)
    assert not list(tmp_path.glob(".*.tmp"))


def test_checkpoints_are_written_on_a_background_thread_and_complete_at_the_end(
    tmp_path, monkeypatch
):
    writers = []
    original = checkpoint.atomic_save

    def recording(obj, path, step=-1):
        writers.append(threading.current_thread().name)
        original(obj, path, step)

    monkeypatch.setattr(checkpoint, "atomic_save", recording)
    summary = train_in_process(tmp_path / "run", *KEEP)
    assert writers and set(writers) == {"checkpoint-writer"}, "the training thread never writes"
    folder = tmp_path / "run" / "checkpoints"
    last = checkpoint.load(folder / "last.pt")  # complete on disk when train() returns
    assert last["position"]["step"] == summary["total_steps"] == 12
    assert not list(folder.glob(".*.tmp"))


def test_the_saved_state_is_a_copy_taken_at_save_time(tmp_path):
    weights = torch.zeros(3)
    keeper = Checkpointer(tmp_path, keep=2)
    keeper.save({"model": {"w": weights}, "position": {"step": 1}}, 1)
    weights.add_(1)  # the next training step, while the write may still be going on
    keeper.wait()
    assert torch.equal(checkpoint.load(tmp_path / "last.pt")["model"]["w"], torch.zeros(3))


@pytest.mark.e2e
@pytest.mark.slow
def test_a_kill_during_a_background_write_leaves_the_previous_checkpoint_usable(tmp_path):
    run_dir = tmp_path / "run"
    killed = run_cli("repro.train", *KEEP, f"hydra.run.dir={run_dir}",
                     env={"REPRO_FAULT": "checkpoint:10"})  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    path, state = Checkpointer(run_dir / "checkpoints", keep=3).latest_good()
    assert path.name == "last.pt" and state["position"]["step"] == 8
    resumed = run_cli("repro.train", *KEEP, f"hydra.run.dir={run_dir}")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_summary(run_dir)["resumed_from_step"] == 8


def marked(value: int) -> dict:
    return {"model": {"w": torch.tensor([value])}, "position": {"step": value}}


def best_weights(folder) -> int:
    return int(checkpoint.load(folder / "best.pt")["model"]["w"])


def test_best_pt_changes_only_once_a_checkpoint_records_the_new_best(tmp_path):
    keeper = Checkpointer(tmp_path, keep=2)
    keeper.save_best(marked(1), 1)
    keeper.save(marked(1), 1)
    keeper.save_best(marked(3), 3)  # a better evaluation after the checkpoint of step 1
    keeper.wait()
    assert best_weights(tmp_path) == 1  # last.pt records step 1's best
    assert (tmp_path / "best-00000003.pt").exists()
    keeper.save_best(marked(4), 4)
    keeper.wait()  # step 3's can never be promoted now: one pending best at a time
    assert [path.name for path in tmp_path.glob("best-*.pt")] == ["best-00000004.pt"]
    keeper.save(marked(5), 5)
    keeper.wait()
    assert best_weights(tmp_path) == 4 and not list(tmp_path.glob("best-*.pt"))


def test_a_resume_keeps_the_best_its_checkpoint_records_and_drops_later_ones(tmp_path):
    keeper = Checkpointer(tmp_path, keep=2)
    keeper.save_best(marked(1), 1)
    keeper.save(marked(2), 2)
    keeper.save_best(marked(3), 3)
    keeper.wait()  # then killed before the checkpoint of step 4
    Checkpointer(tmp_path, keep=2).settle_best(best_step=1)
    assert best_weights(tmp_path) == 1 and not list(tmp_path.glob("best-*.pt"))
    # Killed after last.pt named the checkpoint of step 5 but before its best was renamed:
    keeper.save_best(marked(5), 5)
    keeper.wait()
    Checkpointer(tmp_path, keep=2).settle_best(best_step=5)
    assert best_weights(tmp_path) == 5 and not list(tmp_path.glob("best-*.pt"))
    # Resumed from an older checkpoint, whose best was step 1: best.pt (step 5) is not its own.
    Checkpointer(tmp_path, keep=2).settle_best(best_step=1)
    assert not (tmp_path / "best.pt").exists()


@pytest.mark.e2e
@pytest.mark.slow
def test_best_pt_agrees_with_the_summary_when_a_resume_never_repeats_a_lost_evaluation(
    tmp_path,
):
    run_dir = tmp_path / "run"
    # The default widths: their validation loss falls within a few steps of the first.
    every_step = [*tiny("trainer.eval_every_steps=1", "trainer.monitor=val_loss",
                        "trainer.monitor_mode=min"), "model.widths=[16,32,64,128]"]  # fmt: skip
    train_in_process(run_dir, *every_step, "trainer.halt_at_step=1")  # checkpoint at step 1
    killed = run_cli("repro.train", *every_step, f"hydra.run.dir={run_dir}",
                     env={"REPRO_FAULT": "step:6"})  # fmt: skip
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    # Steps 2 to 5 were evaluated after the last checkpoint (step 1), and at least one was a
    # new best; then the process died.
    assert list((run_dir / "checkpoints").glob("best-*.pt")), "no better evaluation in 2..5"
    # Resumed to end where it is: steps 2 to 5 are never evaluated again.
    summary = train_in_process(run_dir, *every_step, "trainer.max_steps=1")
    assert summary["resumed_from_step"] == 1 and summary["best_step"] == 1
    best = evaluate.evaluate_checkpoint(run_dir / "checkpoints" / "best.pt", split="val")
    assert best["step"] == 1 and best["loss"] == summary["best_val_loss"]
    assert not list((run_dir / "checkpoints").glob("best-*.pt"))


def test_a_new_run_in_an_old_folder_drops_the_old_best(tmp_path):
    train_in_process(tmp_path, *tiny())
    assert (tmp_path / "checkpoints" / "best.pt").exists()
    again = train_in_process(tmp_path, *tiny("trainer.resume=never",
                                             "trainer.save_checkpoints=false"))  # fmt: skip
    assert again["test_weights"] == "last", "the old run's best.pt is not this run's best"
    assert not (tmp_path / "checkpoints" / "best.pt").exists()


def test_a_checkpoint_from_before_a_key_existed_resumes_under_its_old_behaviour():
    cfg = compose_config(*KEEP)
    saved = OmegaConf.to_container(cfg, resolve=True)
    # The keys added since checkpoint format 3, each declared as what runs did before it.
    before_they_existed = {
        "augment.cutout": 0, "augment.flip": "random", "augment.crop_padding_mode": "zeros",
        "trainer.tta": "none", "optimizer.decay_biases_and_norms": True,
        "optimizer.lr_scale_biases_and_norms": 1.0, "trainer.init_weights": None,
        "trainer.profile_steps": None,
    }  # fmt: skip
    assert before_they_existed.items() <= resume.DECLARED.items()
    dropped = 0
    for key, default in resume.DECLARED.items():  # each key at its default, as if added since
        section, name = key.split(".")
        if saved[section].get(name, default) == default:
            saved[section].pop(name, None)
            dropped += 1
    assert dropped >= 10
    resume.check_compatible({"config": saved, "resolved": {}}, cfg, {})
    # An optimizer file of the user's, without the keys: its checkpoint resumes under a config
    # that spells out their old values, and is refused under one that changes them.
    cfg.optimizer = {"_target_": "torch.optim.RMSprop", "lr": 0.01}
    own = OmegaConf.to_container(cfg, resolve=True)
    with open_dict(cfg):
        cfg.optimizer.decay_biases_and_norms = True
    resume.check_compatible({"config": own, "resolved": {}}, cfg, {})
    cfg.optimizer.decay_biases_and_norms = False
    with pytest.raises(CheckpointError, match=r"optimizer\.decay_biases_and_norms: True -> False"):
        resume.check_compatible({"config": own, "resolved": {}}, cfg, {})
    cfg = compose_config(*KEEP)
    cfg.augment.cutout = 8
    with pytest.raises(CheckpointError, match=r"augment\.cutout: 0 -> 8"):
        resume.check_compatible({"config": saved, "resolved": {}}, cfg, {})


def test_a_halt_at_an_epoch_end_writes_that_step_once(tmp_path, monkeypatch):
    saved = []
    save = Checkpointer.save

    def counting(self, state, step):
        saved.append(step)
        return save(self, state, step)

    monkeypatch.setattr(Checkpointer, "save", counting)
    train_in_process(tmp_path, *tiny("trainer.epochs=2", "trainer.halt_at_step=6"))
    assert saved == [6]


def test_a_run_that_ends_inside_an_epoch_ends_with_its_checkpoint(tmp_path):
    mid_epoch = tiny("trainer.epochs=2", "trainer.max_steps=10", "trainer.eval_every_steps=5")
    summary = train_in_process(tmp_path, *mid_epoch)
    last = checkpoint.load(tmp_path / "checkpoints" / "last.pt")
    assert last["position"]["step"] == summary["step"] == 10
    assert train_in_process(tmp_path, *mid_epoch).get("already_complete")


def test_the_weights_hash_reads_every_tensor_the_same_through_one_flat_copy():
    from repro.watch.metrics import host_bytes

    tensors = [torch.randn(3, 4), torch.tensor(7), torch.ones(2, 2, dtype=torch.bfloat16).t(),
               torch.tensor([True, False])]  # fmt: skip
    one_by_one, gathered = host_bytes(tensors, gather=False), host_bytes(tensors, gather=True)
    assert [t.tolist() for t in one_by_one] == [t.tolist() for t in gathered]
    assert [len(t) for t in gathered] == [48, 8, 8, 2]


# ---- the unit: which weights the test after training uses -----------------------------------


@pytest.fixture(scope="module")
def best_run(tmp_path_factory):
    run_dir = tmp_path_factory.mktemp("best")
    summary = train_in_process(run_dir, *tiny("trainer.epochs=2"))
    return run_dir, summary["best_step"]


def trainer_with(run_dir, best_step, rank=0):
    from types import SimpleNamespace

    from repro.runtime.distributed import Context

    model = torch.nn.Linear(1, 1)
    return SimpleNamespace(
        model=build_model(), callbacks={"ema": SimpleNamespace(model=model)},
        outputs=SimpleNamespace(checkpointer=SimpleNamespace(folder=run_dir / "checkpoints")),
        state=SimpleNamespace(best=SimpleNamespace(step=best_step)),
        dist=Context(rank=rank, world=2 if rank else 1),
    )  # fmt: skip


def build_model():
    from repro import build

    return build.model(compose_config(*tiny()), 7)


def test_the_test_uses_best_pt_of_this_runs_best_step_as_a_copy(best_run):
    from repro.runs.final_test import _weights

    run_dir, best_step = best_run
    trainer = trainer_with(run_dir, best_step)
    which, model = _weights("best", trainer)
    saved = checkpoint.load(run_dir / "checkpoints" / "best.pt")["model"]
    assert which == "best" and model is not trainer.model
    assert all(torch.equal(model.state_dict()[k], saved[k]) for k in saved)
    assert not all(torch.equal(trainer.model.state_dict()[k], saved[k]) for k in saved)
    assert _weights("last", trainer) == ("last", trainer.model)
    assert _weights("ema", trainer) == ("ema", trainer.callbacks["ema"].model)


@pytest.mark.parametrize("recorded", ["another step", None])
def test_without_this_runs_best_pt_the_last_weights_are_tested_and_it_says_why(
    best_run, recorded, caplog
):
    from repro.runs.final_test import _weights

    run_dir, best_step = best_run
    step = best_step + 1 if recorded else None
    trainer = trainer_with(run_dir, step)
    assert _weights("best", trainer) == ("last", trainer.model)
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.runs.final_test"]
    assert said == (
        f"no {run_dir / 'checkpoints' / 'best.pt'} of the best step ({step}) in this run folder "
        "(checkpoints off, or resumed from another folder's checkpoint): testing the last weights"
    )


def test_every_rank_tests_the_weights_rank_0_chose(best_run, monkeypatch):
    from repro.runs import final_test

    run_dir, best_step = best_run
    asked = []

    def rank_0s_answer(value, dist):
        asked.append(value)
        return True  # rank 0 found this run's best.pt

    monkeypatch.setattr(final_test.distributed, "broadcast", rank_0s_answer)
    trainer = trainer_with(run_dir, best_step, rank=1)
    which, model = final_test._weights("best", trainer)
    assert which == "best" and model is not trainer.model and asked == [False]


# ---- the unit: reading a checkpoint, and the random state in it ----------------------------


def test_a_file_that_is_not_a_usable_checkpoint_is_refused_saying_why(best_run, tmp_path):
    from conftest import save_as_from_a_gpu

    good = checkpoint.load(best_run[0] / "checkpoints" / "last.pt")
    cases = {}

    def case(name, write, message, damaged=False):
        path = tmp_path / name
        write(path)
        cases[path] = (message.format(path=path), damaged)

    case("short.pt", lambda p: p.write_bytes(b"PK\x03"), "{path}: truncated (3 bytes)", True)
    case("text.pt", lambda p: p.write_text("weights"),
         "{path}: not a checkpoint (torch.save writes zip archives)")  # fmt: skip
    case("code.pt", lambda p: torch.save({"x": Exploit(tmp_path / "pwned")}, p),
         "{path}: refused, it holds pickled objects other than tensors and plain values "
         "(loading them could run code)")  # fmt: skip
    case("cut.pt", lambda p: p.write_bytes((best_run[0] / "checkpoints/last.pt").read_bytes()[:900]),
         "{path}: unreadable or truncated (RuntimeError)", True)  # fmt: skip
    case(
        "list.pt",
        lambda p: torch.save([1], p),
        "{path}: not a repro checkpoint (no 'repro-checkpoint' marker)",
    )
    case("other.pt", lambda p: torch.save({"format": "lightning"}, p),
         "{path}: not a repro checkpoint (no 'repro-checkpoint' marker)")  # fmt: skip
    case("v9.pt", lambda p: torch.save({**good, "version": 9}, p),
         "{path}: checkpoint format version 9, expected 4")  # fmt: skip
    case("rot.pt", lambda p: torch.save({**good, "position": {**good["position"], "step": 99}}, p),
         "{path}: damaged, its content no longer matches the digest written with it (bit rot, "
         "or a torn copy)", True)  # fmt: skip
    for path, (message, damaged) in cases.items():
        with pytest.raises(CheckpointError) as refused:
            checkpoint.load(path)
        assert str(refused.value) == message
        assert isinstance(refused.value, DamagedCheckpointError) is damaged, path.name
    assert not (tmp_path / "pwned").exists()
    with pytest.raises(CheckpointError, match="no such checkpoint file"):
        checkpoint.load(tmp_path / "missing.pt")
    old = tmp_path / "v3.pt"  # format 3 had no digest: read as it is
    torch.save({**good, "version": 3, "position": {**good["position"], "step": 99}}, old)
    assert checkpoint.load(old)["position"]["step"] == 99
    from_gpu = tmp_path / "from_gpu.pt"
    save_as_from_a_gpu(good, from_gpu)
    assert checkpoint.load(from_gpu)["position"] == good["position"]


def test_code_in_a_checkpoint_is_refused_even_with_torchs_default_switched_off(
    tmp_path, monkeypatch
):
    monkeypatch.setenv("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "1")
    path = tmp_path / "code.pt"
    torch.save({"format": checkpoint.FORMAT, "x": Exploit(tmp_path / "pwned")}, path)
    with pytest.raises(CheckpointError, match="refused"):
        checkpoint.load(path)
    assert not (tmp_path / "pwned").exists()


def test_the_random_state_round_trips_and_refuses_another_kind_of_device():
    saved = checkpoint.capture_rng(torch.device("cpu"))
    assert saved["device"] is None and saved["numpy"][1].dtype == torch.int64
    drawn = (random.random(), np.random.rand(), torch.rand(1).item())
    random.random(), np.random.rand(), torch.rand(3)  # the run draws on
    checkpoint.restore_rng(saved, torch.device("cpu"))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == drawn
    with pytest.raises(CheckpointError) as refused:
        checkpoint.restore_rng(saved, torch.device("cuda"))
    assert str(refused.value) == (
        "the checkpoint's random state is for the CPU, this run trains on cuda; resume on the "
        "kind of device it was trained on"
    )
    with pytest.raises(CheckpointError, match="is for a CUDA device, this run trains on cpu"):
        checkpoint.restore_rng({**saved, "device": torch.zeros(2)}, torch.device("cpu"))


def test_a_state_copied_to_the_host_no_longer_changes_with_training():
    weight = torch.ones(2, requires_grad=True)
    state = {"model": {"w": weight}, "list": [torch.zeros(1), 3], "pair": (torch.ones(1), "x"),
             "n": 5}  # fmt: skip
    host, copied = checkpoint.to_host(state)
    with torch.no_grad():
        weight.add_(1)
        state["list"][0].add_(1)
    assert copied is None  # nothing came from a GPU: nothing to wait for
    assert host["model"]["w"].tolist() == [1.0, 1.0] and not host["model"]["w"].requires_grad
    assert host["list"][0].tolist() == [0.0] and host["list"][1] == 3
    assert isinstance(host["pair"], tuple) and host["pair"][1] == "x" and host["n"] == 5


# ---- the unit: the Checkpointer's files ------------------------------------------------------


def small_state(step):
    return {"position": {"step": step}, "model": {"w": torch.full((2,), float(step))}}


def test_the_newest_checkpoints_are_kept_and_last_pt_is_a_link_to_the_newest(tmp_path):
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    (folder / ".step-00000009.pt.123.tmp").write_bytes(b"half")  # a killed run's
    saver = Checkpointer(folder, keep=2)
    assert not (folder / ".step-00000009.pt.123.tmp").exists() and saver.step_files() == []
    for step in (1, 2, 3, 4):
        assert saver.save(small_state(step), step) == folder / f"step-{step:08d}.pt"
    saver.wait()
    assert saver.step_files() == [folder / "step-00000004.pt", folder / "step-00000003.pt"]
    assert os.path.samefile(folder / "last.pt", folder / "step-00000004.pt")
    assert checkpoint.load(folder / "last.pt")["position"]["step"] == 4
    (folder / "step-00000099.txt").write_text("not ours")
    (folder / "step-1.pt").write_text("not ours either")
    assert len(saver.step_files()) == 2
    assert Checkpointer(tmp_path / "none", keep=1).step_files() == []


def test_best_pt_is_the_best_that_the_newest_checkpoint_records(tmp_path):
    folder = tmp_path / "checkpoints"
    saver = Checkpointer(folder, keep=3)
    saver.save(small_state(2), 2)
    saver.save_best(small_state(3), 3)
    saver.save_best(small_state(4), 4)  # a newer best: best-3 can never be promoted
    saver.wait()
    assert sorted(p.name for p in folder.glob("best*")) == ["best-00000004.pt"]
    saver.save(small_state(5), 5)  # on disk: the best evaluated by step 5 is best.pt
    saver.save_best(small_state(6), 6)  # pending until the next checkpoint
    saver.wait()
    assert checkpoint.best_step_of(folder / "best.pt") == 4
    assert sorted(p.name for p in folder.glob("best*")) == ["best-00000006.pt", "best.pt"]
    saver.settle_best(6)  # killed between the two renames: the pending best of step 6 stands
    assert checkpoint.best_step_of(folder / "best.pt") == 6 and not list(folder.glob("best-*"))
    saver.save_best(small_state(8), 8)
    saver.settle_best(6)  # resumed from step 6's checkpoint: later bests are dropped
    assert checkpoint.best_step_of(folder / "best.pt") == 6 and not list(folder.glob("best-*"))
    saver.settle_best(None)  # a fresh run in an old folder
    assert not (folder / "best.pt").exists()
    assert checkpoint.best_step_of(folder / "best.pt") is None


def test_a_failed_write_is_raised_by_the_next_wait(tmp_path, monkeypatch):
    saver = Checkpointer(tmp_path, keep=1)

    def full(obj, path, step=-1):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(checkpoint, "atomic_save", full)
    saver.save(small_state(1), 1)
    with pytest.raises(OSError, match="No space left"):
        saver.wait()
    saver.wait()  # raised once


def test_without_hard_links_last_pt_is_a_copy(tmp_path, monkeypatch):
    def refuse(source, target):
        raise OSError(1, "Operation not permitted")

    monkeypatch.setattr(checkpoint.os, "link", refuse)
    saver = Checkpointer(tmp_path, keep=1)
    saver.save(small_state(3), 3)
    saver.wait()
    assert not os.path.samefile(tmp_path / "last.pt", tmp_path / "step-00000003.pt")
    assert checkpoint.load(tmp_path / "last.pt")["position"]["step"] == 3


def test_a_resume_passes_damaged_checkpoints_and_names_them_but_stops_at_a_foreign_one(
    tmp_path, caplog
):
    saver = Checkpointer(tmp_path, keep=3)
    for step in (1, 2):
        saver.save(small_state(step), step)
    saver.wait()
    (tmp_path / "last.pt").unlink()
    (tmp_path / "last.pt").write_bytes(b"PK\x03\x04 torn")
    skipped = []
    path, state = saver.latest_good(skipped)
    assert path == tmp_path / "step-00000002.pt" and state["position"]["step"] == 2
    assert skipped == [f"{tmp_path / 'last.pt'}: unreadable or truncated (RuntimeError)"]
    said = [r.getMessage() for r in caplog.records if r.name == "repro.runs.checkpoint"]
    assert said == [f"skipping checkpoint: {skipped[0]}"]
    torch.save({"weights": 1}, tmp_path / "step-00000003.pt")  # someone else's file
    with pytest.raises(CheckpointError, match="not a repro checkpoint"):
        saver.latest_good()
    for path in tmp_path.glob("step-*"):
        path.write_bytes(b"PK\x03\x04 torn")
    with pytest.raises(CheckpointError) as refused:
        saver.latest_good()
    assert str(refused.value) == (
        f"no usable checkpoint in {tmp_path} (newest: {tmp_path / 'last.pt'}: unreadable or "
        "truncated (RuntimeError)); nothing to resume from: move the checkpoints aside to "
        "train afresh here, or use a new run folder"
    )
    assert Checkpointer(tmp_path / "empty", keep=1).latest_good() is None


def test_a_resume_finds_the_step_files_when_last_pt_is_gone(tmp_path):
    saver = Checkpointer(tmp_path / "a" / "b" / "checkpoints", keep=2)  # folders made on write
    for step in (1, 2):
        saver.save(small_state(step), step)
    saver.wait()
    (saver.folder / "last.pt").unlink()
    path, state = saver.latest_good()
    assert path == saver.folder / "step-00000002.pt" and state["position"]["step"] == 2


def test_a_disk_that_fills_while_a_checkpoint_is_written_is_the_disks_error(tmp_path, monkeypatch):
    from repro.errors import StorageError
    from repro.runs import faults

    monkeypatch.setenv(faults.VARIABLE, "checkpoint:7:ENOSPC")
    saver = Checkpointer(tmp_path, keep=2)
    saver.save(small_state(6), 6)
    saver.wait()  # another step: written
    saver.save(small_state(7), 7)
    with pytest.raises(StorageError) as refused:
        saver.wait()
    assert str(refused.value) == (
        f"cannot write {tmp_path / 'step-00000007.pt'}: No space left on device (ENOSPC)"
    )
    assert sorted(p.name for p in tmp_path.iterdir()) == ["last.pt", "step-00000006.pt"]


def test_torch_saves_failed_write_comes_out_as_the_os_error_it_was():
    import errno
    import io

    class Full(io.BytesIO):
        def write(self, data):
            if self.tell() + len(data) > 64:
                raise OSError(errno.ENOSPC, "No space left on device")
            return super().write(data)

    with pytest.raises(OSError) as refused:
        checkpoint._save({"w": torch.zeros(1000)}, Full())
    assert refused.value.errno == errno.ENOSPC
    checkpoint._save({"w": torch.zeros(1)}, io.BytesIO())  # room enough: no error


def test_what_is_not_a_checkpoint_of_ours_is_saved_as_it_is_and_ours_are_sealed(tmp_path):
    checkpoint.atomic_save([1, 2], tmp_path / "list.pt")
    assert torch.load(tmp_path / "list.pt", weights_only=True) == [1, 2]
    with pytest.raises(DamagedCheckpointError):  # no version: today's, which has a digest
        checkpoint.check_intact({"format": checkpoint.FORMAT, "model": {}}, "p")
