"""`seqrec serve` refuses what it cannot serve with one line and exit 1, before binding a port."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from offline.cli import main


def test_serve_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--artifacts", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "no such folder" in err
    assert "Traceback" not in err


def test_serve_refuses_a_corrupt_bundle(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    weights = broken / "retriever.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["serve", "--artifacts", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "retriever.pt" in err
    assert "checksum" in err


def test_serve_names_an_invalid_setting(bundle: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SEQREC_WORKERS", raising=False)
    assert main(["serve", "--artifacts", str(bundle), "--workers", "0"]) == 1
    assert "SEQREC_WORKERS" in capsys.readouterr().err
