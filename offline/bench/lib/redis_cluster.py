"""A Redis Cluster of our own, and a master with one replica, for benches and tests (on free ports of 127.0.0.1).

`RedisClusterProcesses` starts ``masters x (1 + replicas)`` redis-servers with ``--cluster-enabled yes`` (no RDB
snapshots; an append-only file only when asked), joins them with ``redis-cli --cluster create``, and waits until
every node says ``cluster_state:ok``, knows every other node, and every replica's link to its master is up.
`ReplicatedRedis` is a plain master and a ``--replicaof`` replica (the WAIT bench's).
"""

from __future__ import annotations

import random
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import redis

from common.errors import SeqrecError
from offline.bench.lib.processes import free_port, stop_process


@dataclass
class Node:
    port: int
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def client(self) -> redis.Redis:
        return redis.Redis.from_url(self.url, socket_timeout=2.0, socket_connect_timeout=2.0)

    def kill(self) -> None:
        """SIGKILL: no goodbye to its clients or to the cluster."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        self.proc = None


def cluster_ports(n: int, seed: int | None = None) -> list[int]:
    """``n`` distinct ports where a cluster node can listen: the port and its cluster bus port (port + 10000) both
    free now, so at most 55535 (a random free port often is not)."""
    rng = random.Random(seed)
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randint(20000, 55535)
        if port not in ports and all(_bindable(p) for p in (port, port + 10000)):
            ports.append(port)
    return ports


def _bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _binary(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin")
    if found is None:
        raise SeqrecError(f"{name}: not found (Debian: apt-get install redis-server)")
    return found


def _launch(node: Node, folder: Path, *extra: str, appendonly: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    command = [_binary("redis-server"), "--port", str(node.port), "--bind", "127.0.0.1", "--dir", str(folder),
               "--save", "", "--appendonly", "yes" if appendonly else "no", *extra]
    with (folder / "redis.log").open("ab") as sink:
        node.proc = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)


def _wait(what: str, ready: Callable[[], bool], timeout_s: float, nodes: list[Node]) -> None:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if ready():
                return
        except (redis.RedisError, OSError):
            pass
        if time.monotonic() > deadline or any(n.proc is not None and n.proc.poll() is not None for n in nodes):
            raise SeqrecError(f"redis: {what} did not happen within {timeout_s:g} s (ports "
                              f"{', '.join(str(n.port) for n in nodes)})")
        time.sleep(0.05)


def _answers_ping(node: Node) -> bool:
    with node.client() as client:
        return bool(client.ping())


class RedisClusterProcesses:
    """``masters`` masters with ``replicas`` replicas each, in ``folder`` (one sub-folder per node).
    ``node_timeout_ms``: how long a master may be unreachable before its replica takes over."""

    def __init__(self, folder: Path, *, masters: int = 3, replicas: int = 0, node_timeout_ms: int = 5000,
                 appendonly: bool = False) -> None:
        if masters < 3:
            raise SeqrecError(f"a Redis Cluster needs at least 3 masters, got {masters}")
        self.folder, self.node_timeout_ms, self.appendonly = folder, node_timeout_ms, appendonly
        self.n_masters, self.replicas = masters, replicas
        self.nodes = [Node(port) for port in cluster_ports(masters * (1 + replicas))]

    @property
    def url(self) -> str:
        """What `SEQREC_REDIS_URL` takes: the first node's address (the client learns the others from it)."""
        return f"redis+cluster://127.0.0.1:{self.nodes[0].port}"

    def start(self, timeout_s: float = 60.0) -> RedisClusterProcesses:
        for node in self.nodes:
            _launch(node, self.folder / str(node.port), "--cluster-enabled", "yes", "--cluster-config-file",
                    f"nodes-{node.port}.conf", "--cluster-node-timeout", str(self.node_timeout_ms),
                    appendonly=self.appendonly)
        for node in self.nodes:
            _wait(f"PING on {node.port}", partial(_answers_ping, node), timeout_s, self.nodes)
        create = [_binary("redis-cli"), "--cluster", "create", *(f"127.0.0.1:{n.port}" for n in self.nodes),
                  "--cluster-replicas", str(self.replicas), "--cluster-yes"]
        done = subprocess.run(create, capture_output=True, text=True, timeout=timeout_s)
        if done.returncode != 0:
            self.stop()
            raise SeqrecError(f"`{' '.join(create)}` failed: {(done.stdout + done.stderr)[-2000:]}")
        _wait("cluster_state:ok on every node", self.healthy, timeout_s, self.nodes)
        return self

    def healthy(self) -> bool:
        """Every live node: cluster_state ok, every live node known; every live replica linked to its master."""
        live = [n for n in self.nodes if n.proc is not None]
        for node in live:
            with node.client() as client:
                info = client.execute_command("CLUSTER", "INFO")
                text = info.decode() if isinstance(info, bytes) else str(info)
                if "cluster_state:ok" not in text or f"cluster_known_nodes:{len(self.nodes)}" not in text:
                    return False
                replication = client.info("replication")
                if replication.get("role") == "slave" and replication.get("master_link_status") != "up":
                    return False
        return True

    def masters(self) -> list[Node]:
        """The nodes that are masters now (as the first live node sees it), failed ones left out."""
        live = next(n for n in self.nodes if n.proc is not None)
        with live.client() as client:
            text = client.execute_command("CLUSTER", "NODES")
        text = text.decode() if isinstance(text, bytes) else str(text)
        ports = {int(line.split()[1].split("@")[0].rsplit(":", 1)[1]) for line in text.splitlines()
                 if "master" in line.split()[2] and "fail" not in line.split()[2]}
        return [n for n in self.nodes if n.port in ports]

    def stop(self) -> None:
        for node in self.nodes:
            if node.proc is not None:
                stop_process(node.proc, grace_s=5.0)
                node.proc = None

    def __enter__(self) -> RedisClusterProcesses:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ReplicatedRedis:
    """A plain (non-cluster) master and one replica of it (``--replicaof``), started once the replica has synced."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.master, self.replica = Node(free_port()), Node(free_port())

    def start(self, timeout_s: float = 30.0) -> ReplicatedRedis:
        _launch(self.master, self.folder / "master")
        _wait("the master's PING", lambda: _answers_ping(self.master), timeout_s, [self.master])
        _launch(self.replica, self.folder / "replica", "--replicaof", "127.0.0.1", str(self.master.port))
        _wait("the replica's sync", self._linked, timeout_s, [self.master, self.replica])
        return self

    def _linked(self) -> bool:
        with self.replica.client() as client:
            return client.info("replication").get("master_link_status") == "up"

    def stop(self) -> None:
        for node in (self.replica, self.master):
            if node.proc is not None:
                stop_process(node.proc, grace_s=5.0)
                node.proc = None

    def __enter__(self) -> ReplicatedRedis:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
