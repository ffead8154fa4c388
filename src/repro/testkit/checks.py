"""The kit's checks, as pytest tests: a project's test module imports them (`from
repro.testkit.checks import *`) and the plugin (repro.testkit.plugin) runs each once per
option of the project's conf/ that it concerns, so that an option added there is checked
without a test of its own. Each failure says which option broke which promise, and how.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from repro.data.sources import stack_targets, target_text
from repro.errors import ConfigError
from repro.runs.fingerprint_log import first_divergence
from repro.testkit.project import Project, result_files, steps

__all__ = [
    "test_data_gives_the_same_item_every_time_an_index_is_read",
    "test_data_gives_the_same_split_for_the_same_seed",
    "test_data_trains_the_same_steps_with_0_and_2_workers",
    "test_experiment_composes_and_runs",
    "test_objective_gives_the_same_steps_on_1_and_2_processes",
    "test_objective_returns_per_image_or_batch_terms",
    "test_stateful_part_resumes_bit_for_bit",
    "test_the_default_config_survives_a_kill",
]
SEED = 7
ITEM_RULE = (
    "a dataset must give the same item for the same index on every call and in every process: "
    "no draws from torch's, numpy's or Python's global generators in __getitem__ and no state "
    "that changes with calls (draw once in the builder, or from a generator seeded by the index)"
)


def _item(source: Any, index: int) -> tuple[tuple[int, ...], bytes, str]:
    image, label = source[index]
    image = torch.as_tensor(image)
    return tuple(image.shape), image.contiguous().numpy().tobytes(), target_text(label)


def test_data_gives_the_same_split_for_the_same_seed(repro_project: Project, data_option: str):
    """The split's items, not only its size: a digest of every image and label of each split
    (repro.data.fingerprint, what a run records), built twice from the same seed."""
    from repro import build
    from repro.data.fingerprint import fingerprint

    cfg = repro_project.config(f"data={data_option}")
    first, again = (fingerprint(build.splits(cfg, SEED), cfg.data.get("root"))["splits"]
                    for _ in range(2))  # fmt: skip
    differ = [split for split in first if first[split] != again[split]]
    assert not differ, (
        f"data={data_option}: built twice from seed {SEED}, the {' and '.join(differ)} split(s) "
        "held other items: the builder must make the same split for the same seed"
    )


def test_data_gives_the_same_item_every_time_an_index_is_read(
    repro_project: Project, data_option: str
):
    """Each split's first, middle and last items read twice, straight from the source. A
    training comparison alone can miss a draw in __getitem__: the engine seeds torch's global
    generator per sample (for third-party transforms), in workers and in the main process alike,
    so such a dataset trains the same weights with 0 and 2 workers and still breaks the promise
    (its items change with the engine's seeding, and anywhere else it is read)."""
    from repro import build

    data = build.splits(repro_project.config(f"data={data_option}"), SEED)
    for split in ("train", "val", "test"):
        source = getattr(data, split)
        for index in sorted({0, len(source) // 2, len(source) - 1}):
            first, again = _item(source, index), _item(source, index)
            what = next((name for name, a, b in zip(("shape", "pixels", "label"), first, again,
                                                    strict=True) if a != b), None)  # fmt: skip
            assert what is None, (
                f"data={data_option}: {split} item {index} read twice gave other {what}: "
                f"{ITEM_RULE}"
            )


def test_data_trains_the_same_steps_with_0_and_2_workers(
    repro_project: Project, data_option: str, tmp_path: Path
):
    """A tiny run with 0 and with 2 loader workers: the same loss and weights at every step."""
    runs = {
        workers: tmp_path / f"workers{workers}" for workers in (0, 2)
    }  # fmt: skip
    for workers, run_dir in runs.items():
        repro_project.train(run_dir, f"data={data_option}", f"dataloader.num_workers={workers}")
    parted = first_divergence(steps(runs[0]), steps(runs[2]), ("with 0 workers", "with 2"))
    assert parted is None, (
        f"data={data_option}: 0 and 2 loader workers trained differently, first at {parted}; "
        f"{ITEM_RULE}"
    )


def test_objective_returns_per_image_or_batch_terms(repro_project: Project, objective_option: str):
    """The objective on a real batch (the default data's first 8 training images, through the
    evaluation transform, and the default model's logits): a dict holding "loss", each term one
    value per image or one for the batch (repro.objectives.check_terms, as the loop checks)."""
    from repro import build
    from repro.objectives import Targets

    cfg = repro_project.config(f"objective={objective_option}")
    data = build.splits(cfg, SEED)
    model = build.model(cfg, SEED, len(data.classes))
    norm = build.normalisation(cfg, model)
    _, evaluation = build.pipelines(cfg, data.resized, data.any_size, norm)
    items = [data.train[index] for index in range(min(8, len(data.train)))]
    uint8 = torch.stack([evaluation(torch.as_tensor(image), None) for image, _ in items])
    labels = stack_targets([label for _, label in items])
    # Normalised as the loop's batches are (on the CPU: this check needs no GPU).
    images, labels = build.device_batches(cfg, torch.device("cpu"), norm)(uint8, labels)
    objective = build.objective(cfg)  # checks its first result, in one line naming the term
    try:
        with torch.no_grad():
            terms = objective(model(images), Targets(labels), images, model)
    except ConfigError as error:  # check_terms' one line, with the option it came from
        raise AssertionError(f"objective={objective_option}: {error}") from None
    assert torch.isfinite(terms["loss"]).all(), f"objective={objective_option}: a loss not finite"


def test_objective_gives_the_same_steps_on_1_and_2_processes(
    repro_project: Project, objective_option: str, tmp_path: Path
):
    """`trainer.world_invariant=true` in one process and under torchrun on two (gloo, CPU): the
    same loss and weights at every step. Per-image terms and batch means of them combine across
    processes as across micro-batches; a term that depends on how the batch is cut does not."""
    invariant = (
        f"objective={objective_option}", "trainer.world_invariant=true",
        "trainer.global_batch=true", "trainer.micro_batch=16", "trainer.num_threads=1",
        "dataloader.num_workers=0",
    )  # fmt: skip
    repro_project.train(tmp_path / "one", *invariant)
    repro_project.train_on_processes(tmp_path / "two", 2, *invariant)
    parted = first_divergence(steps(tmp_path / "one"), steps(tmp_path / "two"),
                              ("on 1 process", "on 2"))  # fmt: skip
    assert parted is None, (
        f"objective={objective_option}: 1 and 2 processes trained differently, first at "
        f"{parted}: each term must be per image or a mean over the images it is given, and "
        "nothing in the objective may change from call to call"
    )


def test_stateful_part_resumes_bit_for_bit(
    repro_project: Project, stateful_option: str, tmp_path: Path
):
    """A run with the part added, stopped after step 2 (checkpointed) and resumed, against one
    that went straight through: the same steps, weights and files (the part's own included)."""
    group, _, name = stateful_option.partition("=")
    added = f"+{group}={name}"
    repro_project.train(tmp_path / "straight", added)
    repro_project.train(tmp_path / "stopped", added, "trainer.halt_at_step=2")
    repro_project.train(tmp_path / "stopped", added)
    _same_run(tmp_path / "straight", tmp_path / "stopped", f"{group}={name}", "stopped and resumed")


def test_experiment_composes_and_runs(
    repro_project: Project, experiment_option: str, tmp_path: Path
):
    dropped = repro_project.dropped_choices(experiment_option)
    assert not dropped, (
        f"experiment={experiment_option} is not what runs: it asks for {'; '.join(dropped)}; "
        "something composed after it overrides that (a project's own choices belong in "
        "conf/project/default.yaml, which comes before experiments, not in conf/config.yaml)"
    )
    summary = repro_project.train(tmp_path / "run", f"experiment={experiment_option}")
    assert summary.get("weights_sha256"), f"experiment={experiment_option}: no weights recorded"


def test_the_default_config_survives_a_kill(repro_project: Project, tmp_path: Path):
    """The default config (with the project's callbacks) SIGKILLed after step 3, one step past
    its checkpoint, and run again: it resumes to the weights and files of a straight run."""
    repro_project.train(tmp_path / "straight")
    repro_project.train_killed(tmp_path / "killed", 3)
    repro_project.train(tmp_path / "killed")  # the same folder: resumes from step 2
    _same_run(tmp_path / "straight", tmp_path / "killed", "the default config", "killed and rerun")


def _same_run(straight: Path, other: Path, what: str, how: str) -> None:
    parted = first_divergence(steps(straight), steps(other), ("straight", how))
    assert parted is None, f"{what}: {how}, it trained differently, first at {parted}"
    files = result_files(straight), result_files(other)
    differ = sorted(set(files[0]) ^ set(files[1]) | {
        rel for rel in set(files[0]) & set(files[1]) if files[0][rel] != files[1][rel]
    })  # fmt: skip
    assert not differ, (
        f"{what}: {how}, it wrote other files than a straight run: {', '.join(differ)} (a "
        "callback or component with state saves all of it in state_dict and restores it)"
    )
