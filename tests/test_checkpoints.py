"""Checkpoints through training runs: complete state, resumes past damage, refusals at the
entry points. The module on its own: test_checkpoint_units.py."""

from __future__ import annotations

import signal
import threading

import pytest
import torch
from omegaconf import OmegaConf, open_dict

from repro import evaluate
from repro.core.errors import CheckpointError
from repro.core.runs import checkpoint, resume
from repro.core.runs.checkpoint import Checkpointer, DamagedCheckpointError

from conftest import Exploit, compose_config, read_summary, run_cli, tiny, train_in_process

KEEP = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2", "trainer.keep_checkpoints=3")


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
    from repro.core.watch.metrics import host_bytes

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

    from repro.core.runtime.distributed import Context

    model = torch.nn.Linear(1, 1)
    return SimpleNamespace(
        model=build_model(), callbacks={"ema": SimpleNamespace(model=model)},
        outputs=SimpleNamespace(checkpointer=SimpleNamespace(folder=run_dir / "checkpoints")),
        state=SimpleNamespace(best=SimpleNamespace(step=best_step)),
        dist=Context(rank=rank, world=2 if rank else 1),
    )  # fmt: skip


def build_model():
    from repro.core import build

    return build.model(compose_config(*tiny()), 7)


def test_the_test_uses_best_pt_of_this_runs_best_step_as_a_copy(best_run):
    from repro.core.engine.final_test import _weights

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
    from repro.core.engine.final_test import _weights

    run_dir, best_step = best_run
    step = best_step + 1 if recorded else None
    trainer = trainer_with(run_dir, step)
    assert _weights("best", trainer) == ("last", trainer.model)
    (said,) = [r.getMessage() for r in caplog.records if r.name == "repro.core.engine.final_test"]
    assert said == (
        f"no {run_dir / 'checkpoints' / 'best.pt'} of the best step ({step}) in this run folder "
        "(checkpoints off, or resumed from another folder's checkpoint): testing the last weights"
    )


def test_every_rank_tests_the_weights_rank_0_chose(best_run, monkeypatch):
    from repro.core.engine import final_test

    run_dir, best_step = best_run
    asked = []

    def rank_0s_answer(value, dist):
        asked.append(value)
        return True  # rank 0 found this run's best.pt

    monkeypatch.setattr(final_test.distributed, "broadcast", rank_0s_answer)
    trainer = trainer_with(run_dir, best_step, rank=1)
    which, model = final_test._weights("best", trainer)
    assert which == "best" and model is not trainer.model and asked == [False]
