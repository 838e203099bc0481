"""schemaless: a FriendFeed-style schemaless datastore on sharded MySQL/MariaDB.

>>> from schemaless import DataStore, Index, new_id
>>> by_user = Index(table="index_user_id", properties=["user_id"], shard_on="user_id")
>>> ds = DataStore(mysql_shards=["127.0.0.1:3306", "127.0.0.1:3307"], indexes=[by_user])
>>> user = new_id()
>>> version = ds.put({"id": new_id(), "user_id": user, "title": "hello"})
>>> [entity["title"] for entity in by_user.get_all(ds, user_id=user)]
['hello']
>>> ds.close()
"""

__version__ = "0.1.0"

from .catalog import IndexState
from .edges import Edges, NotCreated
from .entity import Entity
from .errors import (
    CatalogError,
    CatalogUnavailable,
    ConflictError,
    CorruptEntity,
    DataStoreClosed,
    EntityTooLarge,
    IndexDefinitionError,
    IndexDoesNotFit,
    IndexNotReady,
    InvalidCursor,
    InvalidEntity,
    InvalidId,
    InvalidQuery,
    OutcomeUnknown,
    PermissionDenied,
    SchemalessError,
    ServerError,
    ShardTimeout,
    ShardUnavailable,
    StorageFull,
    TableMissing,
    TransientError,
    UniqueViolation,
)
from .feed import ChangeEvent, FeedExpired
from .feeds import Feeds
from .ids import new_id, parse_id
from .index import Index
from .query import Page
from .store import DataStore

__all__ = [
    "CatalogError",
    "CatalogUnavailable",
    "ChangeEvent",
    "ConflictError",
    "CorruptEntity",
    "DataStore",
    "DataStoreClosed",
    "Edges",
    "Entity",
    "EntityTooLarge",
    "FeedExpired",
    "Feeds",
    "Index",
    "IndexDefinitionError",
    "IndexDoesNotFit",
    "IndexNotReady",
    "IndexState",
    "InvalidCursor",
    "InvalidEntity",
    "InvalidId",
    "InvalidQuery",
    "NotCreated",
    "OutcomeUnknown",
    "Page",
    "PermissionDenied",
    "SchemalessError",
    "ServerError",
    "ShardTimeout",
    "ShardUnavailable",
    "StorageFull",
    "TableMissing",
    "TransientError",
    "UniqueViolation",
    "__version__",
    "new_id",
    "parse_id",
]
