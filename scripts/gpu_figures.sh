#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, measured again on this machine's GPU:
#
#   bash scripts/gpu_figures.sh IMAGES OUT [speedrun|airbench|throughput|overhead|data|profile|all]
#
# IMAGES: CIFAR-10 as an image folder (IMAGES/train/<class>/*, IMAGES/test/<class>/*), decoded
# into memory by each recipe and throughput run (data.cache=memory); the overhead and data
# parts use the built-in synthetic data. OUT: where the runs and the tables go; each part
# writes its table (markdown) to OUT/<part>.md (profile: torch.profiler's tables in
# OUT/profile-<loader>.txt), and every ratio in a table comes from runs of the same call. Use
# a new OUT each time: a run folder that holds a finished run is not run again. PYTHON names the interpreter (default: python).
set -euo pipefail
images=${1:?usage: gpu_figures.sh IMAGES OUT [part]}
out=${2:?usage: gpu_figures.sh IMAGES OUT [part]}
part=${3:-all}
python=${PYTHON:-python}
mkdir -p "$out"

# CIFAR-10's statistics and split, from image files: 45,000 train, 5,000 validation, 10,000 test.
# (The crop padding of data=cifar10, which these runs replace: each recipe names its own.)
cifar=(data=imagefolder "data.root=$images" data.cache=memory data.resize=null
       data.val_size=5000 "data.mean=[0.4914,0.4822,0.4465]"
       "data.std=[0.2470,0.2435,0.2616]" logger.progress=off)

recipe() {
    # An experiment's three seeds without and with torch.compile: test accuracy and seconds
    # of training. $1: the experiment, $2: the part's name, $3: its crop padding.
    for compile in false true; do
        for seed in 0 1 2; do
            # A failed run (a diverged loss, a compiler error) is reported in the table, and
            # the other runs still go ahead.
            "$python" -m repro.train "experiment=$1" "${cifar[@]}" "data.crop_padding=$3" \
                "seed=$seed" "trainer.compile=$compile" \
                "hydra.run.dir=$out/$2/compile-$compile/seed-$seed" || {
                mkdir -p "$out/$2/compile-$compile/seed-$seed"
                echo failed > "$out/$2/compile-$compile/seed-$seed/failed"
            }
        done
    done
    "$python" - "$out/$2" <<'EOF' | tee "$out/$2.md"
import json, statistics, sys
from pathlib import Path
print("| compile | seed | train_s | val_acc | test_acc |\n|---|---|---|---|---|")
for folder in sorted(Path(sys.argv[1]).iterdir()):
    runs = []
    for seed in sorted(folder.glob("seed-*")):
        if (seed / "failed").exists() or not (seed / "summary.json").exists():
            print(f"| {folder.name} | {seed.name} | failed | | |")
            continue
        run = json.loads((seed / "summary.json").read_text())
        runs.append(run)
        print(f"| {folder.name} | {run['seed']} | {run['train_s']:.2f} | {run['val_acc']:.4f} "
              f"| {run['test_acc']:.4f} |")
    if runs:
        mean = statistics.mean(run["test_acc"] for run in runs)
        seconds = statistics.mean(run["train_s"] for run in runs)
        print(f"| {folder.name} | mean of {len(runs)} | {seconds:.2f} | | **{mean:.4f}** |")
EOF
}

speedrun() { recipe cifar10_speedrun speedrun 4; }

airbench() { recipe cifar10_airbench airbench 2; }

throughput() {
    # ResNet-18 for CIFAR: the plain row (contiguous, fp32, worker loading) against the fast
    # path, in one suite=knobs call.
    "$python" -m benchmarks suite=knobs experiment=cifar10_resnet18 "${cifar[@]}" \
        data.crop_padding=4 preset=fast \
        suite.timed_steps=100 suite.warmup_steps=10 \
        'suite.rows=[{loader:2},{memory_format:channels_last,amp:bf16,loader:device,cudnn_benchmark:true,compile:true}]' \
        "hydra.run.dir=$out/throughput"
    cp "$out/throughput/bench.md" "$out/throughput.md"
}

overhead() {
    # The template's loop against the bare loop, default config and preset=fast, both loaders.
    for args in "" "preset=fast" "dataloader=device"; do
        name=${args:-default}
        "$python" -m benchmarks suite=overhead $args "hydra.run.dir=$out/overhead/${name//[=\/]/-}"
    done
    tail -n +1 "$out"/overhead/*/bench.md > "$out/overhead.md"
}

data() {
    "$python" -m benchmarks suite=data "hydra.run.dir=$out/data"
    cp "$out/data/bench.md" "$out/data.md"
}

profile() {
    # Where a step's time goes, op by op: the default config with worker loading (where the
    # loop ran furthest behind the bare loop) and with dataloader=device. OUT/profile-*.txt:
    # torch.profiler's table of steps 60-70; the Chrome traces stay in the run folders.
    for args in "" "dataloader=device"; do
        name=${args:-workers}
        name=${name//[=\/]/-}
        "$python" -m repro.train $args trainer.max_steps=80 "trainer.profile_steps=[60,70]" \
            logger.progress=off "hydra.run.dir=$out/profile/$name"
        cp "$out/profile/$name/profile/steps-60-70.txt" "$out/profile-$name.txt"
    done
}

case $part in
    all) speedrun; airbench; throughput; overhead; data; profile ;;
    speedrun | airbench | throughput | overhead | data | profile) "$part" ;;
    *)
        echo "error: part=$part is not one of speedrun, airbench, throughput, overhead, data, profile, all" >&2
        exit 2
        ;;
esac
