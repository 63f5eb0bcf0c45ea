"""offline/bench/serve/docker_smoke.py's reading of what docker/smoke.sh --measure hands it."""

from __future__ import annotations

from pathlib import Path

from offline.bench.serve.docker_smoke import read_stats


def test_read_stats_names_each_compose_service_the_second_replica_included(tmp_path: Path) -> None:
    stats = tmp_path / "stats.tsv"
    stats.write_text("seqrec-smoke-test-api-1\t287MiB / 125GiB\t0.5%\n"
                     "seqrec-smoke-test-api-2-1\t290MiB / 125GiB\t0.4%\n"
                     "seqrec-smoke-test-lb-1\t8MiB / 125GiB\t0.0%\n"
                     "seqrec-smoke-test-redis-1\t5.5MiB / 125GiB\t0.1%\n")
    found = read_stats(stats, "seqrec-smoke-test")
    assert sorted(found) == ["api", "api-2", "lb", "redis"]
    assert found["api-2"] == {"container": "seqrec-smoke-test-api-2-1", "mem_usage_mib": 290.0, "cpu_percent": "0.4%"}
    assert found["redis"]["mem_usage_mib"] == 5.5
