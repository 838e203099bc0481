"""examples/items_service.py served by uvicorn on 127.0.0.1, driven over real HTTP."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import socket
import urllib.error
import urllib.request
import uuid
from typing import Any

import uvicorn
from conftest import REPO, drop_datastore

from schemaless.aio import DataStore
from schemaless.local import LocalCluster

_spec = importlib.util.spec_from_file_location("items_service", REPO / "examples/items_service.py")
assert _spec is not None and _spec.loader is not None
service = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(service)


def _call(base: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(base + path, data=data, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def _scenario(base: str) -> None:
    async def call(method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return await asyncio.to_thread(_call, base, method, path, body)

    alice, bob = uuid.uuid4().hex, uuid.uuid4().hex
    created = []
    for i in range(7):
        status, item = await call("POST", "/items", {"user_id": alice, "title": f"a{i}"})
        assert status == 201 and item["title"] == f"a{i}" and item["version"] > 0, item
        created.append(item)
    assert (await call("POST", "/items", {"user_id": bob, "title": "b"}))[0] == 201

    status, item = await call("GET", f"/items/{created[2]['id']}")
    assert (status, item) == (200, created[2])
    assert (await call("GET", f"/items/{uuid.uuid4().hex}"))[0] == 404
    assert (await call("GET", "/items/nothex"))[0] == 400
    assert (await call("POST", "/items", {"user_id": alice}))[0] == 400

    titles, cursor, pages = [], None, 0
    while True:
        path = f"/users/{alice}/items?limit=3" + (f"&cursor={cursor}" if cursor else "")
        status, page = await call("GET", path)
        assert status == 200 and len(page["items"]) <= 3
        titles += [i["title"] for i in page["items"]]
        pages += 1
        cursor = page["cursor"]
        if cursor is None:
            break
    assert titles == [f"a{i}" for i in reversed(range(7))] and pages >= 3
    assert (await call("GET", f"/users/{alice}/items?cursor=garbage"))[0] == 400


def test_items_service_over_http(local_cluster: LocalCluster) -> None:
    ds = DataStore(
        local_cluster.addresses,
        [service.BY_USER],
        prefix="e_" + uuid.uuid4().hex[:12],
        shards=4,
        option_file=str(local_cluster.option_file),
    )
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    base = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = uvicorn.Server(
        uvicorn.Config(service.make_app(ds), lifespan="off", log_level="warning")
    )

    async def main() -> None:
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        try:
            for _ in range(600):
                if server.started:
                    break
                await asyncio.sleep(0.05)
            assert server.started
            await _scenario(base)
        finally:
            server.should_exit = True
            await asyncio.wait_for(serving, 30)

    try:
        asyncio.run(main())
    finally:
        sock.close()
        drop_datastore(ds.sync)
