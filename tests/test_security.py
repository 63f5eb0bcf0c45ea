"""Security review, as tests: nothing is unpickled, secrets stay out of logs and answers.

(API-key enforcement: tests/service/test_auth.py; body and list limits: tests/service/test_bad_input.py;
non-root images and an unpublished Redis: tests/docker/.)"""

from __future__ import annotations

import ast
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("retriever", "ranker", "service", "offline")


def _sources() -> list[Path]:
    return [p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))]


def _calls(tree: ast.AST, name: str) -> list[ast.Call]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            func = node.func
            dotted = (f"{func.value.id}.{func.attr}" if isinstance(func, ast.Attribute)
                      and isinstance(func.value, ast.Name) else getattr(func, "id", ""))
            if dotted == name:
                found.append(node)
    return found


def _keyword(call: ast.Call, name: str) -> object:
    for keyword in call.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


def test_no_artifact_is_ever_unpickled() -> None:
    torch_loads = numpy_loads = 0
    for path in _sources():
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                names = [a.name for a in node.names] + [getattr(node, "module", None) or ""]
                assert not {"pickle", "cPickle", "joblib", "dill", "cloudpickle"} & set(names), f"{path} imports pickle"
        for call in _calls(tree, "torch.load"):
            torch_loads += 1
            assert _keyword(call, "weights_only") is True, f"{path}:{call.lineno}: torch.load without weights_only=True"
        for call in _calls(tree, "np.load"):
            numpy_loads += 1
            assert _keyword(call, "allow_pickle") is False, f"{path}:{call.lineno}: np.load without allow_pickle=False"
        for call in _calls(tree, "np.save"):
            assert _keyword(call, "allow_pickle") is False, f"{path}:{call.lineno}: np.save may write pickles"
    assert torch_loads >= 3  # the checks above looked at the real loaders (retriever, checkpoints, MLP ranker)
    assert numpy_loads >= 4
    lgbm = (ROOT / "ranker" / "lgbm.py").read_text()
    assert "model_to_string" in lgbm  # LightGBM models are stored in its text format
    assert "Booster(model_file=" in lgbm


def test_the_api_key_and_redis_password_never_reach_logs_or_answers(tmp_path: Path, bundle: Path) -> None:
    from tests.service.support import serving

    key, password = "k3y-that-must-stay-secret", "pa55word-that-must-stay-secret"
    url = f"redis://:{password}@127.0.0.1:1/0"  # nothing listens on port 1: every store call fails
    with serving(tmp_path / "server", artifacts=str(bundle), api_key=key, redis_url=url,
                 redis_timeout_ms="100") as server:
        with server.client() as client:
            answers = [
                client.post("/events", json={"user_id": "u", "item_id": "i1"}),  # 401: no key
                client.post("/events", json={"user_id": "u", "item_id": "i1"},
                            headers={"Authorization": f"Bearer {key}x"}),  # 401: wrong key
                client.post("/events", json={"user_id": "u", "item_id": "i1"},
                            headers={"Authorization": f"Bearer {key}"}),  # 503: Redis unreachable
                client.post("/recommend", json={"user_id": "u"}),  # 401: a stored history needs the key
                client.post("/recommend", json={"user_id": "u"}, headers={"Authorization": f"Bearer {key}"}),  # 503
                client.get("/readyz"), client.get("/metrics"), client.get("/openapi.json"),
            ]
        log = server.log_text()
    assert [a.status_code for a in answers[:5]] == [401, 401, 503, 401, 503]
    assert answers[5].json()["status"] == "degraded"
    assert "redis" in answers[4].json()["detail"].lower()
    for text in [log, *(a.text for a in answers)]:
        assert key not in text
        assert password not in text
    for answer in answers[:6]:  # the 503s and /readyz name neither Redis's address nor the bundle's folder
        assert "127.0.0.1:1" not in answer.text
        assert str(bundle) not in answer.text


def test_without_a_key_the_schema_says_writes_are_open(tmp_path: Path, bundle: Path) -> None:
    from tests.service.support import serving

    with serving(tmp_path / "server", artifacts=str(bundle)) as server:
        schema = httpx.get(server.url + "/openapi.json", timeout=10).json()
    assert "security" not in schema["paths"]["/events"]["post"]


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.service.support import prepare_synthetic, train_bundle

    root = tmp_path_factory.mktemp("security")
    return train_bundle(prepare_synthetic(root / "data"), root / "bundle", seed=3, ranker=False)
