"""Redis URLs as the service reads them: a Redis Cluster's `redis+cluster://` scheme (the store only, database 0),
and passwords hidden in every form of URL."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from common.redis_url import check_redis_url, cluster_node_url, redact_url
from service.http.settings import Settings


def test_a_cluster_url_names_one_node_of_it() -> None:
    assert cluster_node_url("redis+cluster://u:pw@10.0.0.1:7000") == "redis://u:pw@10.0.0.1:7000"
    assert cluster_node_url("rediss+cluster://h:7000/0") == "rediss://h:7000/0"
    assert cluster_node_url("redis://h:6379/0") is None
    assert check_redis_url("redis+cluster://h:7000", cluster=True) == "redis+cluster://h:7000"
    assert Settings(redis_url="redis+cluster://h:7000/0").redis_url == "redis+cluster://h:7000/0"


@pytest.mark.parametrize(("url", "reason"), [
    ("redis+cluster://h:7000/2", "database 0 only"),
    ("redis+cluster://h:notaport", "Port could not be cast"),
    ("redis+cluster://h:7000/abc", "is not a number"),
])
def test_bad_cluster_urls_are_refused(url: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        check_redis_url(url, cluster=True)
    with pytest.raises(ValidationError):
        Settings(redis_url=url)


def test_a_cluster_url_is_only_for_the_history_store() -> None:
    """`seqrec recommend` writes its lists with a plain client: it refuses a cluster URL in one line."""
    with pytest.raises(ValueError, match="only for the service's history store"):
        check_redis_url("redis+cluster://h:7000")


@pytest.mark.parametrize("url", ["redis://u:secretpw@h:1/0", "redis+cluster://u:secretpw@h:7000",
                                 "rediss+cluster://:secretpw@[::1]:7000/0"])
def test_passwords_are_hidden(url: str) -> None:
    shown = redact_url(url)
    assert "secretpw" not in shown
    assert ":***@" in shown
    assert shown.split("://")[0] == url.split("://")[0]


def test_wait_settings() -> None:
    assert Settings().redis_wait_replicas == 0
    assert Settings(redis_wait_replicas=1, redis_wait_ms=50).redis_wait_ms == 50
    with pytest.raises(ValidationError):
        Settings(redis_wait_replicas=-1)
