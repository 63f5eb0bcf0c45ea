"""Where a served request's time goes, sampled by py-spy in the running server under open-loop load.

    python -m offline.bench.serve.profile_serve --artifact BUNDLE --out docs/results/serve --name after
        [--server-code OLD_TREE --name before] [--rate 50] [--seconds 20]

Starts the service (from ``--server-code`` when given, to profile another version), offers ``--rate``
requests/s of the `seqrec bench serve` bodies, and records the server with ``py-spy record`` (collapsed
stacks, 250 samples/s, idle threads left out). Each sample is put in one bucket by the deepest seqrec
frame on its stack (encoder, FAISS search, ranker features, ranker model, the two-stage glue, the
answer and its JSON, the store, the engine) or, with no seqrec frame, in "HTTP, validation, event loop".
Writes OUT/profile-NAME.{txt,md}: the raw stacks and the share of samples per bucket.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
import threading
from collections import Counter
from pathlib import Path

from common.errors import SeqrecError
from offline.bench.lib.load import run_load
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import SERVICE_APP, start_server_process
from offline.tables import markdown_table

BUCKETS = (  # (path fragment of the deepest seqrec frame, bucket), first match wins
    ("ranker/features.py", "ranker features"),
    ("ranker/", "ranker model (LightGBM / MLP)"),
    ("retriever/index", "FAISS search"),
    ("retriever/", "encoder"),
    ("service/system/recommend.py", "two-stage glue (padding, exclusions, top-k)"),
    ("service/http/answer.py", "answer: ids, metadata, response body"),
    ("service/http/routes/", "route (orjson body)"),
    ("service/http/schemas.py", "request validation (seqrec validators)"),
    ("service/http/store", "history store"),
    ("service/http/engine.py", "engine (batching, thread hop)"),
    ("service/http/metrics.py", "HTTP, validation, event loop (no seqrec frame)"),  # the middleware wraps the ASGI send
    ("service/", "service, other"),
)
FRAMEWORK = "HTTP, validation, event loop (no seqrec frame)"
HOP = "thread hop (executor futures, wake-ups)"
IDLE = "idle (waiting for work; left out of the shares)"
# Leaf frames of a thread that waits: uvloop polls in C under Runner.run, the executor's worker blocks on its
# queue. py-spy's own idle detection misses them with --nonblocking.
IDLE_LEAVES = ("Runner.run (asyncio/runners.py", "Condition.wait (threading.py",
               "_worker (concurrent/futures/thread.py", "Event.wait (threading.py")
HOP_LEAVES = ("_chain_future", "Condition.notify (threading.py", "Future.set_result (concurrent/futures")


def bucket(stack: str) -> str:
    """The bucket of one collapsed stack ("frame;frame;...;leaf"), by its deepest seqrec frame."""
    leaf = stack.rsplit(";", 1)[-1]
    if leaf.startswith(IDLE_LEAVES):
        return IDLE
    if any(hop in leaf for hop in HOP_LEAVES):
        return HOP
    for frame in reversed(stack.split(";")):
        for fragment, name in BUCKETS:
            if fragment in frame and "site-packages" not in frame:
                return name
    return FRAMEWORK


def shares(collapsed: str) -> Counter[str]:
    counts: Counter[str] = Counter()
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if stack and n.isdigit():
            counts[bucket(stack)] += int(n)
    return counts


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--artifact", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--name", default="after")
    p.add_argument("--server-code", type=Path, default=None, help="source tree of the version to profile")
    p.add_argument("--rate", type=float, default=50.0)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--max-wait-ms", type=float, default=None, help="SEQREC_MAX_WAIT_MS of the server")
    argv = sys.argv[1:] if argv is None else argv
    args = p.parse_args(argv)
    # the venv's own py-spy too, when the venv is not activated (PATH lacks its bin folder)
    pyspy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
    if pyspy is None:
        raise SeqrecError("py-spy not found: pip install py-spy")
    payloads = payloads_from_catalogue(load_catalogue(args.artifact), 500, 50, 200, 0)
    env = {"SEQREC_ARTIFACTS": str(args.artifact), "SEQREC_THREADS": "1", "SEQREC_LOG_LEVEL": "warning"}
    if args.max_wait_ms is not None:
        env["SEQREC_MAX_WAIT_MS"] = str(args.max_wait_ms)
    code = args.server_code
    if code is not None:
        env["PYTHONPATH"] = str(code.resolve())
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.out / f"profile-{args.name}.txt"
    with start_server_process(SERVICE_APP, env, cwd=code) as server:
        run_load(server.url, payloads, args.rate, 3.0, 0.5)  # warm up
        record = [pyspy, "record", "--pid", str(server.pid), "--format", "raw", "--rate", "250", "--subprocesses",
                  "--duration", str(int(args.seconds)), "--output", str(raw), "--nonblocking"]
        spy = threading.Thread(target=subprocess.run, args=(record,), kwargs={"check": True, "capture_output": True})
        spy.start()
        result = run_load(server.url, payloads, args.rate, args.seconds + 1, 0.0)
        spy.join()
    counts = shares(raw.read_text())
    total = max(sum(n for name, n in counts.items() if name != IDLE), 1)
    rows = [[name, n, "" if name == IDLE else f"{100 * n / total:.1f}%"] for name, n in counts.most_common()]
    text = "\n".join([
        f"# py-spy profile of the server: {args.name}", "",
        f"`{' '.join(['python -m offline.bench.serve.profile_serve', *argv])}`", "",
        f"Bundle {args.artifact}, {args.rate:g} r/s open-loop for {args.seconds:g} s (histories of 50-200 "
        f"items, k=10, 200 candidates); the load's p50 {result.p50_ms} ms, p99 {result.p99_ms} ms, errors "
        f"{result.errors}. Samples of non-idle server threads, bucketed by the deepest seqrec frame:", "",
        markdown_table(["where", "samples", "share"], rows), ""])
    (args.out / f"profile-{args.name}.md").write_text(text)
    print(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
