set -e
cd "$(git rev-parse --show-toplevel)"
export OMP_NUM_THREADS=1 MKL_NUM_THREADS=1 TORCH_NUM_THREADS=1 PYTHONPATH=$PWD
S="/work/venv-wt/bin/python -m offline.cli"
mkdir -p /tmp/sizing
rm -rf /tmp/sizing/demo /tmp/sizing/demo-ex /tmp/sizing/demo-data
$S demo --no-serve --out /tmp/sizing/demo --threads 1 > /tmp/sizing/demo-table.txt
$S prepare --dataset synthetic --n-users 2000 --n-items 500 --mean-length 20 --seed 0 --out /tmp/sizing/demo-data
$S bench parity --artifact /tmp/sizing/demo/current --data /tmp/sizing/demo-data > docs/results/sizing/parity-demo-allow.txt
$S pipeline --config docs/results/sizing/demo-exclude.yaml --out /tmp/sizing/demo-ex --threads 1 > /tmp/sizing/demo-ex-table.txt
$S bench parity --artifact /tmp/sizing/demo-ex/current --data /tmp/sizing/demo-data > docs/results/sizing/parity-demo-exclude.txt
echo DONE
