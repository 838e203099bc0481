"""A small ASGI service on ``schemaless.aio``: create an item, read it, list a user's
items newest first, a page at a time by cursor.

    pip install 'schemaless-mysql[examples]'
    schemaless local up
    python examples/items_service.py --port 8000      # SCHEMALESS_URL etc. as the CLI

    curl -X POST localhost:8000/items -d '{"user_id": "<32 hex>", "title": "hello"}'
    curl localhost:8000/items/<id>
    curl 'localhost:8000/users/<32 hex>/items?limit=20&cursor=<cursor>'

It is a plain ASGI callable (no framework): any ASGI server runs it; ``main`` uses
uvicorn.  Ids travel as 32 hex characters; errors are JSON ``{"error": ...}``.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import parse_qs

from schemaless import Entity, Index, InvalidEntity, InvalidId, InvalidQuery, new_id
from schemaless.aio import DataStore
from schemaless.ids import id_hex, parse_id

__all__ = ["BY_USER", "main", "make_app"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

BY_USER = Index("user_items", ["user_id", "created"], shard_on="user_id")
MAX_BODY = 64 * 1024


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _item(entity: Entity) -> dict[str, Any]:
    return {
        "id": id_hex(entity.id),
        "user_id": id_hex(entity["user_id"]),
        "title": entity["title"],
        "created": entity["created"],
        "version": entity.version,
    }


def _id(text: str) -> bytes:
    try:
        return parse_id(text)
    except InvalidId as exc:
        raise HttpError(400, str(exc)) from None


async def _body(receive: Receive) -> dict[str, Any]:
    chunks, size, more = [], 0, True
    while more:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > MAX_BODY:
            raise HttpError(413, "request body too large")
        chunks.append(chunk)
        more = message.get("more_body", False)
    try:
        data = json.loads(b"".join(chunks))
    except ValueError:
        raise HttpError(400, "the body must be JSON") from None
    if not isinstance(data, dict) or not isinstance(data.get("title"), str):
        raise HttpError(400, 'expected {"user_id": "<32 hex>", "title": "<text>"}')
    return data


def make_app(ds: DataStore) -> App:
    """The ASGI application serving ``ds`` (whose catalog must know ``BY_USER``)."""

    async def create(receive: Receive) -> tuple[int, Any]:
        data = await _body(receive)
        item = {
            "id": new_id(),
            "user_id": _id(str(data.get("user_id"))),
            "title": data["title"],
            "created": time.time_ns() // 1000,
        }
        version = await ds.put(item, expect_version=0)
        return 201, _item(Entity(item, version))

    async def read(item_id: str) -> tuple[int, Any]:
        entity = await ds.get(_id(item_id))
        if entity is None:
            raise HttpError(404, "no such item")
        return 200, _item(entity)

    async def list_items(user_id: str, query: dict[str, list[str]]) -> tuple[int, Any]:
        try:
            limit = min(100, max(1, int(query.get("limit", ["20"])[0])))
        except ValueError:
            raise HttpError(400, "limit must be an integer") from None
        cursor = query.get("cursor", [None])[0]
        page = await ds.query(
            BY_USER, user_id=_id(user_id), order="desc", limit=limit, cursor=cursor
        )
        return 200, {"items": [_item(e) for e in page], "cursor": page.cursor}

    async def route(scope: Scope, receive: Receive) -> tuple[int, Any]:
        method, parts = scope["method"], scope["path"].strip("/").split("/")
        query = parse_qs(scope.get("query_string", b"").decode())
        if method == "POST" and parts == ["items"]:
            return await create(receive)
        if method == "GET" and len(parts) == 2 and parts[0] == "items":
            return await read(parts[1])
        if method == "GET" and len(parts) == 3 and parts[0] == "users" and parts[2] == "items":
            return await list_items(parts[1], query)
        raise HttpError(404, "not found")

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        try:
            status, payload = await route(scope, receive)
        except HttpError as exc:
            status, payload = exc.status, {"error": str(exc)}
        except (InvalidEntity, InvalidQuery) as exc:  # e.g. a bad cursor
            status, payload = 400, {"error": str(exc)}
        body = json.dumps(payload).encode()
        headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return app


def main() -> None:
    import asyncio

    import uvicorn  # the [examples] extra

    from schemaless.connect import open_store

    parser = argparse.ArgumentParser(description="The items service (examples/items_service.py).")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    args = parser.parse_args()
    ds = DataStore.wrap(open_store(create=True))  # SCHEMALESS_URL etc., as the CLI
    asyncio.run(ds.declare_index(BY_USER))
    uvicorn.run(make_app(ds), host=args.host, port=args.port, lifespan="off")


if __name__ == "__main__":
    main()
