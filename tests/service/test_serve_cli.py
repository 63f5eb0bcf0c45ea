"""`seqrec serve` refuses what it cannot serve, and a port it cannot listen on, with one line and exit 1, before
binding a port."""

from __future__ import annotations

import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from offline.cli import main
from service.system.bundle import BundleError
from tests.service.support import RedisServer, free_port


def test_serve_refuses_a_missing_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["serve", "--artifacts", str(tmp_path / "nowhere")]) == 1
    err = capsys.readouterr().err
    assert "no such folder" in err
    assert "Traceback" not in err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_a_port_in_use_is_one_line_before_the_bundle_loads(bundle: Path, workers: str, capsys: pytest.CaptureFixture,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """It was uvicorn's log line and exit 3, after the bundle had loaded."""
    import service.system.catalog

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the bundle was loaded before the port was checked")

    monkeypatch.setattr(service.system.catalog, "load_served", never)
    monkeypatch.delenv("SEQREC_REDIS_URL", raising=False)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["serve", "--artifacts", str(bundle), "--port", str(port), "--workers", workers]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: cannot listen on 127.0.0.1:{port}: Address already in use (--host/--port, "
        "SEQREC_HOST/SEQREC_PORT)"]


def test_demo_checks_its_port_before_training(tmp_path: Path, capsys: pytest.CaptureFixture,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    import offline.jobs.pipeline

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the pipeline ran before the port was checked")

    monkeypatch.setattr(offline.jobs.pipeline, "run_pipeline", never)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert main(["demo", "--out", str(tmp_path / "demo"), "--port", str(port)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: cannot listen on 127.0.0.1:{port}: Address already in use (--host/--port)"]
    assert not (tmp_path / "demo").exists()


def test_serve_refuses_a_corrupt_bundle(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    weights = broken / "retriever.pt"
    weights.write_bytes(weights.read_bytes()[:100])
    assert main(["serve", "--artifacts", str(broken)]) == 1
    err = capsys.readouterr().err
    assert "retriever.pt" in err
    assert "checksum" in err


@pytest.mark.parametrize("workers", ["1", "2"])
def test_serve_refuses_a_corrupt_bundle_with_any_number_of_workers(bundle: Path, tmp_path: Path, workers: str,
                                                                   capsys: pytest.CaptureFixture) -> None:
    # with several workers each loaded the bundle itself: every one failed to start, and the command exited 0
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    (broken / "items.faiss").write_bytes(b"not an index")
    assert main(["serve", "--artifacts", str(broken), "--workers", workers]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"seqrec: error: {broken / 'items.faiss'}: checksum does not match the manifest (changed, truncated or "
        "corrupt)"]


@pytest.mark.parametrize(("options", "message"), [
    (["--redis-url", "localhost:6379"], "--redis-url: Value error, 'localhost:6379' is not a Redis URL: it "
                                        "must start with redis://, rediss://, unix://"),
    (["--redis-url", "http://:s3cret@cache:6379"], "--redis-url: Value error, '***@cache:6379' is not a Redis "
                                                   "URL: it must start with redis://, rediss://, unix://"),
    # a flag's error named SEQREC_PORT, a variable the user never set
    (["--port", "70000"], "--port: Input should be less than or equal to 65535"),
    (["--workers", "0"], "--workers: Input should be greater than or equal to 1"),
    # database 0, silently; then two internal errors (ValueError) at start-up
    (["--redis-url", "redis://127.0.0.1:6379/abc"], "--redis-url: Value error, the database 'abc' is not a number"),
    (["--redis-url", "redis://127.0.0.1:abc/12"], "--redis-url: Value error, Port could not be cast to integer"),
    (["--redis-url", "redis://127.0.0.1:6379/12?socket_timeout=abc"],
     "--redis-url: Value error, Invalid value for 'socket_timeout' in connection URL."),
    (["--host", ""], "--host: Value error, empty; leave it out for the default"),  # it listened on every interface
])
def test_serve_names_an_invalid_setting_alone(bundle: Path, options: list[str], message: str,
                                              capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    # a bad Redis URL was a traceback in each worker and exit 0; a bad port also listed SEQREC_WORKERS, whose
    # default depends on the other settings
    monkeypatch.delenv("SEQREC_WORKERS", raising=False)
    monkeypatch.delenv("SEQREC_REDIS_URL", raising=False)
    assert main(["serve", "--artifacts", str(bundle), *options]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seqrec: error: invalid settings: {message}")


@pytest.mark.parametrize(("variable", "value", "message"), [
    ("SEQREC_API_KEY", "   ", "SEQREC_API_KEY: Value error, starts or ends with white space, which an Authorization "
                              "header cannot carry"),  # every write was refused, whatever the request sent
    ("SEQREC_API_KEY", "key ", "SEQREC_API_KEY: Value error, starts or ends with white space"),
    ("SEQREC_RELOAD_POLL_S", "0.000001", "SEQREC_RELOAD_POLL_S: Value error, must be 0 (never) or at least 0.1"),
    ("SEQREC_PORT", "abc", "SEQREC_PORT: Input should be a valid integer"),
])
def test_a_variable_is_named_as_a_variable(bundle: Path, variable: str, value: str, message: str,
                                          capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(variable, value)
    assert main(["serve", "--artifacts", str(bundle)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"seqrec: error: invalid settings: {message}")


@pytest.mark.parametrize("key", ["clé", "my key", "tab\tkey", "k\x7fey", "ключ"])
def test_a_key_that_is_not_printable_ascii_is_refused(bundle: Path, key: str, capsys: pytest.CaptureFixture,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """SEQREC_API_KEY='clé' started, and every write was 401: curl sends the header's UTF-8 bytes, the server reads
    them as Latin-1 ('clÃ©'), and browsers refuse to send it. The key itself stays out of the message."""
    import service.system.catalog

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the key was taken: the bundle was loaded to serve")

    monkeypatch.setattr(service.system.catalog, "load_served", never)  # the old code went on to serve
    monkeypatch.setenv("SEQREC_API_KEY", key)
    assert main(["serve", "--artifacts", str(bundle)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["seqrec: error: invalid settings: SEQREC_API_KEY: Value error, has a character that is not "
                   "printable ASCII (! to ~; no spaces), which an Authorization header cannot carry as the same "
                   "text from every client"]
    assert key not in err[0]


def test_every_printable_ascii_key_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.http.settings import Settings

    key = "".join(map(chr, range(0x21, 0x7F)))
    monkeypatch.setenv("SEQREC_API_KEY", key)
    assert Settings().api_key_value() == key


def test_an_empty_variable_is_an_unset_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Compose passes unset variables empty: SEQREC_HOST= listened on every interface (asyncio reads '' so),
    SEQREC_ARTIFACTS= served '.'."""
    from service.http.settings import Settings

    for name in ("SEQREC_HOST", "SEQREC_ARTIFACTS", "SEQREC_API_KEY", "SEQREC_REDIS_URL", "SEQREC_WORKERS"):
        monkeypatch.setenv(name, "")
    settings = Settings()
    assert (settings.host, settings.artifacts, settings.api_key_value(), settings.redis_url, settings.workers) == (
        "127.0.0.1", Path("artifacts"), None, None, 1)


def test_an_env_file_that_is_not_utf8_is_one_line(bundle: Path, tmp_path: Path, capsys: pytest.CaptureFixture,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".env").write_bytes(b"SEQREC_LOG_LEVEL=\xff\xfe\n")
    monkeypatch.chdir(tmp_path)
    assert main(["serve", "--artifacts", str(bundle)]) == 1  # an internal UnicodeDecodeError before
    assert capsys.readouterr().err.strip() == "seqrec: error: .env: not UTF-8 text (byte 17); write it as UTF-8"


def test_the_log_level_is_checked_and_takes_any_case(bundle: Path, capsys: pytest.CaptureFixture,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from service.http.settings import Settings

    monkeypatch.setenv("SEQREC_LOG_LEVEL", "loud")  # it was an internal error (KeyError) inside uvicorn
    assert main(["serve", "--artifacts", str(bundle)]) == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        "seqrec: error: invalid settings: SEQREC_LOG_LEVEL: Input should be 'critical', 'error', 'warning', 'info', "
        "'debug' or 'trace'"]
    monkeypatch.setenv("SEQREC_LOG_LEVEL", "WARNING")  # uvicorn knows only lower case
    assert Settings().log_level == "warning"


def test_a_worker_that_fails_to_start_is_an_error() -> None:
    # uvicorn's supervisor stops the other workers and returns normally: exit 0 while nothing serves
    code = ("import uvicorn; from service.http.server import run_workers; from common.errors import SeqrecError\n"
            "try:\n    run_workers(uvicorn.Config('tests.service.failing_app:create_app', factory=True, workers=2, "
            "port=0))\nexcept SeqrecError as err:\n    raise SystemExit(f'error: {err}')")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "this worker cannot start" in result.stderr
    assert result.stderr.strip().splitlines()[-1] == ("error: a worker failed to start (its error is logged above); "
                                                      "nothing is serving")


def test_serve_names_an_invalid_setting(bundle: Path, capsys: pytest.CaptureFixture,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SEQREC_WORKERS", "0")
    assert main(["serve", "--artifacts", str(bundle)]) == 1
    assert "SEQREC_WORKERS" in capsys.readouterr().err  # the variable, when the variable set it


def test_a_redis_that_refuses_the_configuration_is_one_line_before_the_bundle_loads(
        bundle: Path, redis_server: RedisServer, capsys: pytest.CaptureFixture,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A database number Redis lacks, a password it rejects, an ACL without the prefix's keys: every store call
    would fail the same way (500s with a traceback on /events before; 503s now, tests/service/test_redis.py), so
    `seqrec serve` stops on them at once. A Redis that is only down is a warning, and the service starts."""
    import redis

    import service.system.catalog

    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("the bundle was loaded before Redis was checked")

    monkeypatch.setattr(service.system.catalog, "load_served", never)
    port = redis_server.port
    admin = redis.Redis(port=port)
    try:
        admin.execute_command("ACL", "SETUSER", "narrow", "on", ">pw", "~other:*", "+@all")
        admin.execute_command("ACL", "SETUSER", "wide", "on", ">pw", "~seqrec:*", "+@all")
        cases = [
            (f"redis://127.0.0.1:{port}/99", f"redis://127.0.0.1:{port}/99", "DB index is out of range"),
            (f"redis://narrow:wrong@127.0.0.1:{port}/0", f"redis://narrow:***@127.0.0.1:{port}/0",
             "invalid username-password pair or user is disabled."),
            (f"redis://narrow:pw@127.0.0.1:{port}/0", f"redis://narrow:***@127.0.0.1:{port}/0",
             "no permissions"),  # NOPERM's wording differs between Redis releases
        ]
        for url, shown, reason in cases:
            assert main(["serve", "--artifacts", str(bundle), "--port", "0", "--redis-url", url]) == 1
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1, err
            assert err[0].startswith(f"seqrec: error: Redis at {shown} refuses this server: "), err
            assert reason in err[0], err
            assert err[0].endswith(" (--redis-url, SEQREC_REDIS_URL, SEQREC_REDIS_PREFIX)")
            assert ":pw@" not in err[0]
        # the same ACL user with its own prefix's keys, and a Redis that is down: no refusal, the bundle loads
        def reached(*args: object, **kwargs: object) -> None:
            raise BundleError("the bundle's load is reached")

        monkeypatch.setattr(service.system.catalog, "load_served", reached)
        for url in (f"redis://wide:pw@127.0.0.1:{port}/0", f"redis://127.0.0.1:{free_port()}/0"):
            assert main(["serve", "--artifacts", str(bundle), "--port", "0", "--redis-url", url]) == 1
            assert capsys.readouterr().err.strip().splitlines()[-1] == "seqrec: error: the bundle's load is reached"
    finally:
        admin.close()
