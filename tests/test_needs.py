"""tests/needs.py: a missing program or Redis skips a test on a developer's machine and fails it in CI."""

from __future__ import annotations

import shutil

import pytest

from tests import needs


@pytest.mark.parametrize(("ci", "outcome"), [("true", pytest.fail.Exception), ("", pytest.skip.Exception)])
def test_a_missing_program_fails_in_ci_and_skips_elsewhere(ci: str, outcome: type[BaseException],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(shutil, "which", lambda *_, **__: None)
    with pytest.raises(outcome, match=r"nginx is not installed \(Debian: apt-get install nginx\)"):
        needs.program("nginx")
    monkeypatch.setattr(needs, "listening", lambda port: False)
    with pytest.raises(outcome, match=r"no Redis listening on 127\.0\.0\.1:6379"):
        needs.shared_redis()
