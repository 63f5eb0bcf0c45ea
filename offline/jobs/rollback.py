"""`seqrec rollback`: point ARTIFACTS/current back at the version published before it, atomically.

The previous version is the newest complete bundle of ARTIFACTS/versions published before the one `current` names
(by the publish time each records: `offline.jobs.versions.publish_key`), or the version named. The switch is the
pipeline's own (`switch_current`: a link renamed over `current`), made holding the pipeline's lock so it never
races a publish or a prune. The catalogue journal lives beside the versions (`service.system.journal`), so the
version rolled back to serves the catalogue changes made since: retired items stay retired, added items stay
added. Running servers follow: each worker polls `current` every SEQREC_RELOAD_POLL_S seconds, and ``reload``
asks one at once (`POST /admin/reload`).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from common.errors import SeqrecError
from offline.jobs.catalog import adopt_legacy_journal
from offline.jobs.versions import CURRENT, VERSIONS, pipeline_lock, publish_key, switch_current

DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # a local server, never through a proxy


def rollback(artifacts: Path, to: str | None = None) -> tuple[str, str]:
    """Switch ``current`` to version ``to`` (default: the one published before it); returns (from, to)."""
    current = artifacts / CURRENT
    if not current.exists():
        raise SeqrecError(f"{current}: no published version to roll back from (run `seqrec pipeline` first)")
    with pipeline_lock(artifacts):
        served = current.resolve()
        versions = sorted((key, path) for path in (artifacts / VERSIONS).iterdir()
                          if (key := publish_key(path)) is not None) if (artifacts / VERSIONS).is_dir() else []
        if to is not None:
            target = next((path for _, path in versions if path.name == to), None)
            if target is None:
                names = ", ".join(path.name for _, path in versions) or "none"
                raise SeqrecError(f"{artifacts / VERSIONS / to}: not a complete published version (versions: {names})")
        else:
            older = [path for key, path in versions if path.resolve() != served and
                     key < (publish_key(served) or ("", ""))]
            if not older:
                raise SeqrecError(f"{artifacts}: no version was published before {served.name} (nothing to roll "
                                  "back to; `--to VERSION` names one)")
            target = older[-1]
        if target.resolve() == served:
            raise SeqrecError(f"{target.name} is already the current version")
        adopt_legacy_journal(artifacts)  # a journal still inside the served version: beside the versions first
        switch_current(artifacts, target)
    return served.name, target.name


def ask_reload(url: str, api_key: str | None, timeout_s: float = 120.0) -> dict[str, Any]:
    """POST ``url``/admin/reload (with the key when given); the server's answer, or SeqrecError saying why not."""
    request = urllib.request.Request(f"{url.rstrip('/')}/admin/reload", method="POST", data=b"",
                                     headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    try:
        with DIRECT.open(request, timeout=timeout_s) as response:
            body: dict[str, Any] = json.loads(response.read())
            return body
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise SeqrecError(f"{url}: POST /admin/reload answered {err.code}: {detail} (current is switched; the "
                          "servers still follow it within SEQREC_RELOAD_POLL_S)") from None
    except (OSError, ValueError) as err:
        raise SeqrecError(f"{url}: POST /admin/reload failed: {err} (current is switched; the servers still "
                          "follow it within SEQREC_RELOAD_POLL_S)") from None
