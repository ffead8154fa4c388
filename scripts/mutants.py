"""Every promise guarded by a test: apply one small, plausible bug at a time, run the tests meant
to catch it, and report whether they did.

    make mutants-known                    # all of them (about 10 minutes on a 2-core CPU)
    make mutants-known ARGS="--only resume-rng,atomic-text"
    make mutants-known ARGS="--list"

Each mutant replaces one exact piece of code (it must occur once) in a scratch copy of the
repository, never in this one, so an interrupted run leaves nothing behind. Before anything
runs, every chosen mutant's code must occur once in its file and every test it names must
exist (a renamed test is an error naming it, not a "failing" baseline). The tests then run
unmutated: a mutant only counts as killed when the same tests passed without it. The exit code
is 1 when any mutant survives.

These are end-to-end promises (a killed run resumes exactly, a write is atomic and durable),
guarded by slow tests that run the entry points; `make mutants` (scripts/mutation.py, mutmut)
mutates the engine's modules line by line against their fast tests instead.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = "repro"  # scripts/new_project.py renames it


@dataclass(frozen=True)
class Mutant:
    name: str
    promise: str
    file: str  # relative to src/<package>/
    old: str
    new: str
    tests: tuple[str, ...]  # pytest node ids or files, relative to tests/


MUTANTS = [
    # Exact resume: every part of the state comes back.
    Mutant("resume-rng", "a resume restores the global generators (dropout)",
           "core/engine/loop.py", 'restore_rng(state["rng"][self.dist.rank], self.device)', "pass",
           ("test_resume_state.py::test_a_resumed_run_with_dropout_ends_on_the_straight_weights",)),
    Mutant("resume-scaler", "a resume restores the fp16 loss scaler",
           "core/engine/loop.py", 'self.knobs.precision.scaler.load_state_dict(state["scaler"])', "pass",
           ("test_resume_state.py::test_the_loss_scalers_state_survives_a_resume",)),
    Mutant("resume-optimizer", "a resume restores the optimizer's state (momentum)",
           "core/engine/loop.py", 'self.optimizer.load_state_dict(state["optimizer"])', "pass",
           ("test_resume_data.py::test_a_halted_run_resumes_to_the_straight_weights",)),
    Mutant("resume-scheduler", "a resume restores the learning-rate schedule",
           "core/engine/loop.py", 'self.scheduler.load_state_dict(state["scheduler"])', "pass",
           ("test_resume_data.py::test_a_halted_run_resumes_to_the_straight_weights",)),
    Mutant("resume-ema", "a resume restores the weight average (every component's state)",
           "core/watch/callbacks.py", "                component.load_state_dict(found)", "                pass",
           ("test_component_ema.py::test_ema_and_accumulation_resume_exactly_after_a_kill[0]",)),
    Mutant("resume-logs", "a resume cuts the logs back to its checkpoint",
           "core/run.py", "loggers.truncate_logs(run_dir, trainer.state.position.step)", "pass",
           ("test_storage_faults.py::test_a_resume_drops_a_torn_fingerprint_line_and_stays_exact",)),
    Mutant("resume-data", "a resume refuses data that changed under the run folder",
           "core/run.py", "resume.check_same_data(state, parts.data, cfg.data.root)", "pass",
           ("test_resume_data.py::test_a_resume_after_the_folder_gained_a_class_is_refused_naming_the_data",)),
    Mutant("inferred-into-config", "what the data implies is not a config difference",
           "core/build.py", "    return build_splits(cfg.data, root_seed, progress)",
           "    built = build_splits(cfg.data, root_seed, progress)\n"
           "    cfg.data.num_classes = cfg.data.num_classes or len(built.classes)\n"
           "    return built",
           ("test_resume_data.py::test_an_inferred_class_count_is_recorded_but_stays_out_of_the_config",)),
    # Worker invariance: a sample's draws do not depend on who computes them.
    Mutant("worker-draws", "torchvision transforms draw from the sample's key, not the worker",
           "core/data/transforms.py", "        generator.manual_seed(seed)\n", "",
           ("test_augment.py::test_a_yaml_list_of_torchvision_transforms_trains_the_same_for_any_worker_count",)),
    # Atomic and durable writes.
    Mutant("atomic-text", "a record is replaced whole or not at all",
           "core/files.py", 'with atomic_path(path) as tmp, tmp.open("w") as handle:',
           'with writing(path), path.open("w") as handle:',
           ("test_storage_faults.py::test_a_refused_atomic_write_names_the_path_and_keeps_the_old_file",
            "test_atomic_writes.py::test_a_crash_inside_a_record_write_keeps_the_old_record_whole")),
    Mutant("atomic-checkpoint", "a checkpoint is written aside and renamed into place",
           "core/runs/checkpoint.py", 'with atomic_path(path) as tmp, tmp.open("wb") as handle:',
           'with path.open("wb") as handle:',
           ("test_atomic_writes.py::test_a_crash_mid_checkpoint_leaves_the_last_one_and_no_other",)),
    Mutant("durable-text", "a record's bytes are fsynced before the rename",
           "core/files.py", "        os.fsync(handle.fileno())", "        pass",
           ("test_atomic_writes.py::test_data_is_fsynced_before_the_rename_makes_it_visible",)),
    Mutant("durable-checkpoint", "a checkpoint's bytes are fsynced before the rename",
           "core/runs/checkpoint.py", "        os.fsync(handle.fileno())", "        pass",
           ("test_atomic_writes.py::test_data_is_fsynced_before_the_rename_makes_it_visible",)),
    Mutant("disk-error", "a write the disk refuses surfaces as its OSError",
           "core/runs/checkpoint.py", "torch.save(obj, noted)", "torch.save(obj, handle)",
           ("test_storage_faults.py::test_torch_save_on_a_full_disk_raises_the_disks_error_not_torchs",)),
    # Weights-only loading and integrity.
    Mutant("unpickle-checkpoint", "a checkpoint is read with weights_only=True",
           "core/guards/received.py", 'torch.load(handle, map_location="cpu", weights_only=True)',
           'torch.load(handle, map_location="cpu", weights_only=False)',
           ("test_checkpoint_units.py::test_a_file_that_is_not_a_usable_checkpoint_is_refused_saying_why",)),
    Mutant("unpickle-init", "init_weights reads with weights_only=True",
           "core/guards/received.py",
           'torch.load(io.BytesIO(contents), map_location="cpu", weights_only=True)',
           'torch.load(io.BytesIO(contents), map_location="cpu", weights_only=False)',
           ("test_init_weights.py::test_files_that_cannot_start_a_model_are_refused_in_one_line",)),
    Mutant("digest", "a damaged checkpoint is refused, not trained on",
           "core/runs/checkpoint.py", 'if state.get("version", VERSION) >= 4 and not integrity.intact(state):',
           "if False:", ("test_integrity.py",)),
    Mutant("trust", "a stored config builds only trusted targets",
           "core/runs/trust.py", "    check(stored, source, trust)\n", "",
           ("test_trust.py::test_evaluate_predict_and_verify_refuse_a_harmful_target_and_create_nothing",)),
    # Record honesty.
    Mutant("record-failure", "a failed attempt is recorded as failed",
           "core/run.py", "            run_history.fail(error, step)",
           "            pass", ("test_trackers.py::test_a_tracker_that_cannot_start_is_one_line_and_fails_the_attempt",)),
    Mutant("record-died", "an attempt that died without a word is marked so",
           "core/runs/history.py", "                attempt[\"result\"] = DIED", "                pass",
           ("test_run_records.py::test_a_killed_attempt_is_marked_died_by_the_resume_which_is_recorded",)),
    Mutant("record-first", "the first attempt's .hydra/ is never overwritten",
           "core/runs/history.py", "    if in_use or (run_dir / ATTEMPTS_FILE).exists():", "    if in_use:",
           ("test_run_records.py",)),
    Mutant("lock-fork", "a forked worker does not keep the run folder's lock",
           "core/runs/run_lock.py", "os.register_at_fork(after_in_child=_forget_in_child)", "pass",
           ("test_run_lock.py::test_a_forked_child_does_not_keep_the_lock_alive",)),
    # World invariance.
    Mutant("tree-order", "gradients are summed in one fixed tree",
           "core/engine/invariant.py", "rows = torch.cat([paired, rows[-1:]])",
           "rows = torch.cat([rows[-1:], paired])",
           ("test_world_invariant.py::test_the_tree_sums_in_one_fixed_order",)),
    # Evaluation arithmetic.
    Mutant("accuracy", "accuracy is the correct share of every image evaluated",
           "core/engine/evaluation.py", 'result["acc"] = correct_total / images', 'result["acc"] = correct_total / (images + 1)',
           ("test_predict.py::test_predictions_name_the_classes_and_agree_with_evaluate",)),
    Mutant("flip-average", "flip TTA averages an image and its mirror",
           "core/engine/evaluation.py", "model(images.flip(-1)).float()) / 2", "model(images).float()) / 2",
           ("test_trainer_features.py::test_flip_averaging_evaluates_each_image_and_its_mirror_image",)),
    # Config checks.
    Mutant("bound-upper", "label smoothing is refused from 1 on",
           "core/config.py", '"objective.label_smoothing": ("[0, 1)", False),',
           '"objective.label_smoothing": ("[0, 2)", False),',
           ("test_errors.py::test_a_refused_value_is_named_in_one_line_before_any_work",
            "test_config_bounds.py")),
    Mutant("bound-lower", "a batch of no images is refused",
           "core/config.py", '"trainer.batch_size": (1, False),', '"trainer.batch_size": (0, False),',
           ("test_errors.py::test_a_refused_value_is_named_in_one_line_before_any_work",)),
    # Export.
    Mutant("export-normalisation", "an exported model normalises its input as the run did",
           "export/formats.py", "return self.model((images - self.mean) / self.std)",
           "return self.model(images)",
           ("test_export.py::test_the_exported_model_gives_pytorchs_logits_on_64_real_images[torchscript-small_cnn]",)),
    Mutant("export-parity", "an export that disagrees with PyTorch is refused",
           "export/command.py", 'if not checked["max_abs_diff"] <= allowed:', "if False:",
           ("test_export.py::test_a_disagreement_beyond_the_tolerance_fails_and_leaves_nothing",)),
]  # fmt: skip


def defined_tests(path: Path) -> set[str]:
    """The test functions a file defines, as pytest names them: `name` or `Class::name`."""
    found = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            found.add(node.name)
        elif isinstance(node, ast.ClassDef):
            found |= {
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef)
            }
    return found


def problems(mutants: list[Mutant], root: Path = ROOT) -> list[str]:
    """What keeps these mutants from running, read from the files alone (no import, no
    pytest): code not found once in its file, a test file or function that does not exist.
    A parametrized case (`test_x[a-b]`) is checked by its function here and by pytest's
    collection in `main`."""
    found = []
    defined: dict[str, set[str] | None] = {}
    for mutant in mutants:
        path = root / "src" / PACKAGE / mutant.file
        if not path.is_file():
            found.append(f"mutant {mutant.name}: no file src/{PACKAGE}/{mutant.file}")
        elif (count := path.read_text().count(mutant.old)) != 1:
            found.append(
                f"mutant {mutant.name}: its code is {count} times in {mutant.file}, not once"
            )
        for test in mutant.tests:
            file, _, function = test.partition("::")
            if file not in defined:
                test_file = root / "tests" / file
                defined[file] = defined_tests(test_file) if test_file.is_file() else None
            if defined[file] is None:
                found.append(f"mutant {mutant.name}: no test file tests/{file}")
            elif function and function.split("[")[0] not in defined[file]:
                found.append(f"mutant {mutant.name}: no test tests/{test}")
    return found


def scratch_copy(into: Path) -> Path:
    """The tracked and new files of this checkout (no .venv, outputs or caches)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT, capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    for name in listed:
        source = ROOT / name
        if source.is_file():
            (into / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, into / name)
    return into


def pytest_command(copy: Path, *arguments: str) -> tuple[list[str], dict[str, str]]:
    """pytest in the scratch copy, its src/ first on the path."""
    env = {**os.environ, "PYTHONPATH": str(copy / "src"), "PYTHONHASHSEED": "0"}
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *arguments], env


def not_collected(copy: Path, tests: tuple[str, ...]) -> list[str]:
    """The tests pytest cannot find (a parametrized case whose id changed), run nothing."""
    command, env = pytest_command(copy, "-q", "--collect-only", *(f"tests/{t}" for t in tests))
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
    if done.returncode == 0:
        return []
    missing = [
        line.split("tests/", 1)[-1]
        for line in (done.stdout + done.stderr).splitlines()
        if line.startswith("ERROR: not found:")
    ]
    return missing or [
        f"pytest could not collect them:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
    ]


def run_tests(copy: Path, tests: tuple[str, ...]) -> bool:
    """Whether `tests` pass in the scratch copy."""
    command, env = pytest_command(copy, "-q", "-x", *(f"tests/{test}" for test in tests))
    done = subprocess.run(command, cwd=copy, env=env, capture_output=True, text=True)
    return done.returncode == 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    args = parser.parse_args(argv)
    chosen = MUTANTS
    if args.only:
        names = set(args.only.split(","))
        unknown = names - {m.name for m in MUTANTS}
        if unknown:
            sys.exit(f"error: no mutant named {', '.join(sorted(unknown))} (see --list)")
        chosen = [m for m in MUTANTS if m.name in names]
    if args.list:
        for mutant in chosen:
            print(f"{mutant.name:22} {mutant.promise}  [{mutant.file}]")
        return
    found = problems(chosen)
    if found:
        sys.exit("error: " + "\nerror: ".join(found))
    survived = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as folder:
        copy = scratch_copy(Path(folder))
        tests = tuple(dict.fromkeys(test for m in chosen for test in m.tests))
        missing = not_collected(copy, tests)
        if missing:
            sys.exit("error: no such test: " + "\nerror: no such test: ".join(missing))
        if not run_tests(copy, tests):
            sys.exit("error: the chosen tests fail without any mutant; fix them first")
        for mutant in chosen:
            path = copy / "src" / PACKAGE / mutant.file
            original = path.read_text()
            path.write_text(original.replace(mutant.old, mutant.new))
            started = time.perf_counter()
            killed = not run_tests(copy, mutant.tests)
            path.write_text(original)
            verdict = "killed" if killed else "SURVIVED"
            seconds = time.perf_counter() - started
            print(f"{verdict:8} {mutant.name:22} {seconds:5.0f} s  {mutant.promise}", flush=True)
            if not killed:
                survived.append(mutant.name)
    print(f"{len(chosen) - len(survived)} of {len(chosen)} mutants killed")
    if survived:
        print(f"survived: {', '.join(survived)}")
        raise SystemExit(1)


if __name__ == "__main__":
    main()
