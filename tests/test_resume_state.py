"""A resume restores every part of a run's state, including those that no default run
exercises: the global generators (dropout) and the fp16 loss scaler."""

from __future__ import annotations

import copy

import pytest
import torch

from repro.core.runs import checkpoint
from repro.core.runtime import precision

from conftest import compose_config, tiny, train_in_process

SMALL = tiny("trainer.epochs=2", "trainer.checkpoint_every_steps=2")
ANY_MODEL = [o for o in SMALL if not o.startswith("model.")]  # a model of another kind


def test_a_resumed_run_with_dropout_ends_on_the_straight_weights(tmp_path):
    dropout = [*ANY_MODEL, "model=torchvision", "model._target_=colleague_nets.dropout_net"]
    straight = train_in_process(tmp_path / "straight", *dropout)
    train_in_process(tmp_path / "run", *dropout, "trainer.halt_at_step=5")
    resumed = train_in_process(tmp_path / "run", *dropout)
    assert resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == straight["weights_sha256"]


def test_an_objective_with_state_resumes_it_and_one_without_adds_nothing(tmp_path):
    counting = [
        *SMALL,
        "objective._target_=colleague_nets.CountingObjective",
        "~objective.label_smoothing",
    ]
    straight = train_in_process(tmp_path / "straight", *counting)
    train_in_process(tmp_path / "run", *counting, "trainer.halt_at_step=5")
    resumed = train_in_process(tmp_path / "run", *counting)
    assert resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    saved = checkpoint.load(tmp_path / "run" / "checkpoints" / "last.pt")
    assert saved["objective"]["calls"] >= straight["step"]  # training's calls, evaluation's too
    plain = train_in_process(tmp_path / "plain", *SMALL)
    assert "objective" not in checkpoint.load(tmp_path / "plain" / "checkpoints" / "last.pt")
    assert plain["weights_sha256"]


@pytest.fixture
def fp16_on_cpu(monkeypatch):
    """Let amp=fp16 run on the CPU (autocast and an enabled GradScaler), as it runs on a GPU."""
    monkeypatch.setattr(precision, "_supports", lambda device, mode: True)


@pytest.mark.slow
def test_the_loss_scalers_state_survives_a_resume(fp16_on_cpu, tmp_path):
    fp16 = [*SMALL, "amp=fp16"]
    straight = train_in_process(tmp_path / "straight", *fp16)
    train_in_process(tmp_path / "run", *fp16, "trainer.halt_at_step=5")
    resumed = train_in_process(tmp_path / "run", *fp16)
    assert resumed["amp"] == "fp16" and resumed["resumed_from_step"] == 5
    assert resumed["weights_sha256"] == straight["weights_sha256"]
    scalers = [
        checkpoint.load(folder / "checkpoints" / "last.pt")["scaler"]
        for folder in (tmp_path / "straight", tmp_path / "run")
    ]
    assert scalers[0]["_growth_tracker"] == straight["step"]  # enabled: it counted every step
    assert scalers[1] == scalers[0]


def test_fp16_on_cpu_is_still_refused_without_the_test_switch():
    with pytest.raises(Exception, match="fp16"):
        precision.Precision("fp16", torch.device("cpu"))


# ---- runs/resume.py's units: which checkpoint, and whether the config still matches it -------


def test_targets_recorded_before_the_tiers_became_folders_read_under_todays_names():
    from repro.core.runs import resume

    old = {
        "data": {"_target_": "repro.data.datasets.imagefolder", "root": "x"},
        "model": {"_target_": "repro.models.small_cnn.SmallCNN"},
        "objective": {"_target_": "repro.multilabel.objective.MultilabelBCE"},
        "components": {"ema": {"_target_": "repro.components.ema.WeightAverage"}},
        "metrics": {"f1": {"_target_": "torchmetrics.F1Score"}},
        "callbacks": {
            "mine": {
                "_target_": "repro_lab.confusion.Log",
                "deep": [{"_target_": "repro.watch.x.Y"}],
            }
        },
    }
    upgraded = resume.upgrade(old)
    assert upgraded["data"] == {"_target_": "repro.core.data.datasets.imagefolder", "root": "x"}
    assert upgraded["model"]["_target_"] == "repro.extras.models.small_cnn.SmallCNN"
    assert upgraded["objective"]["_target_"] == "repro.extras.multilabel.objective.MultilabelBCE"
    assert upgraded["components"]["ema"]["_target_"] == resume.AVERAGE
    assert upgraded["metrics"]["f1"]["_target_"] == "torchmetrics.F1Score"  # not ours: as it was
    mine = upgraded["callbacks"]["mine"]
    assert mine["_target_"] == "repro_lab.confusion.Log"  # a package whose name starts alike
    assert mine["deep"] == [{"_target_": "repro.core.watch.x.Y"}]  # nested in a list too


def test_an_old_records_layout_is_upgraded_to_todays_and_the_record_left_alone():
    from repro.core.runs import resume

    old = {"data": {"name": "synthetic", "n": 1},
           "trainer": {"label_smoothing": 0.1, "ema_decay": 0.99, "lookahead_every": 5,
                       "lookahead_decay": 0.8, "epochs": 2},
           "model": {"_target_": "repro.models.resnet9.ResNet9"},
           "components": {"mine": {"_target_": "x.Y"}}}  # fmt: skip
    kept = copy.deepcopy(old)
    assert resume.upgrade(old) == {
        "data": {"_target_": "repro.core.data.datasets.synthetic", "n": 1},
        "trainer": {"epochs": 2},
        "model": {"_target_": "repro.extras.recipes.resnet9.ResNet9"},
        "objective": {"_target_": resume.DEFAULT_OBJECTIVE, "label_smoothing": 0.1},
        "components": {
            "ema": {"_target_": resume.AVERAGE, "decay": 0.99},
            "lookahead": {"_target_": resume.LOOKAHEAD, "every": 5, "decay": 0.8,
                          "ramp": "constant"},
            "mine": {"_target_": "x.Y"},
        },
    }  # fmt: skip
    assert old == kept
    assert list(resume.upgrade(old)["components"]) == ["ema", "lookahead", "mine"]
    today = {"data": {"_target_": "d.b", "name": "n"}, "objective": {"_target_": "o"},
             "trainer": {"lookahead_every": None, "lookahead_decay": 0.5}, "model": {}}  # fmt: skip
    assert resume.upgrade(today) == {"data": {"_target_": "d.b", "name": "n"},
                                     "objective": {"_target_": "o"}, "trainer": {}, "model": {}}  # fmt: skip
    assert resume.upgrade({"trainer": {}})["objective"]["label_smoothing"] == 0.0
    for section in ("trainer", "data", "model", "components"):
        not_ours = {section: [1], "data": {"name": "x"}} if section != "data" else {"data": [1]}
        assert resume.upgrade(not_ours) == not_ours, section
    # lookahead's decay and ramp as they were before they were recorded; no components yet
    older = {"trainer": {"lookahead_every": 4}, "data": {}, "model": {}}
    assert resume.upgrade(older)["components"] == {
        "lookahead": {"_target_": resume.LOOKAHEAD, "every": 4, "decay": 0.5, "ramp": "constant"}
    }
    older["trainer"]["lookahead_ramp"] = "linear"
    assert resume.upgrade(older)["components"]["lookahead"]["ramp"] == "linear"


def test_a_config_recorded_before_a_key_existed_gets_its_declared_value():
    from omegaconf import OmegaConf

    from repro.core.runs import resume

    key, value = next(iter(resume.DECLARED.items()))
    section = key.rsplit(".", 1)[0]
    cfg = OmegaConf.create({})
    OmegaConf.update(cfg, section, {}, force_add=True)
    resume.fill_declared(cfg)
    assert OmegaConf.select(cfg, key) == value
    OmegaConf.update(cfg, key, "set", force_add=True)
    resume.fill_declared(cfg)
    assert OmegaConf.select(cfg, key) == "set"  # a value it has is kept
    OmegaConf.update(cfg, key, "???", force_add=True)
    resume.fill_declared(cfg)
    assert OmegaConf.select(cfg, key) == value  # a missing one (???) is filled


def test_the_checkpoint_to_resume_from_and_what_the_attempt_records_of_it(tmp_path):
    from repro.core.runs import resume
    from repro.core.runs.checkpoint import Checkpointer

    run_dir = tmp_path / "run"
    train_in_process(run_dir, *tiny("trainer.epochs=1"))
    saver = Checkpointer(run_dir / "checkpoints", keep=2)
    assert resume.find("never", saver) is None
    found = resume.find("auto", saver)
    assert found["loaded_from"] == str(run_dir / "checkpoints" / "last.pt")
    assert found["skipped"] == []
    assert resume.provenance(found, run_dir) == {"resumed_from": "checkpoints/last.pt",
                                                 "skipped_checkpoints": []}  # fmt: skip
    elsewhere = tmp_path / "copy.pt"
    elsewhere.write_bytes((run_dir / "checkpoints" / "last.pt").read_bytes())
    given = resume.find(str(elsewhere), saver)
    assert given["loaded_from"] == str(elsewhere) and given["skipped"] == []
    assert resume.provenance(given, run_dir)["resumed_from"] == str(elsewhere)
    assert resume.provenance(None, run_dir) == {"resumed_from": None, "skipped_checkpoints": []}
    assert resume.find("auto", Checkpointer(tmp_path / "empty", keep=2)) is None
    (run_dir / "checkpoints" / "last.pt").unlink()  # a step file may share its inode
    (run_dir / "checkpoints" / "last.pt").write_bytes(b"PK\x03\x04 torn")
    passed_over = resume.find("auto", saver)["skipped"]  # the step file found, last.pt named
    assert len(passed_over) == 1 and "last.pt" in passed_over[0]
    for step_file in saver.step_files():
        step_file.unlink()
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.find("auto", saver)
    assert str(refused.value).startswith(f"no usable checkpoint in {run_dir / 'checkpoints'} ")


def test_a_fixed_seed_must_be_the_checkpoints_and_a_run_cannot_be_shortened():
    from omegaconf import OmegaConf

    from repro.core.runs import resume

    state = {"root_seed": 3, "position": {"step": "12"}}
    resume.check_seed(state, OmegaConf.create({"mode": "fixed", "value": 3}))
    resume.check_seed(state, OmegaConf.create({"mode": "random", "value": 9}))
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_seed(state, OmegaConf.create({"mode": "fixed", "value": 4}))
    assert str(refused.value) == (
        "seed=4 was asked, but this run folder's checkpoint was trained with seed=3: use a new "
        "run folder for seed 4, or ask for seed=3 to continue this run"
    )
    assert resume.check_length(state, 12) == 12 and resume.check_length(state, 20) == 12
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_length(state, 11)
    assert str(refused.value) == (
        "this run folder already holds 12 steps, and the config asks for 11 (trainer.epochs, "
        "trainer.max_steps): a run cannot be shortened; train the shorter run in a new folder"
    )


def test_a_machine_that_resolves_the_config_otherwise_is_refused_naming_each_setting():
    from omegaconf import OmegaConf

    from repro.core.runs import resume

    cfg = compose_config(*tiny())
    state = {"config": OmegaConf.to_container(cfg, resolve=True),
             "resolved": {"amp": "bf16", "device": "cuda", "memory_format": "x"}}  # fmt: skip
    resume.check_compatible(state, cfg, {"amp": "bf16", "device": "cuda", "memory_format": "x"})
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_compatible(state, cfg, {"amp": "off", "device": "cpu", "memory_format": "x"})
    assert str(refused.value) == (
        "this machine resolves the same config differently from the checkpoint's (amp: 'bf16' -> "
        "'off'; device: 'cuda' -> 'cpu'); resuming would change precision or device mid-run: "
        "resume where it was trained, or name the setting (e.g. amp=bf16, trainer.device=cuda) "
        "in a new run folder"
    )
    changed = OmegaConf.to_container(cfg, resolve=True)
    changed["optimizer"]["lr"] = 9.0
    changed["trainer"]["epochs"] = 99  # may change: not named
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_compatible({**state, "config": changed}, cfg, state["resolved"])
    assert str(refused.value) == (
        f"the config differs from the checkpoint's in 1 key(s) that change results "
        f"(optimizer.lr: 9.0 -> {cfg.optimizer.lr!r}); use a new run folder, or set them back"
    )
    many = copy.deepcopy(changed)
    many["extra"] = {f"k{i}": i for i in range(10)}
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_compatible({**state, "config": many}, cfg, state["resolved"])
    assert "in 11 key(s)" in str(refused.value) and str(refused.value).count(" -> ") == 8


def test_the_data_must_be_the_one_the_checkpoint_trained_on():
    from types import SimpleNamespace

    from repro.core.runs import resume

    class Split(list):
        def __init__(self, n, digest=None):
            super().__init__(range(n))
            if digest:
                self.digest = lambda: digest

    data = SimpleNamespace(train=Split(5, "t1"), val=Split(2), test=Split(3, "s1"),
                           classes=["a", "b"])  # fmt: skip
    assert resume.split_sizes(data) == {"train": 5, "val": 2, "test": 3}
    assert resume.split_digests(data) == {"train": "t1", "test": "s1"}
    same = {"classes": ["a", "b"], "split_sizes": {"train": 5, "val": 2},
            "split_digests": {"train": "t1"}}  # fmt: skip
    resume.check_same_data(same, data, "/d")
    resume.check_same_data({}, data, "/d")  # an old checkpoint recorded none of it
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_same_data(
            {**same, "split_sizes": {"train": 6, "val": 3, "test": 3}}, data, "/d"
        )
    assert str(refused.value) == (
        "data.root=/d: the data's splits changed since this run folder's checkpoint (train 6 -> "
        "5, val 3 -> 2 images); resuming would not continue the same run: put the data back as "
        "it was, or train the new data in a new run folder"
    )
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_same_data({**same, "split_digests": {"train": "t0", "test": "s0"}}, data, "/d")
    assert str(refused.value) == (
        "data.root=/d: the data's train, test changed since this run folder's checkpoint (its "
        "manifest is another); resuming would not continue the same run: put the data back as "
        "it was, or train the new data in a new run folder"
    )
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume.check_same_data({**same, "classes": ["b", "a"]}, data, "/d")
    assert str(refused.value) == (
        "data.root=/d: the data has the classes [a, b], but the checkpoint was trained on [b, a]; "
        "resuming would train another problem: point data.root at the data it was trained on, "
        "or put that data back as it was"
    )
    many = [f"c{i}" for i in range(8)]
    assert resume._listed(many) == "[c0, c1, c2, c3, c4, c5, ... (8 in all)]"
    assert resume._listed(many[:6]) == "[c0, c1, c2, c3, c4, c5]"
    assert resume._listed(many[:7]) == "[c0, c1, c2, c3, c4, c5, ... (7 in all)]"


def test_a_class_count_left_to_the_data_matches_the_count_a_checkpoint_stored():
    from omegaconf import OmegaConf

    from repro.core.runs import checkpoint, resume

    cfg = compose_config(*tiny())
    saved = OmegaConf.to_container(cfg, resolve=True)
    resume._check_config(saved, cfg, classes=10)
    inferred = compose_config(*tiny("data.num_classes=null", "model.num_classes=null"))
    resume._check_config(saved, inferred, classes=10)  # null now: what the data says, 10
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume._check_config(saved, compose_config(*tiny("data.num_classes=5")), classes=10)
    assert "data.num_classes: 10 -> 5" in str(refused.value)
    two = compose_config(*tiny("data.num_classes=5", "model.num_classes=5"))
    with pytest.raises(checkpoint.CheckpointError) as refused:
        resume._check_config(saved, two, classes=10)
    assert str(refused.value) == (
        "the config differs from the checkpoint's in 2 key(s) that change results "
        "(data.num_classes: 10 -> 5; model.num_classes: 10 -> 5); use a new run folder, or set "
        "them back"
    )


def test_truncating_the_logs_starts_no_tensorboard_writer(tmp_path):
    from repro.core.watch import loggers

    (tmp_path / "metrics.csv").write_text("step,loss\n1,2.0\n2,1.0\n")
    loggers.truncate_logs(tmp_path, 1)
    assert (tmp_path / "metrics.csv").read_text() == "step,loss\n1,2.0\n"
    assert not (tmp_path / "tb").exists()
