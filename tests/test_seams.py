"""The objective and callback seams: what a user's code gets, and what it is told when wrong.
(The README's examples run end to end in tests/test_make_it_yours.py.)"""

from __future__ import annotations

import pytest
import torch
from omegaconf import OmegaConf

from repro.core import build
from repro.core.engine.evaluation import Predictions
from repro.core.errors import CheckpointError, ConfigError
from repro.core.runs import resume, trust
from repro.core.tasks.objectives import Checked, CrossEntropy, Targets, batch_means, batch_sums
from repro.core.tasks.objectives import checked as objectives_checked
from repro.core.watch import callbacks

from conftest import StepCounter, compose_config, tiny


def test_cross_entropy_is_per_image_and_blends_mixed_targets():
    logits, labels, partners = (
        torch.randn(6, 4),
        torch.tensor([0, 1, 2, 3, 0, 1]),
        torch.arange(6) % 4,
    )
    plain = CrossEntropy()(logits, Targets(labels))["loss"]
    assert plain.shape == (6,)
    assert torch.equal(plain, torch.nn.functional.cross_entropy(logits, labels, reduction="none"))
    mixed = CrossEntropy()(logits, Targets(labels, partners, 0.3))["loss"]
    other = torch.nn.functional.cross_entropy(logits, partners, reduction="none")
    assert torch.allclose(mixed, 0.3 * plain + 0.7 * other)
    chunks = Targets(labels, partners, 0.3).chunk(2)
    assert [len(c.labels) for c in chunks] == [3, 3] and chunks[1].weight == 0.3
    assert torch.equal(chunks[1].partners, partners[3:])


def SEEN(images: int) -> tuple[torch.Tensor, torch.nn.Module]:  # noqa: N802
    """The images and the model an objective's logits came from, for a call by hand."""
    return torch.zeros(images, 3, 2, 2), torch.nn.Flatten()


@pytest.mark.parametrize(
    ("returned", "complaint"),
    [
        (lambda n: torch.zeros(n), "must return a dict"),
        (lambda n: {"total": torch.zeros(n)}, 'holding "loss"'),
        (lambda n: {"loss": torch.zeros(n), "acc": torch.zeros(n)}, "returned the term 'acc'"),
        (lambda n: {"loss": torch.zeros(n, 2)}, r"as \(4, 2\)"),
        (lambda n: {"loss": torch.zeros(n), "penalty": 1.0}, "as float"),
    ],
)
def test_an_objective_that_returns_the_wrong_thing_is_one_line_at_its_first_call(
    returned, complaint
):
    checked = Checked(lambda logits, targets: returned(len(logits)), "mine.Objective")
    with pytest.raises(ConfigError, match=complaint) as caught:
        checked(torch.zeros(4, 3), Targets(torch.zeros(4, dtype=torch.long)), *SEEN(4))
    assert caught.value.key == "objective._target_"


def test_batch_level_terms_are_allowed_and_averaged_per_image_terms():
    terms = {"loss": torch.tensor([1.0, 3.0]), "batch_term": torch.tensor(5.0)}
    Checked(lambda logits, targets: terms, "t")(
        torch.zeros(2, 2), Targets(torch.zeros(2)), *SEEN(2)
    )
    assert {k: v.item() for k, v in batch_means(terms).items()} == {"loss": 2.0, "batch_term": 5.0}


def test_an_objective_that_cannot_be_built_is_one_line():
    cfg = compose_config(*tiny("objective._target_=no.such.Objective"))
    with pytest.raises(ConfigError, match="could not build it"):
        build.objective(cfg)


def test_a_checkpoint_from_before_the_objective_group_resumes_with_its_smoothing():
    cfg = compose_config(*tiny("objective.label_smoothing=0.1"))
    saved = OmegaConf.to_container(cfg, resolve=True)
    del saved["objective"]
    saved["trainer"]["label_smoothing"] = 0.1  # where the old layout kept it
    resume.check_compatible({"config": saved, "resolved": {}}, cfg, {})
    assert resume.upgrade(saved)["objective"]["_target_"] == resume.DEFAULT_OBJECTIVE
    assert "label_smoothing" in saved["trainer"]  # the record itself is left as it was
    cfg.objective.label_smoothing = 0.2
    with pytest.raises(CheckpointError, match=r"objective\.label_smoothing: 0\.1 -> 0\.2"):
        resume.check_compatible({"config": saved, "resolved": {}}, cfg, {})


def test_a_checkpoint_from_before_data_builders_resumes_on_the_same_builder():
    cfg = compose_config(*tiny())
    saved = OmegaConf.to_container(cfg, resolve=True)
    saved["data"]["name"] = "synthetic"  # the old layout named the dataset
    del saved["data"]["_target_"]
    resume.check_compatible({"config": saved, "resolved": {}}, cfg, {})
    assert resume.upgrade(saved)["data"]["_target_"] == cfg.data._target_


def test_an_old_layouts_dataset_name_cannot_smuggle_in_a_target():
    stored = {
        "data": {"name": "Path.touch"},
        "model": {"_target_": "repro.extras.models.small_cnn.SmallCNN"},
    }
    with pytest.raises(
        trust.UntrustedConfigError, match=r"repro\.core\.data\.datasets\.Path\.touch"
    ):
        trust.check(resume.upgrade(stored), "ckpt")  # as restore and verify check it


def test_a_data_builder_that_returns_something_else_is_one_line():
    cfg = compose_config(*tiny("data._target_=operator.is_"))  # takes two arguments
    with pytest.raises(ConfigError, match="returned bool; use a builder that returns") as caught:
        build.splits(cfg, 0)
    assert caught.value.key == "data._target_"
    cfg = compose_config(*tiny("data._target_=no_such_module.builder"))
    with pytest.raises(ConfigError, match="cannot import it"):
        build.splits(cfg, 0)
    cfg = compose_config(*tiny("data._target_=operator.not_"))  # takes one argument
    with pytest.raises(ConfigError, match=r"takes \(data config, seed\)"):
        build.splits(cfg, 0)


class _Watcher:
    """A callback with no state and another hook."""

    def __init__(self) -> None:
        self.ends = []

    def at_end(self, loop, summary) -> None:
        self.ends.append(summary["step"])


def test_callbacks_are_dispatched_by_method_and_their_state_round_trips(caplog):
    counter, watcher = StepCounter(), _Watcher()
    hooks = callbacks.Callbacks({"count": counter, "watch": watcher})
    for _ in range(3):
        hooks.after_step(None)
    hooks.at_checkpoint(None)  # neither has it: nothing happens
    hooks.at_end(None, {"step": 3})
    assert counter.steps == 3 and watcher.ends == [3]
    state = hooks.state_dict()
    assert state == {"count": {"steps": 3}}  # only callbacks with state are saved
    fresh = callbacks.Callbacks({"count": StepCounter()})
    fresh.load_state_dict(state)
    assert fresh.named["count"].steps == 3
    with caplog.at_level("INFO"):
        callbacks.Callbacks({"other": StepCounter()}).load_state_dict(state)
    said = [r.getMessage() for r in caplog.records if r.name == "repro.core.watch.callbacks"]
    assert said == ["callbacks.other: no state in the checkpoint; it starts afresh"]
    after_a_stateless_one = callbacks.Callbacks({"watch": _Watcher(), "count": StepCounter()})
    after_a_stateless_one.load_state_dict(state)
    assert after_a_stateless_one.named["count"].steps == 3


@pytest.mark.parametrize(
    ("nodes", "key"),
    [
        ({"bad": "just a string"}, "callbacks.bad"),
        ({"bad": {"_target_": "no.such.Callback"}}, "callbacks.bad._target_"),
    ],
)
def test_a_callback_that_cannot_be_built_is_one_line_naming_it(nodes, key):
    with pytest.raises(ConfigError) as caught:
        callbacks.build(OmegaConf.create(nodes))
    assert caught.value.key == key
    assert callbacks.build(OmegaConf.create({"off": None})).named == {}  # null turns one off


class HookOnly:
    """A would-be component that the loop calls but whose state a resume could not restore."""

    def __init__(self, model, total_steps) -> None:
        self.steps = 0

    def after_step(self, loop) -> None:
        self.steps += 1


class StateOnly:
    """A component that keeps its state and is never called by the loop: a part another part
    (the objective) uses."""

    def __init__(self, model, total_steps) -> None:
        self.steps = total_steps

    def state_dict(self) -> dict:
        return {"steps": self.steps}

    def load_state_dict(self, state: dict) -> None:
        self.steps = state["steps"]


def test_a_callback_or_component_the_loop_would_never_call_is_refused_naming_its_target():
    with pytest.raises(ConfigError) as caught:
        callbacks.build(OmegaConf.create({"x": {"_target_": "builtins.print"}}))
    assert str(caught.value) == (
        "callbacks.x._target_='builtins.print' is not allowed: a class with a callback method "
        "(at_start, before_step, after_step, extra_metrics, after_evaluation, at_checkpoint, "
        "at_end, state_dict, load_state_dict) or __enter__; it built NoneType"
    )
    component = {"x": {"_target_": f"{__name__}.HookOnly"}}  # no state to resume
    with pytest.raises(ConfigError) as caught:
        callbacks.build_components(OmegaConf.create(component), torch.nn.Linear(1, 1), 3)
    assert str(caught.value) == (
        f"components.x._target_='{__name__}.HookOnly' is not allowed: a class with state_dict "
        "and load_state_dict (a resume needs its state); it built HookOnly"
    )
    # A component with its state and no hook is a part something else uses (a teacher).
    component = {"x": {"_target_": f"{__name__}.StateOnly"}}
    assert callbacks.build_components(OmegaConf.create(component), torch.nn.Linear(1, 1), 3)
    # What the README's callback has (a hook and its state) is enough.
    assert callbacks.build(OmegaConf.create({"w": {"_target_": f"{__name__}._Watcher"}})).get("w")


def test_a_stored_configs_callbacks_are_never_built_so_never_refused():
    stored = {"model": {"_target_": "repro.extras.models.small_cnn.SmallCNN"},
              "callbacks": {"mine": {"_target_": "pathlib.Path.touch"}}}  # fmt: skip
    trust.check(stored, "ckpt")  # no error: evaluate, predict and verify drop them
    assert "callbacks" not in trust.watched_only(stored)


def test_the_confusion_matrix_counts_true_against_predicted():
    kept = Predictions([torch.tensor([0, 1, 1]), torch.tensor([2])], [torch.tensor([0, 0, 1]),
                       torch.tensor([2])])  # fmt: skip
    assert kept.confusion(3).tolist() == [[1, 0, 0], [1, 1, 0], [0, 0, 1]]
    assert Predictions().confusion(2).tolist() == [[0, 0], [0, 0]]


# ---- a data option's own settings: its builder's keyword arguments -------------------------


def labelled_shapes(cfg, seed: int, *, labels_file: str, offset: int = 0, note: str | None = None):
    """The synthetic shapes, with settings of its own: it records what it was given."""
    from repro.core.data import datasets

    labelled_shapes.given = {"labels_file": labels_file, "offset": offset, "note": note}
    return datasets.synthetic(cfg, seed)


OWN = tiny(f"data._target_={__name__}.labelled_shapes", "+data.labels_file=labels.csv")


def test_a_data_options_own_settings_reach_its_builder_typed_and_are_recorded(tmp_path):
    from conftest import train_in_process

    summary = train_in_process(tmp_path, *OWN, "+data.offset=3")
    assert labelled_shapes.given == {"labels_file": "labels.csv", "offset": 3, "note": None}
    assert summary["completed"]
    recorded = OmegaConf.load(tmp_path / "resolved_config.yaml")
    assert recorded.data.labels_file == "labels.csv" and recorded.data.offset == 3


@pytest.mark.parametrize(
    ("overrides", "key", "said"),
    [
        (["+data.labels_fil=x.csv"], "data.labels_fil", "did you mean data.labels_file?"),
        (
            ["+data.offset=1.5"],
            "data.offset",
            "a value of type int, as test_seams.labelled_shapes declares",
        ),
        (["+data.offset=true"], "data.offset", "a value of type int"),
        (["~data.labels_file"], "data.labels_file", "test_seams.labelled_shapes requires it"),
        (["data.val_size=many"], "data.val_size", "a value of type int"),
    ],
)
def test_a_data_setting_that_its_builder_does_not_take_is_one_line_before_any_work(
    overrides, key, said
):
    from repro.core import config

    cfg = compose_config(*OWN, *overrides)
    with pytest.raises(ConfigError) as caught:
        config.validate(cfg)
    assert caught.value.key == key and said in str(caught.value)


def test_a_builder_without_settings_refuses_any_and_the_schemas_keys_stay_typed():
    from repro.core import config

    cfg = compose_config(*tiny("+data.vla_size=3"))  # the synthetic builder takes none
    with pytest.raises(ConfigError, match=r"its own: none\); did you mean data\.val_size\?"):
        config.validate(cfg)
    cfg = compose_config(*tiny("data.image_size='32'"))
    config.validate(cfg)
    assert cfg.data.image_size == 32  # typed as the schema declares it


# ---- an objective that takes a Batch: images, model, components ----------------------------


class _Recording:
    """An objective that takes a Batch and keeps each one it gets."""

    def __init__(self) -> None:
        self.seen = []

    def __call__(self, logits, targets, batch):
        self.seen.append(batch)
        return {"loss": torch.nn.functional.cross_entropy(logits, targets.labels, reduction="none")}


def _linear() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(12, 3))


IMAGES, LABELS = torch.randn(8, 3, 2, 2), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])


def test_each_micro_batch_reaches_the_objective_with_the_model_and_the_components():
    from repro.core.engine.settings import LoopSettings
    from repro.core.engine.step import OptimizerStep
    from repro.core.runtime.memory_format import MemoryFormat
    from repro.core.runtime.precision import Precision

    model, recording, teacher = _linear(), _Recording(), object()
    objective = Checked(recording, "mine.Recording")
    objective.components = {"teacher": teacher}
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    OptimizerStep(
        model=model, forward_model=model, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        precision=Precision("off", torch.device("cpu")), memory_format=MemoryFormat("contiguous"),
        settings=LoopSettings(accumulate_steps=2), objective=objective,
    )(IMAGES, LABELS, epoch=0, batch=0)  # fmt: skip
    assert len(recording.seen) == 2
    for batch, images in zip(recording.seen, IMAGES.chunk(2), strict=True):
        assert torch.equal(batch.images, images) and batch.model is model and batch.training
        assert batch.component("teacher") is teacher
    with pytest.raises(ConfigError, match=r"add \+components\.other\._target_="):
        recording.seen[0].component("other")


def test_the_world_invariant_step_hands_over_each_micro_batch_too():
    from repro.core.engine.invariant import InvariantStep
    from repro.core.engine.settings import LoopSettings
    from repro.core.runtime.distributed import Context
    from repro.core.runtime.memory_format import MemoryFormat
    from repro.core.runtime.precision import Precision

    model, recording = _linear(), _Recording()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    InvariantStep(
        model, optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _: 1.0),
        Precision("off", torch.device("cpu")), MemoryFormat("contiguous"), LoopSettings(),
        recording, micro_batch=2, root_seed=0, dist=Context(),
    )(IMAGES, LABELS, epoch=0, batch=0)  # fmt: skip
    assert [len(batch.images) for batch in recording.seen] == [2, 2, 2, 2]
    assert torch.equal(torch.cat([batch.images for batch in recording.seen]), IMAGES)
    assert all(batch.model is model and batch.components == {} for batch in recording.seen)


def test_evaluation_hands_over_the_images_before_flipping_and_the_evaluated_model():
    import contextlib

    from repro.core.engine.evaluation import evaluate

    model, recording = _linear(), _Recording()
    result = evaluate(
        model, [(IMAGES, LABELS)], lambda x, y: (x, y), lambda x: x, contextlib.nullcontext,
        tta="flip", objective=recording,
    )  # fmt: skip
    (batch,) = recording.seen
    assert torch.equal(batch.images, IMAGES) and batch.model is model and not batch.training
    assert result["loss"] > 0 and model.training  # the model's mode is given back


def test_an_objective_takes_a_batch_only_if_its_call_has_a_third_argument():
    assert not Checked(CrossEntropy(), "ce").takes_batch
    assert not Checked(lambda logits, targets: {}, "two").takes_batch
    assert Checked(_Recording(), "three").takes_batch
    assert Checked(lambda *arguments: {}, "any").takes_batch


class NeedsTeacher(CrossEntropy):
    """Cross-entropy that checks, at every call, that the run's teacher reached it."""

    def __call__(self, logits, targets, batch):
        assert batch.component("teacher").model is not batch.model
        return super().__call__(logits, targets)


class StillTeacher:
    """A component that holds a frozen copy of the model and has no state to speak of."""

    def __init__(self, model, total_steps: int) -> None:
        import copy

        self.model = copy.deepcopy(model).requires_grad_(False)

    def at_start(self, loop) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_the_runs_components_reach_an_objective_in_training_evaluation_and_the_test(tmp_path):
    from conftest import train_in_process

    summary = train_in_process(
        tmp_path, *tiny(f"objective._target_={__name__}.NeedsTeacher",
                        f"+components.teacher._target_={__name__}.StillTeacher"),
    )  # fmt: skip
    assert summary["completed"] and "test_loss" in summary


labelled_shapes.may_change = ("note",)  # says how to read, not what: a resume may change it


def test_a_resume_takes_other_values_only_for_the_settings_its_builder_says_may_change():
    cfg = compose_config(*OWN, "+data.note=first")
    saved = OmegaConf.to_container(cfg, resolve=True)
    moved = compose_config(*OWN, "+data.note=second")
    resume.check_compatible({"config": saved, "resolved": {}}, moved, {})
    other = compose_config(*OWN, "data.labels_file=other.csv", "+data.note=first")
    with pytest.raises(CheckpointError, match=r"data\.labels_file: 'labels\.csv' -> 'other\.csv'"):
        resume.check_compatible({"config": saved, "resolved": {}}, other, {})


# ---- the objective's unit: exact values and exact refusals ---------------------------------


def test_a_callable_without_a_signature_is_called_with_two_arguments():
    assert not Checked(iter, "iter").takes_batch  # a builtin inspect cannot read


def test_batch_sums_count_a_batch_value_once_per_image_and_sum_per_image_values():
    sums = batch_sums({"per_image": torch.tensor([1.0, 2.5]), "batch": torch.tensor(2.0)}, 3)
    assert {name: value.item() for name, value in sums.items()} == {"per_image": 3.5, "batch": 6.0}
    assert all(value.dtype == torch.float64 for value in sums.values())


@pytest.mark.parametrize(
    ("returned", "allowed"),
    [
        (lambda n: torch.zeros(n), 'must return a dict of tensors holding "loss"'),
        (lambda n: {"loss": torch.zeros(n), "two words": torch.zeros(n)},
         "returned the term 'two words'; use term names that are identifiers other than acc, "
         "confusion, map"),
        (lambda n: {"loss": torch.zeros(n), "acc": torch.zeros(n)},
         "returned the term 'acc'; use term names that are identifiers other than acc, "
         "confusion, map"),
        (lambda n: {"loss": torch.zeros(n, 2)},
         "returned 'loss' as (4, 2); use a tensor of shape (4,) (per image) or () (per batch)"),
    ],
)  # fmt: skip
def test_a_wrong_result_is_refused_naming_the_objective_and_what_is_allowed(returned, allowed):
    checked = Checked(lambda logits, targets: returned(len(logits)), "mine.Objective")
    with pytest.raises(ConfigError) as caught:
        checked(torch.zeros(4, 3), Targets(torch.zeros(4, dtype=torch.long)), *SEEN(4))
    error = caught.value
    assert (error.key, error.value, error.allowed) == (
        "objective._target_",
        "mine.Objective",
        allowed,
    )


def test_only_the_first_result_is_checked(monkeypatch):
    from repro.core.tasks import objectives

    calls = []
    monkeypatch.setattr(objectives, "check_terms", lambda *arguments: calls.append(arguments))
    checked = Checked(CrossEntropy(), "ce")
    for _ in range(3):
        checked(torch.zeros(4, 3), Targets(torch.zeros(4, dtype=torch.long)), *SEEN(4))
    assert len(calls) == 1 and calls[0][1:] == (4, "ce")  # no check costs the steps after it


def test_an_objective_given_by_hand_is_named_by_its_function_or_its_class():
    def my_loss(logits, targets):
        return {}

    assert objectives_checked(my_loss).target.endswith("my_loss")
    assert objectives_checked(CrossEntropy()).target == "CrossEntropy"
    already = Checked(CrossEntropy(), "built.by.the.template")
    assert objectives_checked(already) is already


def test_label_smoothing_reaches_the_cross_entropy():
    logits, labels = torch.randn(5, 4), torch.tensor([0, 1, 2, 3, 0])
    smoothed = CrossEntropy(0.1)(logits, Targets(labels))["loss"]
    expected = torch.nn.functional.cross_entropy(
        logits, labels, label_smoothing=0.1, reduction="none"
    )
    assert torch.equal(smoothed, expected)
    assert not torch.allclose(smoothed, CrossEntropy()(logits, Targets(labels))["loss"])


def test_a_missing_component_is_refused_under_its_key():
    from repro.core.tasks.objectives import Batch

    batch = Batch(torch.zeros(1), torch.nn.Identity(), {}, True)
    with pytest.raises(ConfigError) as caught:
        batch.component("teacher")
    assert caught.value.key == "components.teacher"


class _Everything:
    """A callback with every hook, recording each call under its own name."""

    def __init__(self, name, calls) -> None:
        self.name, self.calls = name, calls

    def __enter__(self):
        self.calls.append((self.name, "enter"))
        return self

    def __exit__(self, kind, error, trace):
        self.calls.append((self.name, "exit", type(error).__name__ if error else None))

    def at_start(self, loop):
        self.calls.append((self.name, "at_start", loop))

    def before_step(self, loop):
        self.calls.append((self.name, "before_step", loop))

    def after_step(self, loop):
        self.calls.append((self.name, "after_step", loop))

    def extra_metrics(self, loop):
        self.calls.append((self.name, "extra_metrics", loop))
        return {f"{self.name}_x": 1.0, "shared": self.name}

    def after_evaluation(self, loop, row, predictions):
        self.calls.append((self.name, "after_evaluation", loop, row, predictions))

    def at_checkpoint(self, loop):
        self.calls.append((self.name, "at_checkpoint", loop))

    def at_end(self, loop, summary):
        self.calls.append((self.name, "at_end", loop, summary))

    def state_dict(self):
        return {"name": self.name}

    def load_state_dict(self, state):
        if state == "bad":
            raise KeyError("missing 'shadow'")
        self.calls.append((self.name, "loaded", state))


def test_every_hook_reaches_components_first_then_callbacks_in_order():
    calls = []
    hooks = callbacks.Callbacks(
        {"b": _Everything("b", calls), "c": _Everything("c", calls)},
        {"a": _Everything("a", calls)},
    )
    with hooks.running("L"):
        hooks.before_step("L")
        hooks.after_step("L")
        assert hooks.extra_metrics("L") == {"a_x": 1.0, "b_x": 1.0, "c_x": 1.0, "shared": "c"}
        hooks.after_evaluation("L", {"val_acc": 0.5}, "P")
        hooks.at_checkpoint("L")
        hooks.at_end("L", {"step": 3})
    order = [call[:2] for call in calls]
    for hook in ("enter", "at_start", "before_step", "after_step", "extra_metrics",
                 "after_evaluation", "at_checkpoint", "at_end"):  # fmt: skip
        assert [name for name, said in order if said == hook] == ["a", "b", "c"], hook
    assert [name for name, said in order if said == "exit"] == ["c", "b", "a"]  # stack order
    assert ("b", "after_evaluation", "L", {"val_acc": 0.5}, "P") in calls
    for hook in ("before_step", "after_step", "extra_metrics", "at_checkpoint"):
        assert {call[2] for call in calls if call[1] == hook} == {"L"}, hook
    assert ("c", "at_end", "L", {"step": 3}) in calls and ("a", "at_start", "L") in calls
    assert (
        order.index(("a", "enter")) < order.index(("c", "enter")) < order.index(("a", "at_start"))
    )
    calls.clear()
    with pytest.raises(ValueError), hooks.running("L"):
        raise ValueError("the loop failed")
    assert [call for call in calls if call[1] == "exit"] == [("c", "exit", "ValueError"),
        ("b", "exit", "ValueError"), ("a", "exit", "ValueError")]  # fmt: skip
    assert hooks.get("a") is hooks.components["a"] and hooks.get("c") is hooks.named["c"]
    assert hooks.get("z") is None
    assert callbacks.Callbacks().extra_metrics("L") == {}


def test_components_resume_from_their_own_state_or_say_which_is_missing():
    calls = []
    hooks = callbacks.Callbacks(components={"ema": _Everything("ema", calls),
                                            "la": _Everything("la", calls)})  # fmt: skip
    assert hooks.components_state() == {"ema": {"name": "ema"}, "la": {"name": "la"}}
    hooks.load_components({"components": {"ema": 1, "la": 2}, "ema": "old"})
    hooks.load_components({"ema": 3, "la": 4})  # written before components had their entry
    hooks.load_components({"components": {"ema": 5}, "la": 6})
    assert [call[2] for call in calls] == [1, 2, 3, 4, 5, 6]
    with pytest.raises(CheckpointError) as refused:
        hooks.load_components({"components": {"ema": 1}})
    assert str(refused.value) == "the checkpoint holds no components.la state to resume"
    with pytest.raises(CheckpointError) as refused:
        hooks.load_components({"components": {"ema": "bad", "la": 1}})
    assert str(refused.value) == "components.ema: \"missing 'shadow'\""
    assert callbacks.Callbacks({"x": object()}).state_dict() == {}


def test_a_class_that_fails_to_build_is_one_line_with_its_own_error():
    nodes = OmegaConf.create({"a": None, "p": {"_target_": "pathlib.Path", "x": 1},
                              "bad": {"_target_": "json.loads", "s": "{\n\n"}})  # fmt: skip
    with pytest.raises(ConfigError) as refused:
        callbacks.instantiated("callbacks", nodes)
    assert str(refused.value) == (  # the class's own error, not Hydra's wrapper around it
        "callbacks.bad._target_='json.loads' is not allowed: could not build it: Expecting "
        "property name enclosed in double quotes: line 3 column 1 (char 3)"
    )
    with pytest.raises(ConfigError) as refused:
        callbacks.build_components(
            OmegaConf.create({"t": {"_target_": "no.such.Teacher"}}), None, 3
        )
    assert refused.value.key == "components.t._target_"
    with pytest.raises(ConfigError) as refused:
        callbacks.instantiated("components", OmegaConf.create({"n": {"lr": 1}}))
    assert str(refused.value) == (
        "components.n={'lr': 1} is not allowed: a class given by _target_ (and its arguments)"
    )
    built = callbacks.instantiated(
        "x", OmegaConf.create({"a": None, "n": {"_target_": "builtins.dict", "k": 2}}), extra=1
    )
    assert built == {"n": {"k": 2, "extra": 1}}
