"""Throughput of 1, 2, ... service replicas behind nginx running docker/nginx.conf.

    python -m offline.bench.serve.replicas --artifacts /tmp/replica-artifacts --replicas 1,2 --duration 20 \
        --out replicas.json

For each replica count N: starts N service processes on free local ports (`service.http.app:create_app`
under uvicorn, one worker and SEQREC_THREADS=1 each, as in the api container), then one nginx on
docker/nginx.conf with its upstream `server api:8000 resolve` replaced by those N ports (there is
no Docker DNS on the host; the rest of the file is used as it is), and waits for /readyz through
nginx. Then `offline.bench.lib.sweeps.max_sustained_rate` steps the offered open-loop rate up through
--rates against nginx until a rate misses p99 <= 50 ms or has an error. Prints, per N, the highest
rate held, p50/p99 there, the errors, how the requests were split across the replicas (from each
replica's /metrics), and every run; writes it all as JSON to --out.

The load client, nginx and the replicas share this machine's cores: on a 2-core machine two
replicas compete with the client and nginx for the second core, so compare counts on one machine
only, and read `client CPU` in the table of runs.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from offline.bench.lib.load import P99_TARGET_MS, LoadResult, run_load
from offline.bench.lib.payloads import load_catalogue, payloads_from_catalogue
from offline.bench.lib.processes import (
    DIRECT,
    SERVICE_APP,
    ServerError,
    free_port,
    is_ready,
    start_server_process,
    stop_process,
)
from offline.bench.lib.sweeps import max_sustained_rate, report_table
from offline.cli.common import SEED, configure_logging
from offline.tables import markdown_table

NGINX_CONF = Path(__file__).resolve().parents[3] / "docker" / "nginx.conf"
UPSTREAM_SERVER = re.compile(r"^(?P<indent>[ \t]*)server api:8000(?: resolve)?;[ \t]*$", re.MULTILINE)
TEMP_PATHS = ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")

log = logging.getLogger("bench.replicas")


# --------------------------------------------------------------------------- nginx


def nginx_version(binary: str = "nginx") -> tuple[int, ...]:
    """(1, 22, 1) from `nginx -v` (which prints to stderr)."""
    out = subprocess.run([binary, "-v"], capture_output=True, text=True, check=True, timeout=10)
    found = re.search(r"nginx/(\d+(?:\.\d+)*)", out.stderr + out.stdout)
    if found is None:
        raise ServerError(f"cannot read a version from `{binary} -v`: {out.stderr.strip()}")
    return tuple(int(part) for part in found.group(1).split("."))


def local_nginx_config(text: str, servers: Sequence[str], listen: str, workdir: Path, *,
                       resolve: bool = False, resolver: str = "127.0.0.1") -> str:
    """docker/nginx.conf for a host without Docker: the upstream's `server api:8000 resolve` becomes
    one `server` line per address in ``servers`` (with `resolve` only if asked), `listen 8000` becomes
    ``listen``, the resolver 127.0.0.11 becomes ``resolver``, and nginx's temporary files go to
    ``workdir``. Raises ValueError when the file no longer has a line to replace."""

    def upstream(match: re.Match[str]) -> str:
        suffix = " resolve" if resolve else ""
        return "\n".join(f"{match.group('indent')}server {server}{suffix};" for server in servers)

    replacements: list[tuple[re.Pattern[str], str | Callable[[re.Match[str]], str]]] = [
        (UPSTREAM_SERVER, upstream),
        (re.compile(r"^(\s*)listen 8000;", re.MULTILINE), rf"\g<1>listen {listen};"),
        (re.compile(r"^(\s*)resolver 127\.0\.0\.11\b", re.MULTILINE), rf"\g<1>resolver {resolver}"),
        (re.compile(r"^http \{$", re.MULTILINE),
         "http {\n" + "".join(f"    {kind}_temp_path {workdir / kind};\n" for kind in TEMP_PATHS)),
    ]
    for pattern, replacement in replacements:
        text, count = pattern.subn(replacement, text)
        if count != 1:
            raise ValueError(f"docker/nginx.conf: expected one line matching {pattern.pattern!r}, found {count}")
    return text


def nginx_command(conf: Path, workdir: Path, binary: str = "nginx") -> list[str]:
    """Foreground nginx with its prefix, pid file and start-up error log in ``workdir``."""
    return [binary, "-p", f"{workdir}/", "-c", str(conf), "-e", str(workdir / "error.log"),
            "-g", f"daemon off; pid {workdir / 'nginx.pid'};"]


@contextlib.contextmanager
def start_nginx(servers: Sequence[str], binary: str = "nginx", ready_timeout_s: float = 30.0) -> Iterator[str]:
    """nginx on docker/nginx.conf in front of ``servers`` on a free local port; yields its URL once
    /readyz answers through it; stops it (SIGTERM, then SIGKILL after 10 s) on exit."""
    port = free_port()
    with tempfile.TemporaryDirectory(prefix="seqrec-nginx-") as tmp:
        workdir = Path(tmp)
        workdir.chmod(0o755)  # started as root, the workers run as nobody and write temp files here
        conf = workdir / "nginx.conf"
        conf.write_text(local_nginx_config(NGINX_CONF.read_text(), servers, f"127.0.0.1:{port}", workdir))
        output = workdir / "nginx.out"
        with output.open("wb") as sink:  # a file, not a pipe: the access log can never block nginx
            process = subprocess.Popen(nginx_command(conf, workdir, binary), stdout=sink, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        url = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + ready_timeout_s
            while not is_ready(url):
                if process.poll() is not None or time.monotonic() > deadline:
                    errors = (workdir / "error.log").read_text(errors="replace") if (workdir / "error.log").exists() \
                        else ""
                    raise ServerError(f"nginx did not answer {url}/readyz (exit code {process.poll()}):\n"
                                       f"{errors[-2000:]}{output.read_text(errors='replace')[-2000:]}")
                time.sleep(0.1)
            log.info("nginx ready at %s in front of %s", url, ", ".join(servers))
            yield url
        finally:
            stop_process(process)


# --------------------------------------------------------------------------- measuring


def recommend_requests(url: str) -> float:
    """POST /recommend answers a replica has counted (all statuses), from its /metrics."""
    from prometheus_client.parser import text_string_to_metric_families

    with DIRECT.open(f"{url}/metrics", timeout=5.0) as response:
        text = response.read().decode()
    return sum(sample.value for family in text_string_to_metric_families(text) for sample in family.samples
               if sample.name == "seqrec_requests_total" and sample.labels.get("route") == "/recommend")


def measure(n_replicas: int, payloads: list[dict[str, Any]], env: dict[str, str], args: argparse.Namespace,
            rates: list[float]) -> tuple[dict[str, Any], list[LoadResult]]:
    """Start N replicas and nginx, sweep the rates through nginx -> (the JSON row, every run)."""
    label = f"{n_replicas} replica{'s' if n_replicas > 1 else ''}"
    options = {"arrivals": args.arrivals, "timeout_s": args.timeout, "label": label}
    with contextlib.ExitStack() as stack:
        replicas = [stack.enter_context(start_server_process(SERVICE_APP, env)) for _ in range(n_replicas)]
        lb = stack.enter_context(start_nginx([r.url.removeprefix("http://") for r in replicas], args.nginx))
        run_load(lb, payloads, min(rates), 2.0, 0.5, args.seed, **options)  # warm every replica up
        before = [recommend_requests(r.url) for r in replicas]
        sustained = max_sustained_rate(lb, payloads, rates, args.duration, args.warmup, args.seed,
                                       p99_ms=args.p99_ms, **options)
        split = [int(recommend_requests(r.url) - b) for r, b in zip(replicas, before, strict=True)]
    passed = [r for r in sustained.results if r.passes(args.p99_ms)]
    top = max(passed, key=lambda r: r.rate) if passed else None
    failed = next((r for r in sustained.results if not r.passes(args.p99_ms)), None)
    return {"replicas": n_replicas, "max_rate": sustained.rate, "top": top.to_dict() if top else None,
            "stopped_at": failed.to_dict() if failed else None, "requests_per_replica": split,
            "sweep": [r.to_dict() for r in sustained.results]}, sustained.results


def summary_table(rows: Sequence[dict[str, Any]], p99_ms: float) -> str:
    head = ["replicas", f"max rate r/s (p99 <= {p99_ms:g} ms, 0 errors)", "p50 ms", "p99 ms", "throughput r/s",
            "errors in sweep", "next rate: p99 ms / errors", "sweep requests per replica"]
    lines = []
    for row in rows:
        top, failed = row["top"], row["stopped_at"]
        errors = sum(run["errors"] for run in row["sweep"])
        stop = "none (top of --rates)" if failed is None else \
            f"{failed['rate']:g} r/s: {failed['p99_ms'] or float('nan'):.2f} / {failed['errors']}"
        lines.append([str(row["replicas"]), "none" if top is None else f"{top['rate']:g}",
                      "" if top is None else f"{top['p50_ms']:.2f}", "" if top is None else f"{top['p99_ms']:.2f}",
                      "" if top is None else f"{top['throughput']:.1f}", str(errors), stop,
                      " / ".join(str(n) for n in row["requests_per_replica"])])
    return markdown_table(head, lines) + "\n"


# --------------------------------------------------------------------------- main


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--artifacts", type=Path, required=True, help="artifacts folder (its current) or a bundle")
    parser.add_argument("--replicas", default="1,2", help="replica counts to measure, e.g. 1,2,4")
    parser.add_argument("--rates", default="20,40,60,80,100,150,200,250,300,400",
                        help="offered rates (requests/s), stepped up until one misses the target")
    parser.add_argument("--duration", type=float, default=20.0, help="measured seconds per rate")
    parser.add_argument("--warmup", type=float, default=2.0, help="unmeasured seconds before each rate")
    parser.add_argument("--p99-ms", type=float, default=P99_TARGET_MS, help="the p99 target")
    parser.add_argument("--arrivals", choices=["poisson", "uniform"], default="poisson")
    parser.add_argument("--timeout", type=float, default=2.0, help="client timeout per request (s)")
    parser.add_argument("--requests", type=int, default=500, help="distinct request bodies, sent in turn")
    parser.add_argument("--min-len", type=int, default=50, help="shortest history in a request")
    parser.add_argument("--max-len", type=int, default=200, help="longest history in a request")
    parser.add_argument("--seed", type=SEED, default=0)
    parser.add_argument("--redis-url", default=None,
                        help="history store shared by the replicas, e.g. redis://127.0.0.1:6379/15 (requests carry "
                             "their histories, so it is only pinged by /readyz); default: each replica's in-process "
                             "store")
    parser.add_argument("--nginx", default="nginx", help="nginx binary (apt-get install nginx)")
    parser.add_argument("--out", type=Path, default=Path("replicas.json"), help="JSON report")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    configure_logging(logging.INFO)

    counts = [int(n) for n in args.replicas.split(",") if n.strip()]
    rates = sorted({float(r) for r in args.rates.split(",") if r.strip()})
    if not counts or min(counts) < 1 or not rates or min(rates) <= 0:
        parser.error("--replicas needs counts >= 1 and --rates positive numbers")
    if shutil.which(args.nginx) is None:
        parser.error(f"{args.nginx}: not found; install nginx (Debian: apt-get install -y nginx)")

    from service.system.loader import resolve_bundle

    bundle = resolve_bundle(args.artifacts)
    item_ids = load_catalogue(bundle)
    payloads = payloads_from_catalogue(item_ids, args.requests, min(args.min_len, len(item_ids)),
                                       min(args.max_len, len(item_ids)), args.seed)
    env = {"SEQREC_ARTIFACTS": str(args.artifacts), "SEQREC_THREADS": "1", "SEQREC_WORKERS": "1",
           "SEQREC_LOG_LEVEL": "warning"}
    if args.redis_url:
        env |= {"SEQREC_REDIS_URL": args.redis_url, "SEQREC_REDIS_PREFIX": f"bench-replicas-{os.getpid()}:"}

    rows, runs = [], []
    for n in counts:
        row, results = measure(n, payloads, env, args, rates)
        rows.append(row)
        runs.extend(results)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
    report = {"settings": settings, "bundle": str(bundle), "catalogue": len(item_ids),
              "nginx": ".".join(map(str, nginx_version(args.nginx))), "cpus": os.cpu_count(), "results": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2))
    print(f"# replicas behind nginx ({report['nginx']}, docker/nginx.conf), {os.cpu_count()} CPUs\n")
    print(f"Open-loop {args.arrivals} arrivals, {args.duration:g} s per rate after {args.warmup:g} s warm-up; "
          f"histories of {args.min_len}-{args.max_len} catalogue items ({len(item_ids)} items); each replica: "
          f"1 uvicorn worker, 1 torch thread; store: {args.redis_url or 'in-process'}.\n")
    print(summary_table(rows, args.p99_ms))
    print("## Every run\n")
    print(report_table(runs))
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
