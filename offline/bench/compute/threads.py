"""Thread count and OpenMP wait policy on a shared machine: what training and serving should default to.

    python -m offline.bench.compute.threads --out docs/results/serve [--seconds 10]

Each variant runs in a fresh process (the OpenMP runtime reads its environment once, at start): a fixed
training-like workload (forward + backward of a small transformer layer stack on (64, 50) windows) and a
serving-like one (batch-1 forwards, 50 items), each for ``--seconds``, counting completed steps. Variants:
torch's default thread count vs 1 thread, and OpenMP's default wait policy (threads spin after each
parallel region) vs ``OMP_WAIT_POLICY=PASSIVE`` (they sleep). Run it while other jobs share the cores:
the spread between the variants is what contention costs each choice.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from offline.tables import markdown_table

VARIANTS = {  # name -> (threads, OMP_WAIT_POLICY; None = OpenMP's default)
    "default threads, default wait": (None, None),
    "default threads, PASSIVE": (None, "PASSIVE"),
    "1 thread, default wait": (1, None),
    "1 thread, PASSIVE": (1, "PASSIVE"),
}

WORKLOAD = """
import json, sys, time, torch
threads, seconds = int(sys.argv[1]), float(sys.argv[2])
if threads:
    torch.set_num_threads(threads)
torch.manual_seed(0)
layer = torch.nn.TransformerEncoderLayer(64, 4, 256, batch_first=True)
model = torch.nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
opt = torch.optim.Adam(model.parameters(), 1e-3)
x = torch.randn(64, 50, 64)
def train():
    opt.zero_grad(); model(x).pow(2).mean().backward(); opt.step()
one = torch.randn(1, 50, 64)
def serve():
    with torch.inference_mode():
        model(one)
out = {"threads_used": torch.get_num_threads()}
for name, step in (("train", train), ("serve", serve)):
    step()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        step(); n += 1
    out[name] = n / (time.perf_counter() - start)
print(json.dumps(out))
"""


def run_variant(threads: int | None, policy: str | None, seconds: float) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_NUM_THREADS", "OMP_WAIT_POLICY")}
    if policy is not None:
        env["OMP_WAIT_POLICY"] = policy
    done = subprocess.run([sys.executable, "-c", WORKLOAD, str(threads or 0), str(seconds)], env=env, check=True,
                          capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=10.0)
    args = p.parse_args(argv)
    before = os.getloadavg()
    results = {name: run_variant(*variant, args.seconds) for name, variant in VARIANTS.items()}
    report = {"seconds": args.seconds, "cores": os.cpu_count(), "load_average_before": before,
              "load_average_after": os.getloadavg(), "variants": results}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "threads.json").write_text(json.dumps(report, indent=2))
    rows = [[name, r["threads_used"], f"{r['train']:.2f}", f"{r['serve']:.1f}"] for name, r in results.items()]
    text = "\n".join([
        "# Threads and OpenMP wait policy under contention", "",
        f"{args.seconds:g} s per workload per variant, each variant a fresh process, one after another; "
        f"{report['cores']}-core machine, load average {', '.join(f'{x:.1f}' for x in before)} before and "
        f"{', '.join(f'{x:.1f}' for x in report['load_average_after'])} after (other jobs shared the cores).", "",
        markdown_table(["variant", "torch threads", "training steps/s", "batch-1 forwards/s"], rows), ""])
    (args.out / "threads.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
