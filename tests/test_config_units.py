"""config.py in this process: each check `validate` makes past the schema's types, with the
line it refuses a value in, word for word, and the value beside it that passes."""

from __future__ import annotations

import copy
import functools

import pytest
from omegaconf import OmegaConf, open_dict

from repro.core import config, schema
from repro.core.errors import ConfigError

from conftest import compose_config

ROOT = "data.root=/data"


@functools.cache
def composed(overrides: tuple[str, ...]):
    return compose_config(ROOT, *overrides)


def refusal(*overrides: str, **values) -> ConfigError | None:
    """What validate refuses in the default config with `overrides` (as on the command line)
    and `values` (set past the schema's types: `trainer__batch_size` is trainer.batch_size)."""
    cfg = copy.deepcopy(composed(overrides))  # composed once: Hydra takes a second to do it
    with open_dict(cfg):
        for key, value in values.items():
            OmegaConf.update(cfg, key.replace("__", "."), value, force_add=True, merge=False)
    try:
        config.validate(cfg)
    except ConfigError as error:
        return error
    return None


def refused(*overrides: str, **values) -> str:
    error = refusal(*overrides, **values)
    assert error is not None, f"{overrides} {values} passed"
    return str(error)


def test_the_default_config_passes():
    assert refusal() is None


@pytest.mark.parametrize(
    ("values", "said"),
    [
        (
            {"trainer__epoch": 3},
            "trainer.epoch=3 is not allowed: not a known key; did you mean trainer.epochs?",
        ),
        ({"seeds": 1}, "seeds=1 is not allowed: not a known key; did you mean seed?"),
        (
            {"trainer__tta_views": 2},
            "trainer.tta_views=2 is not allowed: not a known key; did you mean trainer.tta?",
        ),
    ],
)
def test_an_unknown_key_is_refused_naming_the_closest_known_one(values, said):
    assert refused(**values) == said


def test_keys_of_a_node_naming_its_class_or_typed_any_are_that_classs_arguments():
    assert refusal(optimizer__any_argument=1) is None  # typed Any
    assert refusal(scheduler__whatever=2) is None
    assert refusal("+components=ema", components__ema__decay=0.9) is None


def test_what_is_said_of_an_unknown_key_without_any_known_one():
    assert config.did_you_mean("x", []) == "there are no keys here yet"
    assert config.did_you_mean("epoc", ["epochs", "seed"], "trainer.") == (
        "did you mean trainer.epochs?"
    )
    assert config.did_you_mean("zzz", ["epochs"]) == "did you mean epochs?"


def test_a_nested_dict_flattens_to_dotted_keys():
    nested = {"trainer": {"epochs": 6, "opt": {"lr": 0.1}}, "seed": 3, "empty": {}}
    assert schema.flatten(nested) == {"trainer.epochs": 6, "trainer.opt.lr": 0.1, "seed": 3}
    assert schema.flatten({"a": 1}, "x.") == {"x.a": 1}


def test_preset_exact_refuses_an_override_that_voids_it_naming_every_one():
    assert refusal("preset=exact") is None
    assert refused("preset=exact", "amp=bf16", "trainer.compile=true") == (
        "amp.mode='bf16' is not allowed: preset=exact needs amp.mode=off, trainer.compile=False; "
        "drop the override or the preset"
    )
    assert refusal("amp=bf16", "trainer.compile=true") is None  # without the preset


def test_a_choice_outside_its_list_names_the_list():
    assert refused(trainer__tta="mirror") == (
        "trainer.tta='mirror' is not allowed: choose one of none, flip, flip_translate"
    )
    assert refused(augment__flip="both") == (
        "augment.flip='both' is not allowed: choose one of random, alternate"
    )
    assert refusal(augment__flip="alternate") is None


def test_a_number_under_its_minimum_a_flag_or_a_word_is_refused_with_the_minimum():
    assert refused(trainer__epochs=0) == "trainer.epochs=0 is not allowed: must be a number >= 1"
    said = "optimizer.lr={!r} is not allowed: must be a number >= 0"  # a node of any type
    for value in (-0.1, True, "0.1"):
        assert refused(optimizer__lr=value) == said.format(value)
    assert refused(trainer__grad_clip=-0.5) == (
        "trainer.grad_clip=-0.5 is not allowed: must be a number >= 0"
    )
    assert refusal(trainer__grad_clip=None) is None and refusal(trainer__epochs=1) is None


def test_a_value_outside_its_interval_names_the_interval_and_whether_null_is_allowed():
    assert refused(scheduler__warmup=1.0) == (
        "scheduler.warmup=1.0 is not allowed: null or in [0, 1)"
    )
    assert refused(objective__label_smoothing=None) == (
        "objective.label_smoothing=None is not allowed: in [0, 1)"
    )
    assert refused(data__fraction=0) == "data.fraction=0.0 is not allowed: in (0, 1]"
    assert refusal(scheduler__warmup=None) is None and refusal(data__fraction=1) is None


def test_interval_ends_follow_their_brackets_and_only_numbers_lie_inside():
    assert config.inside(0, "[0, 1)") and not config.inside(1, "[0, 1)")
    assert config.inside(1, "(0, 1]") and not config.inside(0, "(0, 1]")
    assert config.inside(0.5, "(0, 1)") and config.inside(2, "[2, 2]")
    assert not config.inside(True, "[0, 1]") and not config.inside(None, "[0, 1]")


@pytest.mark.parametrize("group", ["callbacks", "components", "metrics"])
def test_a_plugged_in_entry_must_name_its_class(group):
    assert refused(**{f"{group}__mine": 5}) == (
        f"{group}.mine=5 is not allowed: a class given by _target_ (and its arguments)"
    )
    assert refusal(**{f"{group}__mine": None}) is None  # switched off
    config._check_plugged_in(group, None)


def test_an_objectives_key_must_be_an_argument_of_its_class():
    assert refused(objective__gama=3) == (
        "objective.gama=3 is not allowed: not an argument of repro.core.tasks.objectives.CrossEntropy, "
        "which takes label_smoothing"
    )
    assert refusal(objective___partial_=True) is None  # Hydra's own keys
    cfg = OmegaConf.create({"_target_": "builtins.dict", "x": 1})
    config._check_arguments("objective", cfg)  # **kwargs: any key
    cfg = OmegaConf.create({"_target_": "no.such.Class", "x": 1})
    config._check_arguments("objective", cfg)  # left to its build, which says why
    config._check_arguments("objective", OmegaConf.create({"_target_": 3, "x": 1}))
    config._check_arguments("objective", None)
    nothing = OmegaConf.create({"_target_": "os.getcwd", "x": 1})
    with pytest.raises(ConfigError) as refused_here:
        config._check_arguments("objective", nothing)
    assert str(refused_here.value) == (
        "objective.x=1 is not allowed: not an argument of os.getcwd, which takes no arguments"
    )


def test_a_fixed_seed_needs_a_value_and_none_may_be_negative():
    assert refused("seed.value=null") == (
        "seed.value=None is not allowed: an integer >= 0 with seed=fixed (or use seed=random)"
    )
    assert refused("seed.value=-1") == "seed.value=-1 is not allowed: an integer >= 0"
    assert refusal("seed=random", "seed.value=null") is None
    assert refusal("seed.value=0") is None


def test_the_monitor_is_an_evaluation_column_and_an_average_needs_its_component():
    assert refused("trainer.monitor=train_loss") == (
        "trainer.monitor='train_loss' is not allowed: auto (the objective's: val_acc, or "
        "val_map for multi-label) or an evaluation column: val_acc, val_loss, val_<a term or "
        "a metric>, ema_val_..."
    )
    assert refused("trainer.monitor=ema_val_acc") == (
        "trainer.monitor='ema_val_acc' is not allowed: needs a weight average: +components=ema"
    )
    assert refused("trainer.test_weights=ema") == (
        "trainer.test_weights='ema' is not allowed: needs a weight average: +components=ema"
    )
    ema = "+components=ema"
    assert refusal(ema, "trainer.monitor=ema_val_acc", "trainer.test_weights=ema") is None
    assert refusal("trainer.monitor=val_loss") is None


@pytest.mark.parametrize("window", [[3, 2], [0, 1], [1], [1, 2, 3]])
def test_a_profiled_window_is_two_steps_in_order_from_one(window):
    assert refused(trainer__profile_steps=window) == (
        f"trainer.profile_steps={window!r} is not allowed: null or [first, last], steps with "
        "1 <= first <= last"
    )


def test_a_profiled_window_of_one_step_or_more_passes():
    assert refusal(trainer__profile_steps=[1, 1]) is None
    assert refusal(trainer__profile_steps=[2, 5]) is None


def test_accumulation_divides_the_batch():
    assert refused("trainer.batch_size=64", "trainer.accumulate_steps=3") == (
        "trainer.accumulate_steps=3 is not allowed: a divisor of trainer.batch_size (64)"
    )
    assert refusal("trainer.batch_size=64", "trainer.accumulate_steps=4") is None


INVARIANT = ("trainer.world_invariant=true", "trainer.global_batch=true", "trainer.micro_batch=16")


def test_a_world_invariant_run_needs_its_settings_each_named_with_why():
    assert refusal(*INVARIANT) is None
    cases = {
        "trainer.global_batch=false": "trainer.global_batch=False is not allowed: true: the "
        "batch is the total with trainer.world_invariant=true",
        "trainer.accumulate_steps=2": "trainer.accumulate_steps=2 is not allowed: 1: "
        "micro_batch does that with trainer.world_invariant=true",
        "trainer.sync_batchnorm=true": "trainer.sync_batchnorm=True is not allowed: false: "
        "statistics are combined in micro-batch order instead with trainer.world_invariant=true",
        "trainer.micro_batch=null": "trainer.micro_batch=None is not allowed: a divisor of "
        "trainer.batch_size (128) with world_invariant",
        "trainer.micro_batch=48": "trainer.micro_batch=48 is not allowed: a divisor of "
        "trainer.batch_size (128) with world_invariant",
        "augment.mixup_alpha=0.2": "augment.mixup_alpha=0.2 is not allowed: 0 with "
        "trainer.world_invariant=true (mixing is keyed per rank, not per micro-batch)",
    }
    for override, said in cases.items():
        assert refused(*INVARIANT, "trainer.batch_size=128", override) == said
    cutmix = refusal(*INVARIANT, "augment.cutmix_alpha=0.5")
    assert cutmix is not None and cutmix.key == "augment.mixup_alpha"
    assert refusal("augment.mixup_alpha=0.2", "augment.cutmix_alpha=0.5") is None


def test_reflected_padding_stays_under_the_shorter_side_of_the_images_cropped():
    reflect = "augment.crop_padding_mode=reflect"
    assert refused(reflect, "data.crop_padding=32") == (
        "data.crop_padding=32 is not allowed: below the images' shorter side (32) with reflect "
        "padding"
    )
    assert refused(reflect, "data.resize=40", "data.crop_padding=40").endswith(
        "below the images' shorter side (40) with reflect padding"
    )
    assert refusal(reflect, "data.resize=40", "data.crop_padding=39") is None
    assert refusal(reflect, "data.crop_padding=31") is None
    assert refusal("data.crop_padding=32") is None  # zeros: any padding


def test_cutout_fits_the_image():
    assert refused("augment.cutout=33") == (
        "augment.cutout=33 is not allowed: 0 (off) or a side of at most data.image_size (32)"
    )
    assert refusal("augment.cutout=32") is None


@pytest.mark.parametrize(
    "values",
    [
        {"data__std": [0.2, 0.2]},
        {"data__mean": [0.5, 0.5, 0.5, 0.5]},
        {"data__std": [0.2, 0.0, 0.2]},
        {"data__std": [0.2, -0.1, 0.2]},
    ],
)
def test_the_normalisation_is_three_means_and_three_positive_deviations(values):
    std = values.get("data__std", list(compose_config(ROOT).data.std))
    assert refused(**values) == (
        f"data.std={std!r} is not allowed: three positive numbers (and three means)"
    )


def test_a_resize_is_at_least_the_image_size_and_an_option_needing_a_root_has_one():
    assert refused("data.resize=31") == (
        "data.resize=31 is not allowed: null or >= data.image_size (32)"
    )
    assert refusal("data.resize=32") is None
    cfg = compose_config(ROOT)
    cfg.data.root = "???"
    with pytest.raises(ConfigError) as refused_here:
        config.validate(cfg)
    assert str(refused_here.value) == (
        "data.root='???' is not allowed: a value: the data option must set it"
    )
