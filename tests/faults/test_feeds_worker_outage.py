"""`schemaless feeds work` rides out a server's outage: it warns, fans out to the
followers on the servers that answer, and the rest once the server is back, each post
once (it used to exit 1, then to wait, leaving every timeline unfed); `--once` still
fails."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from schemaless import DataStore, Feeds, new_id
from schemaless.errors import TransientError
from schemaless.local import LocalCluster
from schemaless.move import ShardMover

from .helpers import ids_on, open_store, scratch_cluster, wait_for

SICK = 1  # server 0 holds the catalog
CLI = "from schemaless.cli.main import cli; cli()"


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    with scratch_cluster("fwork", servers=2, durable=False) as made:
        yield made


@pytest.fixture
def store(cluster: LocalCluster) -> Iterator[DataStore]:
    ds = open_store(cluster, changes=True, read_timeout=1.0, connect_timeout=1.0)
    yield ds
    if cluster.servers[SICK].pid() is None:
        cluster.start_server(SICK)
    else:
        cluster.resume_server(SICK)  # harmless on a running server
    ds.close()


def _worker(cluster: LocalCluster, store: DataStore, *args: str) -> subprocess.Popen[bytes]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("SCHEMALESS_") or k == "SCHEMALESS_FAILPOINTS"
    }
    env |= {"SCHEMALESS_LOCAL_DIR": str(cluster.base_dir)}
    env |= {"SCHEMALESS_PREFIX": store.cluster.topology.prefix}
    cmd = [sys.executable, "-c", CLI, "feeds", "work", "home", *args]
    return subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)


def test_the_worker_resumes_after_a_server_outage(cluster: LocalCluster, store: DataStore) -> None:
    home = Feeds(store, "home")
    (fan,), (star,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    home.follow(fan, star)
    cluster.stop_server(SICK)
    port = _free_port()
    worker = _worker(cluster, store, "--metrics-port", str(port))
    try:
        time.sleep(6.0)  # open, a round failing on the stopped server, a retry or two
        assert worker.poll() is None, worker.communicate()[1].decode()[-2000:]
        assert _figures(port)["state"] == "failing"
        cluster.start_server(SICK)
        wait_for(lambda: _answers(store), 20.0, "the server to answer again")
        post = {"id": ids_on(store, SICK, 1)[0], "text": "back"}
        home.post(star, post)
        assert home.settle(30.0)  # fanned out by the worker that lived through it
        assert [e["id"] for e in home.home(fan)] == [post["id"]]
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0
    warned = err.decode()
    assert "warning: " in warned and cluster.addresses[SICK] in warned, warned
    assert "Traceback" not in warned and "password" not in warned.lower()


@pytest.mark.parametrize("how", ["paused", "stopped, the worker killed"])
def test_followers_on_live_servers_get_posts_during_an_outage(
    cluster: LocalCluster, store: DataStore, how: str
) -> None:
    """With server SICK frozen (or stopped), a post of an author on server 0 reaches
    the followers on server 0 at once, and those on SICK once it is back, each post
    once.  Killed meanwhile, a new worker still delivers it: the subscription was not
    acknowledged past a post whose fan-out was not complete."""
    home = Feeds(store, "home")
    assert home.work(once=True) >= 0  # caught up: only the posts below are new
    (star, near), (far,) = ids_on(store, 0, 2), ids_on(store, SICK, 1)
    home.follow(near, star)
    home.follow(far, star)
    worker = _worker(cluster, store)
    try:
        first = {"id": ids_on(store, 0, 1)[0], "text": "before"}
        home.post(star, first)
        for user in (near, far):  # the worker runs
            wait_for(lambda u=user: _home_ids(home, u) == [first["id"]], 30.0, "the first post")
        if how == "paused":
            cluster.pause_server(SICK)
        else:
            cluster.stop_server(SICK)
        posts = [{"id": i, "text": f"during {n}"} for n, i in enumerate(ids_on(store, 0, 2))]
        for post in posts:
            home.post(star, post)
        want = [p["id"] for p in reversed([first, *posts])]  # newest first
        # a frozen server costs the worker one read timeout (30 s), then it is marked down
        wait_for(lambda: _home_ids(home, near) == want, 75.0, "the near follower's posts")
        with pytest.raises(TransientError):
            home.home(far)  # its server is down
        if how != "paused":
            worker.kill()
            worker.communicate(timeout=30)
            cluster.start_server(SICK)
            worker = _worker(cluster, store)
        else:
            cluster.resume_server(SICK)
        wait_for(lambda: _home_ids(home, far) == want, 60.0, "the far follower's posts")
        assert home.settle(30.0)
        assert _home_ids(home, near) == want  # once each: a row written again is the same
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err.decode()[-2000:]
    if how == "paused":
        assert "warning: " in err.decode() and "Traceback" not in err.decode()


def test_after_a_move_the_worker_reads_the_shard_with_its_new_server(
    cluster: LocalCluster, store: DataStore
) -> None:
    """A shard moved from SICK to server 0 under a running worker, then SICK stopped:
    a post stored on that shard still reaches a follower on server 0 (the worker
    grouped its feeds by server at its start only, so it read the moved shard with
    SICK's and held it back until SICK came back)."""
    home = Feeds(store, "home")
    assert home.work(once=True) >= 0
    star, fan = ids_on(store, 0, 2)
    home.follow(fan, star)
    worker = _worker(cluster, store)
    try:
        first = {"id": ids_on(store, 0, 1)[0], "text": "before the move"}
        home.post(star, first)
        wait_for(lambda: _home_ids(home, fan) == [first["id"]], 30.0, "the first post")
        topo = store.cluster.current()
        shard = next(s for s in range(topo.n_shards) if topo.shard_servers[s] == SICK)
        ShardMover(store).move(shard, 0)
        time.sleep(2.0)  # the worker's map is refreshed every 0.2 s
        cluster.stop_server(SICK)
        post = {"id": _id_on_shard(store, shard), "text": "after the move"}
        home.post(star, post)
        want = [post["id"], first["id"]]
        wait_for(lambda: _home_ids(home, fan) == want, 30.0, "the post on the moved shard")
    finally:
        worker.send_signal(signal.SIGINT)
        _, err = worker.communicate(timeout=30)
        cluster.start_server(SICK)
    assert worker.returncode == 0, err.decode()[-2000:]


def _id_on_shard(store: DataStore, shard: int) -> bytes:
    while True:
        key = new_id()
        if store.cluster.shard_of_id(key) == shard:
            return key


def test_the_workers_metrics_show_an_outage_and_what_it_owes(
    cluster: LocalCluster, store: DataStore
) -> None:
    """``feeds work --metrics-port``: posts counted, nothing owed; with SICK stopped the
    state is failing and the far follower's row owed; back to running and 0 after."""
    home = Feeds(store, "home")
    assert home.work(once=True) >= 0
    (star, near), (far,) = ids_on(store, 0, 2), ids_on(store, SICK, 1)
    home.follow(near, star)
    home.follow(far, star)
    port = _free_port()
    worker = _worker(cluster, store, "--metrics-port", str(port))
    try:
        first = {"id": ids_on(store, 0, 1)[0], "text": "first"}
        home.post(star, first)
        assert home.settle(30.0)
        wait_for(lambda: _figures(port).get("posts_total", 0) >= 1, 10.0, "the post counted")
        assert _figures(port)["owed"] == 0 and _figures(port)["state"] == "running"
        cluster.stop_server(SICK)
        home.post(star, {"id": ids_on(store, 0, 1)[0], "text": "during"})
        wait_for(lambda: _figures(port)["state"] == "failing", 30.0, "the failing state")
        wait_for(lambda: _figures(port)["owed"] >= 1, 30.0, "the far follower's row owed")
        cluster.start_server(SICK)
        wait_for(lambda: _figures(port)["state"] == "running", 60.0, "running again")
        wait_for(lambda: _figures(port)["owed"] == 0, 30.0, "nothing owed")
        assert _figures(port)["posts_total"] >= 2 and _figures(port)["rounds_total"] > 2
    finally:
        worker.send_signal(signal.SIGINT)  # Ctrl-C: the round ends, the count printed
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err.decode()[-2000:]
    assert f"metrics at http://127.0.0.1:{port}/metrics" in err.decode()
    assert "feed 'home': 2 posts fanned out" in out.decode(), out.decode()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _figures(port: int) -> dict[str, Any]:
    """The feed ``home``'s figures from the worker's endpoint (``state``: the one set)."""
    url = f"http://127.0.0.1:{port}/metrics"
    try:
        text = urllib.request.urlopen(url, timeout=5).read().decode()
    except OSError:
        return {"state": None, "owed": None}
    out: dict[str, Any] = {}
    for line in text.splitlines():
        m = re.match(r"schemaless_feeds_(\w+)\{(.*)\} (\S+)$", line)
        if m is None or 'feed="home"' not in m[2]:
            continue
        if m[1] == "up":
            out["state"] = re.search(r'state="(\w+)"', m[2])[1]  # type: ignore[index]
        else:
            out[m[1]] = float(m[3])
    return out


def _home_ids(home: Feeds, user: bytes) -> list[bytes]:
    try:
        return [e["id"] for e in home.home(user, limit=50)]
    except TransientError:
        return []


def test_once_fails_with_a_typed_error(cluster: LocalCluster, store: DataStore) -> None:
    """``--once`` with a server down fans out what the others need, then exits 1 naming
    the server and saying the rest is owed."""
    home = Feeds(store, "home")
    (fan, star), (far,) = ids_on(store, 0, 2), ids_on(store, SICK, 1)
    home.follow(fan, star)
    home.follow(far, star)
    post = {"id": ids_on(store, 0, 1)[0], "text": "while down"}
    home.post(star, post)
    cluster.stop_server(SICK)
    worker = _worker(cluster, store, "--once")
    _, err = worker.communicate(timeout=60)
    assert worker.returncode == 1, err.decode()
    assert err.decode().startswith("Error: ") and cluster.addresses[SICK] in err.decode()
    assert "the rest is owed: run it again once the server answers" in err.decode()
    assert [e["id"] for e in home.home(fan)] == [post["id"]]


def _answers(store: DataStore) -> bool:
    try:
        store.get_many(ids_on(store, SICK, 1))
    except TransientError:
        return False
    return True


def test_sigterm_stops_the_worker_after_its_round(cluster: LocalCluster, store: DataStore) -> None:
    """A service manager's SIGTERM ends the worker cleanly (exit 0, its count), the posts
    acknowledged so far fanned out (it used to die with 143)."""
    home = Feeds(store, "home")
    (fan,), (star,) = ids_on(store, 0, 1), ids_on(store, SICK, 1)
    home.follow(fan, star)
    worker = _worker(cluster, store)
    try:
        post = {"id": ids_on(store, 0, 1)[0], "text": "before the stop"}
        home.post(star, post)
        assert home.settle(30.0)
    finally:
        worker.send_signal(signal.SIGTERM)
        out, err = worker.communicate(timeout=30)
    assert worker.returncode == 0, err.decode()[-2000:]
    assert "posts fanned out" in out.decode() and "Traceback" not in err.decode()
    assert post["id"] in [e["id"] for e in home.home(fan)]
