#!/usr/bin/env bash
# The GPU figures of docs/benchmarks.md, measured again on this machine's GPU:
#
#   bash scripts/gpu_figures.sh IMAGES OUT [speedrun|throughput|overhead|data|all]
#
# IMAGES: CIFAR-10 as an image folder (IMAGES/train/<class>/*, IMAGES/test/<class>/*), decoded
# into memory by each speedrun and throughput run (data.cache=memory); the overhead and data
# parts use the built-in synthetic data. OUT: where the runs and the tables go; each part
# writes its table (markdown) to OUT/<part>.md, and every ratio in a table comes from runs of
# the same call. Use a new OUT each time: a run folder that holds a finished run is not run
# again. PYTHON names the interpreter (default: python).
set -euo pipefail
images=${1:?usage: gpu_figures.sh IMAGES OUT [part]}
out=${2:?usage: gpu_figures.sh IMAGES OUT [part]}
part=${3:-all}
python=${PYTHON:-python}
mkdir -p "$out"

# CIFAR-10's statistics and split, from image files: 45,000 train, 5,000 validation, 10,000 test.
cifar=(data=imagefolder "data.root=$images" data.cache=memory data.resize=null
       data.crop_padding=4 data.val_size=5000 "data.mean=[0.4914,0.4822,0.4465]"
       "data.std=[0.2470,0.2435,0.2616]" logger.progress=off)

speedrun() {
    # Three seeds without and with torch.compile: test accuracy and seconds of training.
    for compile in false true; do
        for seed in 0 1 2; do
            "$python" -m repro.train experiment=cifar10_speedrun "${cifar[@]}" "seed=$seed" \
                "trainer.compile=$compile" "hydra.run.dir=$out/speedrun/compile-$compile/seed-$seed"
        done
    done
    "$python" - "$out/speedrun" <<'EOF' | tee "$out/speedrun.md"
import json, statistics, sys
from pathlib import Path
print("| compile | seed | train_s | val_acc | test_acc |\n|---|---|---|---|---|")
for folder in sorted(Path(sys.argv[1]).iterdir()):
    runs = [json.loads(p.read_text()) for p in sorted(folder.glob("seed-*/summary.json"))]
    for run in runs:
        print(f"| {folder.name} | {run['seed']} | {run['train_s']:.2f} | {run['val_acc']:.4f} "
              f"| {run['test_acc']:.4f} |")
    mean = statistics.mean(run["test_acc"] for run in runs)
    seconds = statistics.mean(run["train_s"] for run in runs)
    print(f"| {folder.name} | mean | {seconds:.2f} | | **{mean:.4f}** |")
EOF
}

throughput() {
    # ResNet-18 for CIFAR: the plain row (contiguous, fp32, worker loading) against the fast
    # path, in one suite=knobs call.
    "$python" -m repro.bench suite=knobs experiment=cifar10_resnet18 "${cifar[@]}" preset=fast \
        suite.timed_steps=100 suite.warmup_steps=10 \
        'suite.rows=[{loader:2},{memory_format:channels_last,amp:bf16,loader:device,cudnn_benchmark:true,compile:true}]' \
        "hydra.run.dir=$out/throughput"
    cp "$out/throughput/bench.md" "$out/throughput.md"
}

overhead() {
    # The template's loop against the bare loop, default config and preset=fast, both loaders.
    for args in "" "preset=fast" "dataloader=device"; do
        name=${args:-default}
        "$python" -m repro.bench suite=overhead $args "hydra.run.dir=$out/overhead/${name//[=\/]/-}"
    done
    tail -n +1 "$out"/overhead/*/bench.md > "$out/overhead.md"
}

data() {
    "$python" -m repro.bench suite=data "hydra.run.dir=$out/data"
    cp "$out/data/bench.md" "$out/data.md"
}

case $part in
    all) speedrun; throughput; overhead; data ;;
    speedrun | throughput | overhead | data) "$part" ;;
    *) echo "error: part=$part is not one of speedrun, throughput, overhead, data, all" >&2; exit 2 ;;
esac
