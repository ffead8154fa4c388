"""Bad input stops the run before training with one clear message, a non-zero exit, no traceback."""

from __future__ import annotations

import sys

import pytest
import torch
from hydra.errors import HydraException
from torch import nn

import repro.train
from repro.core import build, composition, config
from repro.core.engine.losses import NonFiniteLossError, PendingLosses
from repro.core.errors import ConfigError, UserError, one_line
from repro.core.runs.checkpoint import load
from repro.core.runs.fingerprint_log import FingerprintLog
from repro.core.runs.position import Position
from repro.core.runtime.distributed import Context
from repro.core.runtime.precision import Precision

from conftest import CONF, compose_config, run_cli, tiny, train_in_process

# Values the template itself refuses: in this process, as `train` raises them.
REFUSED = {
    "batch size 0": (["trainer.batch_size=0"], ["trainer.batch_size=0", ">= 1"]),
    "negative learning rate": (["optimizer.lr=-0.1"], ["optimizer.lr=-0.1", ">= 0"]),
    "unknown device": (["trainer.device=tpu"], ["trainer.device='tpu'", "auto, cpu, cuda"]),
    "missing imagefolder": (
        ["data=imagefolder", "data.root=/no/such/folder"],
        ["data.root=/no/such/folder", "expected a folder holding train/"],
    ),
    "fp16 on cpu": (["amp=fp16", "trainer.device=cpu"], ["amp='fp16'", "allowed here: off"]),
    "misspelt added key": (["+trainer.epocs=3"], ["trainer.epocs=3", "mean trainer.epochs?"]),
    "misspelt added section": (["+trainr.epochs=3"], ["trainr=", "did you mean trainer?"]),
    "warm-up longer than the run": (
        ["scheduler.warmup=1.5"],
        ["scheduler.warmup=1.5", "in [0, 1)"],
    ),
    "label smoothing of 1 or more": (
        ["objective.label_smoothing=1.5"],
        ["objective.label_smoothing=1.5", "in [0, 1)"],
    ),
    "a component that is no class": (
        ["+components.slow=5"],
        ["components.slow=5", "a class given by _target_"],
    ),
    "more than all the data": (["data.fraction=1.5"], ["data.fraction=1.5", "in (0, 1]"]),
    "misspelt optimizer argument": (
        ["+optimizer.momentun=0.9"],
        ["optimizer._target_", "could not build it", "momentun"],
    ),
    "missing init weights": (
        ["trainer.init_weights=/no/such/weights.pt"],
        ["trainer.init_weights=/no/such/weights.pt: no such file"],
    ),
    "model outputs other than the classes": (
        ["model.num_classes=5"],
        ["gives 5 outputs per image but the data has 10 classes"],
    ),
}

# Mistakes Hydra catches while it composes the config.
UNCOMPOSABLE = {
    "unknown group option": (["amp=fp61"], ["amp/fp61", "auto", "bf16", "off"]),
    "wrong type": (["trainer.epochs=abc"], ["trainer.epochs", "abc", "Integer"]),
    "unknown key": (["trainer.epoch=3"], ["trainer.epoch", "not in"]),
}


@pytest.mark.parametrize("case", REFUSED)
def test_a_refused_value_is_named_in_one_line_before_any_work(case, tmp_path):
    overrides, expected = REFUSED[case]
    with pytest.raises(UserError) as raised:
        train_in_process(tmp_path, *tiny(*overrides))
    message = one_line(raised.value)
    assert "\n" not in message
    for text in expected:
        assert text in message, f"{text!r} not in {message!r}"
    assert not any(tmp_path.iterdir()), "no file may be written"


@pytest.mark.parametrize("case", UNCOMPOSABLE)
def test_a_config_hydra_cannot_compose_names_the_override(case):
    overrides, expected = UNCOMPOSABLE[case]
    with pytest.raises(HydraException) as raised:
        compose_config(*tiny(*overrides))
    message = f"{raised.value}\n{raised.value.__cause__ or ''}"  # what Hydra prints
    for text in expected:
        assert text in message, f"{text!r} not in {message}"


# Keys the config lacks: Hydra says so in several lines; the command line says it in one.
UNKNOWN_KEYS = {
    "objective.label_smothing=0.1": "objective.label_smothing: not a key of objective; "
    "did you mean objective.label_smoothing?",
    "trainer.epoch=3": "trainer.epoch: not a key of trainer; did you mean trainer.epochs?",
    "trainr.epochs=3": "trainr: not a key of the config; did you mean trainer?",
    "callbacks.x=1": "callbacks.x: callbacks has no keys yet; add one with +callbacks.x",
}


@pytest.mark.parametrize("override", UNKNOWN_KEYS)
def test_an_unknown_key_on_the_command_line_is_one_line_naming_the_closest(
    override, tmp_path, monkeypatch, capsys
):
    # In this process Hydra cannot find conf/ from the module; the command line names it.
    argv = [
        "repro.train",
        f"--config-path={CONF}",
        *tiny(override),
        f"hydra.run.dir={tmp_path / 'run'}",
    ]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited, composition.one_line_composition_errors():
        repro.train.main()  # as `python -m repro.train` runs it
    assert exited.value.code == 2
    assert capsys.readouterr().err == f"error: {UNKNOWN_KEYS[override]}\n"
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["amp=fp61"], "Could not find 'amp/fp61'"),
        (["trainer.batch_size=0"], "error: trainer"),
        (["objective.gama=3"], "error: objective.gama: not a key of objective; did you mean"),
    ],
)
@pytest.mark.slow
def test_on_the_command_line_a_mistake_is_a_message_without_traceback(
    overrides, expected, tmp_path
):
    done = run_cli("repro.train", *tiny(*overrides), f"hydra.run.dir={tmp_path / 'run'}")
    assert done.returncode != 0
    assert "Traceback" not in done.stdout + done.stderr
    assert expected in done.stderr
    assert not (tmp_path / "run" / "checkpoints").exists(), "no training work may happen"


@pytest.mark.slow
def test_config_errors_keep_earlier_results(tmp_path):
    run_dir = tmp_path / "run"
    assert run_cli("repro.train", *tiny(), f"hydra.run.dir={run_dir}").returncode == 0
    summary = (run_dir / "summary.json").read_text()
    done = run_cli("repro.train", *tiny("optimizer.lr=-1"), f"hydra.run.dir={run_dir}")
    assert done.returncode == 2
    assert (run_dir / "summary.json").read_text() == summary
    assert (run_dir / "checkpoints" / "last.pt").exists()


@pytest.mark.slow
def test_a_diverging_run_stops_at_its_first_non_finite_loss_keeping_its_checkpoint(tmp_path):
    run_dir = tmp_path / "run"
    overrides = "optimizer.lr=1e12", "trainer.checkpoint_every_steps=2"
    done = run_cli("repro.train", *tiny(*overrides), f"hydra.run.dir={run_dir}")
    assert done.returncode == 2 and "Traceback" not in done.stdout + done.stderr
    (message,) = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    step = int(message.split(" at step ")[1].split(";")[0])
    assert "loss is nan" in message and str(run_dir / "checkpoints") in message
    # Every step before the first non-finite loss was logged; the checkpoint before it stands.
    logged = FingerprintLog.of_run(run_dir).read()
    assert [row.step for row in logged] == list(range(1, step))
    kept = load(run_dir / "checkpoints" / "last.pt")
    assert 0 < kept["position"]["step"] < step


def test_the_losses_before_a_non_finite_one_are_logged_and_their_sums_left_alone(tmp_path):
    log = FingerprintLog(tmp_path / "fingerprints.csv")
    pending = PendingLosses(log, 50, Context(), False, tmp_path)
    for value in (1.0, 2.0, float("inf"), 4.0):
        pending.append({"loss": torch.tensor(value)})
    position = Position(step=14)
    with pytest.raises(NonFiniteLossError, match="loss is inf at step 13"):
        pending.flush(position, nn.Linear(1, 1))
    assert [(row.step, float(row.loss)) for row in log.read()] == [(11, 1.0), (12, 2.0)]
    assert position.loss_count == 0


def test_an_argument_the_objective_does_not_take_is_refused_before_any_data_loads(
    tmp_path, monkeypatch
):
    def no_data(*args: object) -> None:
        raise AssertionError("the data was loaded")

    monkeypatch.setattr(build, "splits", no_data)
    with pytest.raises(ConfigError) as raised:
        train_in_process(tmp_path, *tiny("+objective.gama=3"))
    assert str(raised.value) == (
        "objective.gama=3 is not allowed: not an argument of repro.core.tasks.objectives.CrossEntropy, "
        "which takes label_smoothing"
    )


class TakesAnyArguments:
    """An objective taking **kwargs: the config may give it any argument."""

    def __init__(self, **kwargs: object) -> None:
        self.kwargs = kwargs


def test_an_objective_taking_any_argument_takes_added_keys():
    target = f"objective._target_={__name__}.TakesAnyArguments"
    config.validate(compose_config(*tiny(target, "+objective.gama=3")))


def test_keys_added_to_free_form_nodes_are_accepted():
    # Arguments of the class a `_target_` names: the schema cannot know them.
    cfg = compose_config(
        *tiny("+optimizer.dampening=0.5", "optimizer.nesterov=false", "+model.extra=1")
    )
    config.validate(cfg)
    # ... and the one that reaches a real class is handed to it.
    optimizer = build.optimizer(cfg, nn.Linear(2, 2), Precision("off", torch.device("cpu")))
    assert optimizer.defaults["dampening"] == 0.5


@pytest.mark.e2e
@pytest.mark.parametrize("mode", ["run", "sweep"])
@pytest.mark.slow
def test_an_output_folder_that_cannot_be_made_is_one_line(mode, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    if mode == "run":
        done = run_cli("repro.train", *tiny(), f"hydra.run.dir={blocker}/run")
        key = "hydra.run.dir"
    else:
        done = run_cli("repro.train", "-m", *tiny("seed=0,1"), f"hydra.sweep.dir={blocker}/sweep")
        key = "hydra.sweep.dir"
    assert done.returncode == 2
    assert "Traceback" not in done.stderr + done.stdout
    errors = [line for line in done.stderr.splitlines() if line.strip()]
    assert errors == [
        f"error: cannot write the output folder {blocker}/{mode} (Not a directory): "
        f"set {key} to one you can"
    ]
    assert blocker.read_text() == "not a folder\n"


def test_flushed_losses_are_logged_summed_with_their_terms_and_hashed_on_the_cadence(
    tmp_path, monkeypatch
):
    from repro.core.engine import losses
    from repro.core.watch.metrics import weights_sha256

    model = nn.Linear(2, 1)
    log = FingerprintLog(tmp_path / "fingerprints.csv")
    pending = PendingLosses(log, 4, Context(), False, tmp_path)
    assert pending.flush(Position(step=3), model) == [] and not log.path.exists()
    position = Position(step=4, loss_sum=1.0, loss_count=1, term_sums={"ce": 0.5})
    for total, ce, reg in ((1.5, 1.0, 0.5), (2.5, 2.0, 0.5), (0.25, 0.125, 0.125)):
        terms = {"reg": torch.tensor(reg), "loss": torch.tensor(total), "ce": torch.tensor(ce)}
        pending.append(terms)  # the total need not come first
    assert pending.flush(position, model) == [1.5, 2.5, 0.25]
    assert log.read() == [(2, "1.5", ""), (3, "2.5", ""), (4, "0.25", weights_sha256(model))]
    assert (position.loss_sum, position.loss_count) == (5.25, 4)
    assert position.term_sums == {"ce": 3.625, "reg": 1.125}
    assert pending.pending == [] and pending.flush(position, model) == []
    pending.append({"loss": torch.tensor(1.0)})
    pending.flush(Position(step=5), model)
    assert log.read()[-1] == (5, "1.0", "")  # off the hashing cadence
    # Under torchrun each rank's losses are averaged over the job (unless world-invariant:
    # then they are already the job's); only rank 0 writes.
    summed = []

    def sum_over_ranks(tensor, dist):
        summed.append(dist.world)
        return tensor * 3  # the ranks' sum: 3x this rank's losses

    monkeypatch.setattr(losses.distributed, "sum_tensor", sum_over_ranks)
    cases = ((1, False, 3.0, 1.5, False), (0, False, 3.0, 1.5, True), (0, True, 2.0, 1.0, True))
    for rank, invariant, loss, ce, written in cases:
        pending = PendingLosses(log, 50, Context(rank=rank, world=2), invariant, tmp_path)
        pending.append({"loss": torch.tensor(2.0), "ce": torch.tensor(1.0)})
        position = Position(step=6)
        rows = len(log.read())
        assert pending.flush(position, model) == [loss] and position.term_sums == {"ce": ce}
        assert len(log.read()) == rows + written
    assert summed == [2, 2]


def test_a_non_finite_first_loss_logs_nothing_and_names_its_step_and_the_way_out(tmp_path):
    log = FingerprintLog(tmp_path / "fingerprints.csv")
    pending = PendingLosses(log, 50, Context(), False, tmp_path / "checkpoints")
    pending.append({"loss": torch.tensor(float("nan"))})
    pending.append({"loss": torch.tensor(1.0)})
    with pytest.raises(NonFiniteLossError) as stopped:
        pending.flush(Position(step=8, loss_count=3), nn.Linear(1, 1))
    assert str(stopped.value) == (
        f"loss is nan at step 7; the last good checkpoint is kept in {tmp_path / 'checkpoints'} "
        "(lower optimizer.lr or set trainer.grad_clip)"
    )
    assert not log.path.exists()


@pytest.mark.parametrize(("line_format", "line"), [
    (None, "WARNING repro.export: the file is large\n"),
    ("%(message)s", "the file is large\n"),
])  # fmt: skip
def test_a_commands_warnings_reach_stderr_in_its_format_and_its_info_does_not(
    line_format, line, monkeypatch, capsys
):
    import logging

    from repro.core.errors import warnings_to_stderr

    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", [])  # as in a fresh process: nothing set up yet
    monkeypatch.setattr(root, "level", logging.NOTSET)
    warnings_to_stderr(*([line_format] if line_format else []))
    logging.getLogger("repro.export").info("steps taken")
    logging.getLogger("repro.export").warning("the file is large")
    assert capsys.readouterr().err == line


def _composition_error(cause: Exception, kind: type | None = None) -> Exception:
    from hydra.errors import ConfigCompositionException

    error = (kind or ConfigCompositionException)("Hydra's several lines")
    error.__cause__ = cause
    return error


def _missing_key(node, key: str, full_key: str):
    from omegaconf.errors import ConfigKeyError

    cause = ConfigKeyError(f"Key '{key}' is not in struct")
    cause.parent_node, cause.key, cause.full_key = node, key, full_key
    return cause


def test_only_hydras_error_about_a_key_its_node_lacks_becomes_our_line():
    from omegaconf import OmegaConf

    trainer = OmegaConf.create({"epochs": 3})
    lacking = _missing_key(trainer, "epoch", "trainer.epoch")
    said = composition.unknown_override(_composition_error(lacking))
    assert str(said) == "trainer.epoch: not a key of trainer; did you mean trainer.epochs?"
    assert composition.unknown_override(_composition_error(lacking, ValueError)) is None
    assert composition.unknown_override(_composition_error(ValueError("other"))) is None
    present = _missing_key(trainer, "epochs", "trainer.epochs")
    assert composition.unknown_override(_composition_error(present)) is None
    in_a_list = _missing_key(OmegaConf.create([1, 2]), "x", "widths.x")
    assert composition.unknown_override(_composition_error(in_a_list)) is None
    no_key = _missing_key(trainer, None, "trainer")
    assert composition.unknown_override(_composition_error(no_key)) is None
