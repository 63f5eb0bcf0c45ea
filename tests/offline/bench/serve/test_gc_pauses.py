"""The GC-pause probe: its hook reports a collection from any Python process it is put on the path of, and
the bench reads back only the collections inside its window."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from offline.bench.serve.gc_pauses import HOOK, MARK, pauses


def test_pauses_keeps_the_probes_lines_inside_the_window() -> None:
    lines = [json.dumps({"gc_pause": g, "ms": ms, "collected": 0, "t": t})
             for g, ms, t in [(2, 150.0, 9.0), (0, 0.2, 10.5), (2, 180.0, 11.0), (1, 1.0, 13.0)]]
    text = "\n".join(["INFO: started", *lines, "a request log line"])
    assert [(p["gc_pause"], p["ms"]) for p in pauses(text, 10.0, 12.0)] == [(0, 0.2), (2, 180.0)]


def test_the_hook_times_a_full_collection_in_a_process_it_is_put_on_the_path_of(tmp_path: Path) -> None:
    (tmp_path / "sitecustomize.py").write_text(HOOK)
    code = "import gc, time; start = time.time(); gc.collect(); print(start)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    start = float(done.stdout.strip())
    found = pauses(done.stderr, start, start + 60)
    assert found, done.stderr
    assert found[0]["gc_pause"] == 2  # the explicit collection (the interpreter's exit may add another)
    assert found[0]["ms"] > 0
    assert all(line.startswith(MARK) for line in done.stderr.splitlines() if line.strip())
