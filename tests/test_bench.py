"""`python -m benchmarks`: every suite runs on a tiny config and writes bench.json and bench.md.

No test asserts a timing: the numbers only have to be there and finite.
"""

from __future__ import annotations

import json
import math
import os
import re
import subprocess
import sys

import pytest
import torch
from hydra import compose, initialize_config_dir

from repro.core import config
from repro.core.errors import ConfigError

from conftest import CONF, ROOT, compose_config, make_image_tree, run_cli, tiny

KEYS = {"suite", "command", "date", "machine", "summary", "rows", "notes", "config"}


@pytest.fixture
def bench():
    """The bench entry point (imported here: the suites import more than other tests need)."""
    from benchmarks.__main__ import bench

    return bench


def compose_bench(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return compose(config_name="bench", overrides=[*tiny(), *overrides])


def written(run_dir):
    payload = json.loads((run_dir / "bench.json").read_text())
    assert set(payload) >= KEYS
    table = (run_dir / "bench.md").read_text()
    assert table.startswith(f"# benchmarks suite={payload['suite']}") and "|---|" in table
    return payload


def finite(*values):
    return all(isinstance(v, int | float) and math.isfinite(v) for v in values)


def test_knobs_suite_measures_each_row_and_marks_what_needs_cuda(bench, tmp_path):
    cfg = compose_bench(
        "suite=knobs", "suite.warmup_steps=1", "suite.timed_steps=2",
        "suite.grid.memory_format=[contiguous,channels_last]", "suite.grid.amp=[off]",
        "suite.grid.loader=[0,device]", "suite.grid.pin_memory=[false,true]",
        "suite.grid.cudnn_benchmark=[false]", "suite.grid.compile=[false,true]",
        "trainer.device=cpu",
    )  # fmt: skip
    bench(cfg, tmp_path)
    payload = written(tmp_path)
    measured = [row for row in payload["rows"] if row["status"] == "ok"]
    assert len(measured) == 4  # 2 memory formats x 2 loaders
    for row in measured:
        assert finite(row["images_per_s"], row["step_ms_median"], row["step_ms_p10"],
                      row["step_ms_p90"], row["peak_mem_mib"], row["speedup"])  # fmt: skip
        assert row["images_per_s"] > 0 and 0 <= row["data_wait_frac"] <= 1
        assert row["step_ms_p10"] <= row["step_ms_median"] <= row["step_ms_p90"]
    plain = measured[0]
    assert (plain["memory_format"], plain["loader"], plain["speedup"]) == ("contiguous", 0, 1.0)
    unavailable = {(k, v) for row in payload["rows"] if row["status"] != "ok"
                   for k, v in row.items() if v is True}  # fmt: skip
    assert unavailable == {("pin_memory", True), ("compile", True)}
    summary = payload["summary"]
    assert summary["device"] == "cpu" and finite(summary["plain_images_per_s"])


def test_overhead_suite_compares_the_loop_with_a_bare_one(bench, tmp_path):
    cfg = compose_bench("suite=overhead", "suite.pairs=2", "suite.steps=3", "suite.warmup_steps=1")
    bench(cfg, tmp_path)
    payload = written(tmp_path)
    summary = payload["summary"]
    assert finite(summary["template_over_bare"], summary["template_over_bare_total"],
                  summary["template_images_per_s"], summary["bare_images_per_s"])  # fmt: skip
    assert [row["loop"] for row in payload["rows"]] == ["template", "bare", "bare", "template"]
    # Each pair's ratio is its bare time over its template time; the summary is their median.
    ratios = []
    for pair in (0, 1):
        rows = {row["loop"]: row for row in payload["rows"] if row["pair"] == pair}
        ratio = rows["bare"]["seconds"] / rows["template"]["seconds"]
        assert rows["template"]["template_over_bare"] == pytest.approx(ratio)
        assert rows["template"]["images_per_s"] / rows["bare"]["images_per_s"] == (
            pytest.approx(ratio)
        )
        ratios.append(ratio)
    assert summary["template_over_bare"] == pytest.approx(sum(ratios) / 2)
    assert summary["accepted"] == (summary["template_over_bare"] >= summary["accept_at_least"])


@pytest.mark.e2e
@pytest.mark.slow
def test_startup_suite_from_the_command_line(tmp_path):
    done = run_cli("benchmarks", "suite=startup", "suite.repeats=1", *tiny(),
                   f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert done.returncode == 0, done.stderr
    payload = written(tmp_path)
    summary = payload["summary"]
    assert finite(summary["startup_overhead_s"], summary["first_step_s"],
                  summary["import_torch_s"], summary["import_torch_torchvision_s"])  # fmt: skip
    assert summary["first_step_s"] > 0 and summary["import_torch_torchvision_s"] > 0
    assert "trainer.epochs=1" in summary["train_overrides"]
    assert not any(o.startswith(("suite", "hydra")) for o in summary["train_overrides"])
    assert "suite=startup" in payload["command"] and "startup_overhead_s" in done.stdout


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("suite.timed_steps=0", "suite.timed_steps=0 is not allowed: an integer >= 1"),
        ("suite.grid.loader=[2,many]", "suite.grid.loader='many'"),
        ("suite.grid.amp=[bf61]", "list items from: off, auto, bf16, fp16"),
        ("suite.grid.memory_format=channels_last", "a non-empty list"),
        ("suite.grid.compile=[]", "suite.grid.compile=[] is not allowed"),
        ("suite.rows=[{loadr:0}]", "suite.rows='loadr' is not allowed: axes from"),
        ("suite.rows=[{amp:fp61}]", "suite.rows.amp='fp61' is not allowed"),
        ("suite.rows=[]", "null (the grid) or a list of rows"),
    ],
)
def test_bad_suite_settings_are_named_before_anything_runs(bench, tmp_path, override, message):
    cfg = compose_bench("suite=knobs", override)
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench(cfg, tmp_path)
    assert not list(tmp_path.iterdir())


@pytest.mark.e2e
@pytest.mark.slow
def test_a_bad_setting_on_the_command_line_exits_2_without_a_traceback(tmp_path):
    done = run_cli("benchmarks", "suite=overhead", "suite.pairs=-1", f"hydra.run.dir={tmp_path}")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "error: suite.pairs=-1 is not allowed: an integer >= 1" in done.stderr


def test_knobs_rows_measure_just_the_rows_listed(bench, tmp_path):
    cfg = compose_bench(
        "suite=knobs", "suite.warmup_steps=1", "suite.timed_steps=1",
        "suite.rows=[{loader:0},{memory_format:channels_last,amp:bf16},{compile:true}]",
    )  # fmt: skip
    payload = bench(cfg, tmp_path)
    measured = [row for row in payload["rows"] if row["status"] == "ok"]
    assert [(r["memory_format"], r["amp"], r["loader"]) for r in measured] == [
        ("contiguous", "off", 0),
        ("channels_last", "bf16", 0),
    ]  # unnamed axes are plain, the loader the grid's first
    assert measured[0]["speedup"] == 1.0  # the plain row is the baseline
    if not torch.cuda.is_available():
        assert [r["compile"] for r in payload["rows"] if r["status"] != "ok"] == [True]


# ---- suite=exactness ----------------------------------------------------------------------

EXACTNESS = ("suite=exactness", "suite.steps=5", "suite.checkpoint_every_steps=2")


def test_the_fp16_runs_drop_the_exact_preset_and_keep_its_other_settings(tmp_path):
    """On CUDA the suite's runs are under preset=exact, which refuses amp=fp16: the fp16
    check must leave the preset out (a GPU run found `preset=null` does not compose)."""
    from benchmarks.exactness import FP16_EXACT
    from benchmarks.runs import Runner, merged

    runner = Runner(tmp_path, ["preset=exact", "seed.value=3", "trainer.max_steps=5"], 60)
    overrides = merged(runner.without(("preset",)).overrides, list(FP16_EXACT))
    cfg = compose_config(*overrides)
    config.validate(cfg)  # preset=exact's own check would refuse amp=fp16
    assert cfg.preset is None and cfg.amp.mode == "fp16" and cfg.seed.value == 3
    assert cfg.cudnn.deterministic and cfg.cudnn.deterministic_algorithms
    assert not cfg.cudnn.benchmark and not cfg.trainer.compile


@pytest.mark.e2e
@pytest.mark.slow
def test_exactness_suite_passes_on_this_machine(tmp_path):
    done = run_cli("benchmarks", *EXACTNESS, "suite.kill_seed=0", *tiny(),
                   f"hydra.run.dir={tmp_path}")  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = written(tmp_path)["summary"]
    checks = {check["name"]: check for check in summary["checks"]}
    assert list(checks) == ["rerun", "workers", "device_loader", "kill_resume",
                            "fp16_kill_resume", "torchrun", "cost"]  # fmt: skip
    for name in ("rerun", "workers", "device_loader", "kill_resume"):
        assert checks[name]["passed"] is True, checks[name]
    if torch.cuda.is_available():  # a GPU runs the fp16 check: it must pass there
        assert checks["fp16_kill_resume"]["passed"] is True, checks["fp16_kill_resume"]
    else:
        assert checks["fp16_kill_resume"]["passed"] is None
        assert checks["fp16_kill_resume"]["detail"].startswith("skipped")
    assert summary["all_passed"] is True and summary["steps"] == 5
    assert 3 <= summary["kill_step"] <= 4, "after the first checkpoint, before the end"
    assert f"killed at step {summary['kill_step']}, resumed from" in checks["kill_resume"]["detail"]
    assert finite(summary["exact_images_per_s"], summary["fast_images_per_s"])
    # The runs are real ones, of the configured (tiny) model, with their own folders.
    reference = tmp_path / "runs" / "reference" / "resolved_config.yaml"
    assert "- 8\n" in reference.read_text(), "model.widths=[8,16] reached the runs"


NOISY_MODEL = """
import secrets, torch
from repro.extras.models.small_cnn import SmallCNN

class Noisy(SmallCNN):
    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        with torch.no_grad():  # a fresh draw in every process: no two runs agree
            self[0].weight.add_(secrets.randbelow(1000) / 1000)
"""


@pytest.mark.e2e
@pytest.mark.slow
def test_a_failing_check_is_reported_and_the_command_exits_1(tmp_path):
    (tmp_path / "noisy_model.py").write_text(NOISY_MODEL)
    done = run_cli(
        "benchmarks", *EXACTNESS, "suite.checks=[rerun]", *tiny(),
        "model._target_=noisy_model.Noisy", f"hydra.run.dir={tmp_path / 'bench'}",
        env={"PYTHONPATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]
    summary = written(tmp_path / "bench")["summary"]
    assert summary["all_passed"] is False
    ((rerun,),) = [[c for c in summary["checks"] if c["name"] == "rerun"]]
    assert rerun["passed"] is False and "reference" in rerun["detail"]


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("suite.checkpoint_every_steps=4", "suite.checkpoint_every_steps=4 is not allowed: less"),
        ("suite.checks=[rerun,bogus]", "a non-empty list of: rerun, workers"),
        ("suite.kill_seed=-3", "suite.kill_seed=-3 is not allowed"),
        ("suite.steps=1", "suite.steps=1 is not allowed: an integer >= 3"),
    ],
)
def test_bad_exactness_settings_are_named_before_anything_runs(bench, tmp_path, override, message):
    cfg = compose_bench(*EXACTNESS, override)
    with pytest.raises(ConfigError, match=re.escape(message)):
        bench(cfg, tmp_path)
    assert not list(tmp_path.iterdir())


def test_data_suite_times_each_loader_against_a_bare_reference(bench, tmp_path):
    cfg = compose_bench(
        "suite=data", "suite.batches=2", "suite.repeats=1", "suite.warmup_batches=1",
        "trainer.device=cpu",
    )  # fmt: skip
    bench(cfg, tmp_path)
    payload = written(tmp_path)
    assert [row["loader"] for row in payload["rows"]] == [0, 2, "device"]
    for row in payload["rows"]:
        assert row["template_batches_per_s"] > 0 and row["bare_batches_per_s"] > 0
        ratio = row["template_batches_per_s"] / row["bare_batches_per_s"]  # one repetition
        assert row["data_over_bare"] == pytest.approx(ratio, rel=1e-3)
    by_loader = {str(row["loader"]): row["data_over_bare"] for row in payload["rows"]}
    assert payload["summary"]["data_over_bare"] == by_loader


def test_the_bare_reference_makes_real_crops_and_flips():
    from benchmarks.data import BareBatches

    images = torch.randint(0, 256, (6, 3, 8, 8), dtype=torch.uint8)
    bare = BareBatches(images, torch.arange(6), size=8, pad=2)
    made, labels = bare.make(0, torch.tensor([4, 1]))
    assert made.shape == (2, 3, 8, 8) and labels.tolist() == [4, 1]
    padded = torch.nn.functional.pad(images, (2, 2, 2, 2))
    for image, index in zip(made, (4, 1), strict=True):
        crops = [padded[index, :, t : t + 8, x : x + 8] for t in range(5) for x in range(5)]
        assert any(torch.equal(image, c) or torch.equal(image, c.flip(-1)) for c in crops)


def test_gpu_figures_runs_one_part_into_a_table_and_refuses_an_unknown_part(tmp_path):
    """scripts/gpu_figures.sh: only the table comes back, headed by the commit and versions;
    a part whose time is spent says so rather than overrunning the device call."""
    script = ROOT / "scripts" / "gpu_figures.sh"
    env = {**os.environ, "PYTHON": sys.executable, "COMMIT": "abc123", "PART_TIMEOUT": "0",
           "SCRATCH": str(tmp_path / "scratch")}  # fmt: skip
    out = tmp_path / "out"
    done = subprocess.run(["bash", str(script), "data", str(tmp_path), str(out)], env=env,
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in out.iterdir()) == ["data-raw.tar.gz", "data.md"]
    table = (out / "data.md").read_text()
    assert "- commit: abc123" in table and f"torch {torch.__version__}" in table
    assert "- data: not run (the part's time was spent)" in table
    refused = subprocess.run(["bash", str(script), "all", str(tmp_path), str(out)], env=env,
                             capture_output=True, text=True, timeout=60)  # fmt: skip
    assert refused.returncode == 2 and "part=all is not one of" in refused.stderr


def peers_tree(tmp_path):
    """CIFAR-10's layout in little: train/ and test/ of 32 x 32 images."""
    tree = make_image_tree(tmp_path / "images", 8, 4, side=32)
    (tree / "val").rename(tree / "test")
    return tree


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusal is for machines without a GPU")
@pytest.mark.slow
def test_peers_refuses_without_a_gpu_and_names_the_cpu_check(tmp_path):
    tree = peers_tree(tmp_path)
    done = run_cli("benchmarks", "suite=peers", "data=imagefolder", f"data.root={tree}",
                   f"hydra.run.dir={tmp_path / 'run'}")  # fmt: skip
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert "suite.cpu=true" in done.stderr and len(done.stderr.strip().splitlines()) == 1


@pytest.mark.e2e
@pytest.mark.slow
def test_peers_in_cpu_mode_writes_airbenchs_files_and_runs_our_side(tmp_path):
    from torchvision.io import decode_image

    tree, run_dir = peers_tree(tmp_path), tmp_path / "run"
    done = run_cli("benchmarks", "suite=peers", "suite.cpu=true", "data=imagefolder",
                   f"data.root={tree}", "data.cache=memory", "data.val_size=6",
                   "trainer.test_weights=last",  # 6 validation images: too few to select by
                   f"hydra.run.dir={run_dir}",
                   timeout=600)  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    payload = json.loads((run_dir / "bench.json").read_text())
    ours = [row for row in payload["rows"] if row["side"] == "ours"]
    assert len(ours) == 1 and ours[0]["train_s"] > 0 and 0 <= ours[0]["test_acc"] <= 1
    peers = [row for row in payload["rows"] if row["side"] != "ours"]
    assert peers and all(row["note"].startswith("not run") for row in peers)
    assert payload["summary"]["images"] == {"train": 24, "test": 12}
    # The peer's files hold what the folder holds, in airbench's layout.
    test = torch.load(run_dir / "peer_data" / "cifar10" / "test.pt", weights_only=True)
    assert test["images"].dtype == torch.uint8 and test["images"].shape == (12, 32, 32, 3)
    assert test["labels"].dtype == torch.int64 and test["classes"] == sorted(test["classes"])
    first = sorted((tree / "test" / test["classes"][0]).iterdir())[0]
    assert torch.equal(test["images"][0], decode_image(str(first))[:3].permute(1, 2, 0))
    assert test["labels"].tolist() == sorted(test["labels"].tolist())


def test_timms_rate_is_its_epoch_average_after_the_first_epoch():
    from benchmarks.peers import timm_images_per_second

    line = ("Train: {} [  {}/97 ( 10%)]  Loss: 2.30 (2.30)  Time: 0.250s, {:>7.2f}/s  "
            "({:.3f}s, {:>7.2f}/s)  LR: 1.000e-01  Data: 0.010 (0.012)")  # fmt: skip
    rates = [(0, 100.0, 90.0), (1, 2000.0, 1500.0), (1, 2100.0, 1600.0), (1, 2050.0, 1650.0)]
    log = "\n".join(line.format(epoch, 10, one, 0.3, average) for epoch, one, average in rates)
    # The running average on the steady epoch's last line, not one batch's rate.
    assert timm_images_per_second(log) == 1650.0
    assert timm_images_per_second(line.format(0, 0, 100.0, 0.3, 90.0)) is None


def test_data_suite_on_pixel_shards_measures_them_against_the_folder_they_hold(bench, tmp_path):
    from repro.core.data.sources import decode_file
    from repro.shards.pack import pack

    tree = make_image_tree(tmp_path / "images", side=32)
    shards = pack(tree, tmp_path / "shards", 8000, pixels=True).parent
    side = ["suite=data", "suite.loaders=[0]", "data=shards", f"data.root={shards}",
            "data.resize=null", "trainer.batch_size=6", "suite.batches=2", "suite.repeats=2",
            "suite.warmup_batches=1"]  # fmt: skip
    for run in ("written", "given", "other"):
        (tmp_path / run).mkdir()
    bench(compose_bench(*side), tmp_path / "written")
    (row,) = written(tmp_path / "written")["rows"]
    assert finite(row["shards_images_per_s"], row["folder_images_per_s"], row["shards_over_folder"])
    assert row["shard_bytes_per_image"] > 3 * 32 * 32  # the pixels and their tar blocks
    # Written out, pixel samples are PNGs of the same pixels as the files they were packed from.
    out = sorted((tmp_path / "written" / "as_folder" / "train").rglob("*.png"))
    packed_from = sorted((tree / "train").rglob("*.png"))
    assert sorted(int(decode_file(p).sum()) for p in out) == sorted(
        int(decode_file(p).sum()) for p in packed_from
    )
    bench(compose_bench(*side, f"suite.folder={tree}"), tmp_path / "given")
    assert written(tmp_path / "given")["rows"][0]["folder_bytes_per_image"] == pytest.approx(
        sum(p.stat().st_size for p in packed_from) / len(packed_from)
    )
    with pytest.raises(ConfigError, match=r"suite\.folder"):  # not the shards' images
        fewer = make_image_tree(tmp_path / "fewer", per_class=4, side=32)
        bench(compose_bench(*side, f"suite.folder={fewer}"), tmp_path / "other")
