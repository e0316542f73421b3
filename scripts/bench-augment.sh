#!/usr/bin/env bash
# What the data block's augmentation costs in training step time on the CPU target: each model
# built twice with `cnnc build --target cpu` — as written, and with an augment list added to its
# data block — and the two trainers' `--bench N` (N steps on one random batch, the median step)
# run alternately, ROUNDS rounds, in one run. Prints a Markdown table of the medians of the
# rounds' medians.
#
#   bash scripts/bench-augment.sh [ROUNDS] [SCALE]   (default 5 rounds; SCALE multiplies the steps per round)
set -euo pipefail
rounds=${1:-5}
scale=${2:-1}
cd "$(dirname "$0")/.."
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
go build -o "$out/cnnc" ./cmd/cnnc

# name | steps per round | model | sed expression adding the augment list
cases=(
  "mnist|200|examples/mnist.cnn|s#^    test  = mnist(\"data/mnist\")#&\n    augment = [random_crop(size=[28,28], padding=2), normalize(mean=[0.1307], std=[0.3081])]#"
  "vgg_small|10|examples/vgg_small.cnn|s#^    test  = imagefolder(\"data/cifar10/test\")#&\n    augment = [random_crop(size=[32,32], padding=4), hflip(), normalize(mean=[0.4914,0.4822,0.4465], std=[0.247,0.243,0.261])]#"
  "simplecnn|10|examples/simplecnn.cnn|s#resize=\[128,128\])#resize=[144,144])#; s#^    test  = imagefolder.*#&\n    augment = [random_resized_crop(size=[128,128]), hflip(), normalize(mean=[0.485,0.456,0.406], std=[0.229,0.224,0.225])]#"
)
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
step_ms() { "$1" --bench "$n" 2>&1 | sed -n 's/.*median step \([0-9.]*\) ms.*/\1/p'; }

echo "| model | batch | augment list | steps x rounds | step, plain (ms) | step, augmented (ms) | cost |"
echo "|---|---|---|---|---|---|---|"
for c in "${cases[@]}"; do
  IFS='|' read -r name n model expr <<<"$c"
  n=$((n * scale))
  sed -e "$expr" "$model" >"$out/$name-aug.cnn"
  grep -q augment "$out/$name-aug.cnn" || { echo "no augment list added to $model" >&2; exit 1; }
  "$out/cnnc" build "$model" --target cpu -o "$out/$name-plain" >/dev/null 2>&1
  "$out/cnnc" build "$out/$name-aug.cnn" --target cpu -o "$out/$name-aug" >/dev/null 2>&1
  : >"$out/plain.txt"; : >"$out/aug.txt"
  for _ in $(seq "$rounds"); do
    step_ms "$out/$name-plain" >>"$out/plain.txt"
    step_ms "$out/$name-aug" >>"$out/aug.txt"
  done
  p=$(median <"$out/plain.txt"); a=$(median <"$out/aug.txt")
  list=$(sed -n 's/^    augment = \(.*\)/\1/p' "$out/$name-aug.cnn")
  batch=$(sed -n 's/^ *batch *= *\([0-9]*\).*/\1/p' "$model"); batch=${batch:-32}
  echo "| $name | $batch | \`$list\` | $n x $rounds | $p | $a | $(awk -v p="$p" -v a="$a" 'BEGIN {printf "%+.1f%%", 100*(a-p)/p}') |"
done
