"""Publish broken bundles under steady load: each is refused with its reason, the old model keeps serving.

    python -m offline.bench.faults.bad_push --artifacts /tmp/rel-artifacts --rate 50 \
        [--out docs/results/reliability/bad-push.json]

Takes the two newest versions of ARTIFACTS (a pipeline's output; `seqrec pipeline --config CONFIG`
trains what is missing) as v1 and v2, and serves v1 from a temporary artifacts folder whose
`current` it switches. Under an open-loop Poisson load of history-carrying requests it publishes,
one after the other, a truncated bundle (retriever.pt cut in half), a checksum-mismatched one (a
byte of items.faiss flipped), a shape-mismatched one (d_model doubled in config.json, checksum
rewritten) and an incomplete one (items.faiss missing): each time `current` is switched to it,
POST /admin/reload must answer 409 with the reason, and `current` is switched back. Then v2 is
published the same way and must answer 200. Prints a JSON report (`offline.bench.faults.bad_push.bad_push`;
also written to --out) and exits 1 when a target is missed: every broken bundle refused with its
reason, every request answered 2xx, by v1 until the good push and by v2 after it, no traceback in
the server's log.
`tests/service/test_faults.py` runs the same scenario in small.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from common.errors import SeqrecError
from offline.bench.faults.reliability import (
    Started,
    check_log,
    ensure_versions,
    history_calls,
    print_report,
    scenario_parser,
    service_env,
    warmed_service,
)
from offline.bench.lib.load import Answer, LoadRun, Marks, get_json, open_loop, summary
from offline.bench.lib.payloads import load_catalogue

if TYPE_CHECKING:
    import aiohttp

BREAKS: dict[str, str] = {  # kind -> what the refusal must say (after the file's path)
    "truncated": "retriever.pt: checksum does not match the manifest",
    "checksum": "items.faiss: checksum does not match the manifest",
    "shapes": "retriever.pt: does not fit the config's model",
    "incomplete": "items.faiss: listed in the manifest but missing",
}


def broken_copy(bundle: Path, dest: Path, kind: str) -> str:
    """Copy ``bundle`` to ``dest`` and break it; returns the reason a reload must give.

    truncated: retriever.pt cut to half its size (an interrupted copy). checksum: one byte of
    items.faiss flipped, the size unchanged. shapes: config.json's d_model doubled with its checksum
    rewritten, so every checksum passes and only loading the weights can tell. incomplete: items.faiss
    missing."""
    if kind not in BREAKS:
        raise SeqrecError(f"unknown break {kind!r}; expected one of {', '.join(BREAKS)}")
    shutil.copytree(bundle, dest)
    return break_bundle(dest, kind)


def break_bundle(dest: Path, kind: str) -> str:
    """Break the bundle in ``dest`` in place, as `broken_copy` describes; returns what refuses it."""
    from common.atomic import sha256_file

    if kind not in BREAKS:
        raise SeqrecError(f"unknown break {kind!r}; expected one of {', '.join(BREAKS)}")
    if kind == "truncated":
        weights = dest / "retriever.pt"
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    elif kind == "checksum":
        index = dest / "items.faiss"
        data = bytearray(index.read_bytes())
        data[len(data) // 2] ^= 0xFF
        index.write_bytes(bytes(data))
    elif kind == "shapes":
        config_file, manifest_file = dest / "config.json", dest / "manifest.json"
        config = json.loads(config_file.read_text())
        config["model"]["d_model"] *= 2
        config_file.write_text(json.dumps(config, indent=2))
        manifest = json.loads(manifest_file.read_text())
        manifest["sha256"]["config.json"] = sha256_file(config_file)
        manifest_file.write_text(json.dumps(manifest, indent=2))
    else:
        (dest / "items.faiss").unlink()
    return BREAKS[kind]


def bundle_version(bundle: Path) -> str:
    from retriever.artifact import read_manifest

    return read_manifest(bundle).version


def bad_push(url: str, artifacts: Path, good: Path, broken: Mapping[str, tuple[Path, str]], new: Path,
             catalogue: Sequence[str], *, rate: float, lead_s: float = 2.0, gap_s: float = 1.0, tail_s: float = 3.0,
             seed: int = 0, timeout_s: float = 2.0, headers: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Under a steady load of history-carrying requests to the service on ``artifacts`` (serving ``good``):
    for each broken bundle, point ``current`` at it, POST /admin/reload (which must answer 409 with the
    expected reason), point ``current`` back; then publish ``new`` the same way (200). Every request
    must be answered 2xx, by ``good`` until the good push and by ``new`` once its reload returned."""
    from offline.jobs.versions import switch_current

    v_good, v_new = bundle_version(good), bundle_version(new)
    served = get_json(url, "/readyz")["model_version"]
    if served != v_good:
        raise SeqrecError(f"the service serves {served}, not {v_good} ({good}); point {artifacts}/current at it")
    calls = history_calls(catalogue, seed, keep=True)
    reload_timeout = _reload_timeout()

    async def reload(session: aiohttp.ClientSession) -> tuple[int, dict[str, Any], float]:
        start = time.perf_counter()
        async with session.post("/admin/reload", timeout=reload_timeout) as response:
            return response.status, await response.json(), time.perf_counter() - start

    async def push(session: aiohttp.ClientSession, marks: Marks) -> dict[str, Any]:
        pushes: dict[str, Any] = {}
        await asyncio.sleep(lead_s)
        for name, (path, reason) in broken.items():
            switch_current(artifacts, path)
            try:
                status, body, seconds = await reload(session)
            finally:
                switch_current(artifacts, good)
            detail = str(body.get("detail", ""))
            pushes[name] = {"http_status": status, "detail": detail, "expected_reason": reason,
                            "seconds": round(seconds, 3),
                            # the file is named, not the folder it lives in (no path reaches a client)
                            "refused_with_reason": status == 409 and reason in detail
                            and str(path.resolve()) not in detail
                            and detail.startswith(f"bundle refused, still serving {v_good}: ")}
            await asyncio.sleep(gap_s)
        switch_current(artifacts, new)
        marks["good_push"] = time.perf_counter()
        status, body, seconds = await reload(session)
        marks["reloaded"] = time.perf_counter()
        pushes["good"] = {"http_status": status, "seconds": round(seconds, 3), "answer": body}
        return pushes

    run = open_loop(url, lambda i: calls[i % len(calls)], rate, action=push, tail_s=tail_s, seed=seed,
                    timeout_s=timeout_s, headers=headers)
    pushes: dict[str, Any] = run.result
    before = Counter(_version(a) for a in run.answers if a.done < run.marks["good_push"])
    after = Counter(_version(a) for a in run.answers if a.sent >= run.marks["reloaded"])
    checks = _checks(run, pushes, list(broken), before, after, v_good, v_new)
    return {"scenario": "bad_push", "rate": rate, "good": v_good, "new": v_new, "pushes": pushes,
            "load": summary(run.answers), "versions_before_good_push": dict(before),
            "versions_after_reload": dict(after), "checks": checks, "passed": all(checks.values())}


def _version(a: Answer) -> str | None:
    return str(json.loads(a.body)["model_version"]) if a.error is None and a.body else None


def _checks(run: LoadRun, pushes: Mapping[str, Any], broken: Sequence[str], before: Counter[str | None],
            after: Counter[str | None], v_good: str, v_new: str) -> dict[str, bool]:
    good_push, answer = pushes["good"], pushes["good"]["answer"]
    return {
        **{f"{name}_refused_with_reason": pushes[name]["refused_with_reason"] for name in broken},
        "good_bundle_reloaded": good_push["http_status"] == 200 and answer.get("model_version") == v_new
        and answer.get("previous_version") == v_good,
        "old_model_served_until_good_push": set(before) == {v_good},
        "new_model_served_after_reload": set(after) == {v_new},
        "no_failed_request": all(a.error is None for a in run.answers),
    }


def _reload_timeout() -> aiohttp.ClientTimeout:
    import aiohttp

    return aiohttp.ClientTimeout(total=300)  # loading and smoke-testing a real bundle takes seconds, not 2


def parser() -> argparse.ArgumentParser:
    parser = scenario_parser(__doc__, threads_help="training threads, when versions must be trained")
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second")
    parser.add_argument("--lead", type=float, default=5.0, help="seconds of load before the first push")
    parser.add_argument("--gap", type=float, default=3.0, help="seconds of load between pushes")
    parser.add_argument("--tail", type=float, default=10.0, help="seconds of load after the good push")
    return parser


def main(argv: list[str] | None = None) -> int:
    started = Started()
    argv = sys.argv[1:] if argv is None else argv
    args = parser().parse_args(argv)
    from offline.jobs.versions import switch_current

    v1, v2 = ensure_versions(args.artifacts, args.config, 2, args.threads)[-2:]
    catalogue = load_catalogue(v1)
    with tempfile.TemporaryDirectory(prefix="seqrec-bad-push-") as tmp:
        root = Path(tmp)
        broken = {kind: (root / kind, broken_copy(v1, root / kind, kind)) for kind in BREAKS}
        switch_current(root, v1)
        with warmed_service(service_env(root), catalogue, min(args.rate, 50)) as server:
            report = bad_push(server.url, root, v1, broken, v2, catalogue.tolist(), rate=args.rate,
                              lead_s=args.lead, gap_s=args.gap, tail_s=args.tail, seed=args.seed)
            check_log(report, server)
    return print_report(report, "offline.bench.faults.bad_push", argv, args.out, **started.head(),
                        v1=str(v1), v2=str(v2))


if __name__ == "__main__":
    raise SystemExit(main())
