from __future__ import annotations

import hashlib
import io
import shutil
import socket
import threading
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from offline.data.errors import DataError
from offline.data.readers.download import URL_ENV, download_movielens
from offline.data.readers.movielens import read_movielens

U_ITEM = "1|Toy Story (1995)|01-Jan-1995||http://imdb/x|0|0|0|1|1|1|0|0|0|0|0|0|0|0|0|0|0|0|0\n"


@dataclass
class Server:
    base_url: str
    files: dict[str, bytes] = field(default_factory=dict)  # URL path -> body
    requests: list[str] = field(default_factory=list)


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[Server]:
    monkeypatch.setenv("NO_PROXY", "127.0.0.1")
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    state = Server(base_url="")

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            state.requests.append(self.path)
            body = state.files.get(self.path)
            if body is None:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.01}, daemon=True)
    thread.start()
    state.base_url = f"http://127.0.0.1:{httpd.server_address[1]}/mirror"
    yield state
    httpd.shutdown()
    httpd.server_close()
    thread.join(timeout=5)


def make_zip(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as zf:
        for name, text in members.items():
            zf.writestr(name, text)
    return buffer.getvalue()


ML100K_ZIP = make_zip(
    {
        "ml-100k/u.data": "1\t1\t5\t874965758\n2\t1\t3\t888550871\n",
        "ml-100k/u.item": U_ITEM,
        "ml-100k/u.user": "1|24|M|technician|85711\n2|53|F|other|94043\n",
    }
)
ML100K_MD5 = hashlib.md5(ML100K_ZIP).hexdigest()


def test_download_then_reuse(server: Server, tmp_path: Path) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    cache = tmp_path / "cache"
    folder = download_movielens("ml-100k", cache, base_url=server.base_url, md5=ML100K_MD5, progress=False)
    assert folder == cache / "ml-100k"
    data = read_movielens(folder, "ml-100k")
    assert data.interactions["user_id"].to_pylist() == ["1", "2"]
    assert data.items is not None
    assert data.items["genres"].to_pylist() == [["Animation", "Children's", "Comedy"]]
    assert sorted(p.name for p in cache.iterdir()) == ["ml-100k", "ml-100k.zip"]
    assert server.requests == ["/mirror/ml-100k.zip"]

    again = download_movielens("ml-100k", cache, base_url=server.base_url, md5=ML100K_MD5, progress=False)
    assert again == folder
    assert server.requests == ["/mirror/ml-100k.zip"]


def test_unpacks_a_kept_zip_without_downloading(server: Server, tmp_path: Path) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    folder = download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5=ML100K_MD5, progress=False)
    shutil.rmtree(folder)
    assert download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5=ML100K_MD5, progress=False) == folder
    assert (folder / "u.data").is_file()
    assert len(server.requests) == 1


def test_a_fresh_download_replaces_a_folder_left_without_its_zip(server: Server, tmp_path: Path) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    folder = download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5=ML100K_MD5, progress=False)
    (folder / "stale.txt").write_text("from an older unpack")
    (tmp_path / "ml-100k.zip").unlink()
    assert download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5=ML100K_MD5, progress=False) == folder
    assert (folder / "u.data").is_file()
    assert not (folder / "stale.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["ml-100k.zip", folder.name])
    assert len(server.requests) == 2


def test_base_url_from_environment(server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    monkeypatch.setenv(URL_ENV, server.base_url + "/")
    folder = download_movielens("ml-100k", tmp_path, md5=ML100K_MD5)
    assert (folder / "u.data").is_file()
    assert server.requests == ["/mirror/ml-100k.zip"]


def test_wrong_md5_leaves_nothing(server: Server, tmp_path: Path) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    with pytest.raises(DataError, match="MD5 mismatch") as err:
        download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5="0" * 32, progress=False)
    assert err.value.path == f"{server.base_url}/ml-100k.zip"
    assert "0" * 32 in str(err.value)
    assert ML100K_MD5 in str(err.value)
    assert list(tmp_path.iterdir()) == []


def test_official_md5_is_the_default(server: Server, tmp_path: Path) -> None:
    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP
    with pytest.raises(DataError, match="expected 0e33842e24a9c977be4e0107933c0723"):
        download_movielens("ml-100k", tmp_path, base_url=server.base_url, progress=False)


def test_not_found(server: Server, tmp_path: Path) -> None:
    with pytest.raises(DataError, match="HTTP 404") as err:
        download_movielens("ml-1m", tmp_path, base_url=server.base_url, progress=False)
    assert err.value.path == f"{server.base_url}/ml-1m.zip"
    assert list(tmp_path.iterdir()) == []


def test_connection_refused(tmp_path: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    with pytest.raises(DataError, match="download failed") as err:
        download_movielens("ml-1m", tmp_path, base_url=f"http://127.0.0.1:{port}", progress=False)
    assert err.value.path == f"http://127.0.0.1:{port}/ml-1m.zip"


@pytest.mark.parametrize("member", ["../evil.txt", "/tmp/evil.txt", "ml-100k/../../evil.txt", "C:\\evil.txt"])
def test_member_outside_the_target_is_refused(server: Server, tmp_path: Path, member: str) -> None:
    archive = make_zip({"ml-100k/u.data": "1\t1\t5\t1\n", member: "gotcha"})
    server.files["/mirror/ml-100k.zip"] = archive
    cache = tmp_path / "cache"
    md5 = hashlib.md5(archive).hexdigest()
    with pytest.raises(DataError, match="unsafe member path"):
        download_movielens("ml-100k", cache, base_url=server.base_url, md5=md5, progress=False)
    assert not (tmp_path / "evil.txt").exists()
    assert sorted(p.name for p in cache.iterdir()) == ["ml-100k.zip"]


def test_not_a_zip(server: Server, tmp_path: Path) -> None:
    body = b"<html>maintenance</html>"
    server.files["/mirror/ml-100k.zip"] = body
    md5 = hashlib.md5(body).hexdigest()
    with pytest.raises(DataError, match="not a valid zip archive"):
        download_movielens("ml-100k", tmp_path, base_url=server.base_url, md5=md5, progress=False)


def test_cli_download_enforces_the_official_md5(
    server: Server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from offline.cli import main

    server.files["/mirror/ml-100k.zip"] = ML100K_ZIP  # not GroupLens' archive, so its MD5 differs
    monkeypatch.setenv(URL_ENV, server.base_url)
    cache, out = tmp_path / "cache", tmp_path / "out"
    args = ["prepare", "--dataset", "ml-100k", "--download", "--cache-dir", str(cache), "--out", str(out)]
    assert main(args) == 1
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith(f"seqrec: error: {server.base_url}/ml-100k.zip: MD5 mismatch")
    assert server.requests == ["/mirror/ml-100k.zip"]
    assert list(cache.iterdir()) == []
    assert not out.exists()
