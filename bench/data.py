"""FriendFeed-like entities, deterministic from their number.

The sample entity of the 2009 post: ``id``, ``user_id`` and ``feed_id`` as 16 raw bytes,
``title`` (about 60 characters of text) and ``link`` (an URL of about 80 characters),
``published`` and ``updated`` as Unix-time integers.  Entity ``i`` is the same in every
run and every process, so the raw baseline and schemaless store the same data and a
benchmark never has to keep a million dicts in memory.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["BASE_TIME", "Dataset"]

#: ``published`` of entity 0 (the FriendFeed post's example entity's time).
BASE_TIME = 1_235_697_046
_BASE_MS = BASE_TIME * 1000

WORDS = [
    "friendfeed",
    "backend",
    "mysql",
    "schema",
    "index",
    "shard",
    "cleaner",
    "entity",
    "launch",
    "new",
    "system",
    "photo",
    "video",
    "link",
    "comment",
    "like",
    "share",
    "feed",
    "user",
    "friends",
    "today",
    "great",
    "weekend",
    "coffee",
    "music",
    "release",
    "python",
    "tornado",
    "server",
    "cache",
    "memory",
    "query",
    "table",
    "write",
    "read",
    "fast",
    "simple",
    "design",
    "idea",
    "team",
    "startup",
    "product",
    "update",
    "blog",
    "post",
    "news",
    "review",
    "open",
    "source",
    "code",
    "deploy",
    "scale",
    "million",
    "rows",
    "minutes",
    "hours",
    "lock",
    "alter",
    "column",
    "data",
    "store",
    "value",
]
_DOMAINS = (
    "friendfeed.com",
    "www.flickr.com",
    "www.youtube.com",
    "news.ycombinator.com",
    "blog.example.org",
    "twitter.com",
    "www.nytimes.com",
    "delicious.com",
)


def _words(rng: random.Random, length: int, sep: str) -> str:
    out: list[str] = []
    size = 0
    while size < length:
        word = rng.choice(WORDS)
        out.append(word)
        size += len(word) + 1
    return sep.join(out)[:length]


def entity_id(i: int, rng: random.Random) -> bytes:
    """A UUIDv7-shaped id whose time part grows with ``i`` (as new_id() would)."""
    ms = _BASE_MS + i // 4
    counter = i % 4
    rand = rng.getrandbits(62)
    value = (ms << 80) | (7 << 76) | (counter << 64) | (0b10 << 62) | rand
    return value.to_bytes(16, "big")


class Dataset:
    """Entities ``0 .. n-1`` of one benchmark run (and new ones past ``n``).

    ``users`` users and ``feeds`` feeds; entity ``i`` belongs to user ``i % users``
    (so every user has about ``n / users`` entities, spread over time).
    """

    def __init__(self, n: int, users: int | None = None, seed: int = 2009) -> None:
        self.n = n
        self.users = users or max(1, n // 40)
        self.feeds = max(1, self.users * 2)
        self.seed = seed
        self._user_ids = [random.Random(f"u{seed}:{u}").randbytes(16) for u in range(self.users)]

    def user_id(self, u: int) -> bytes:
        return self._user_ids[u % self.users]

    def entity(self, i: int) -> dict[str, Any]:
        """Entity number ``i`` (fresh dict)."""
        rng = random.Random(self.seed * 1_000_003 + i)
        key = entity_id(i, rng)
        published = BASE_TIME + i
        slug = _words(rng, rng.randint(28, 40), "-")
        link = f"http://{rng.choice(_DOMAINS)}/{2009 + i % 3}/{rng.randint(1, 12):02d}/{slug}"
        link = (link + f"-{rng.getrandbits(40):x}.html")[:96]
        title = _words(rng, rng.randint(50, 70), " ").capitalize()
        return {
            "id": key,
            "user_id": self.user_id(i),
            "feed_id": random.Random(f"f{self.seed}:{i % self.feeds}").randbytes(16),
            "title": title,
            "link": link,
            "published": published,
            "updated": published + rng.randint(0, 3600),
        }
