"""Text reports of ``verify``: counts per index and shard, and a few examples."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Any

from schemaless.ids import id_hex
from schemaless.index import Index

from .verify import Diff, RowKey

__all__ = ["diff_lines"]

_KINDS = ("missing", "extra", "behind")


def _values(index: Index, values: tuple[Any, ...]) -> str:
    """A row's values by property, as the entity has them (``auto`` columns decoded)."""
    try:
        text = repr(index.readable(values))
    except (TypeError, ValueError):  # a row that does not decode: as stored
        text = repr(values)
    return text if len(text) <= 60 else text[:57] + "..."


def _example(index: Index, kind: str, key: RowKey, detail: Any) -> str:
    shard, values, entity_id = key
    if kind == "missing":
        what = f"entity version {detail}"
    elif kind == "extra":
        what = f"row version {detail}"
    else:
        what = f"row version {detail[0]} < entity version {detail[1]}"
    shown = _values(index, values)
    return f"    {kind:<7} shard {shard:<4} entity {id_hex(entity_id)} {shown}: {what}"


def diff_lines(index: Index, diff: Diff, examples: int = 3) -> Iterable[str]:
    """Lines describing one index's differences (one line if it is clean)."""
    name = index.name
    counts = diff.summary()
    unindexable = f"; {counts['unindexable']} entities unindexable" if diff.unindexable else ""
    if diff.unverified:
        pending = ", ".join(map(str, diff.unverified))
        unindexable += f"; logical shard(s) {pending} not verified (server unavailable)"
    if diff.clean:
        yield f"index {name}: clean{unindexable}"
        return
    total = sum(counts[k] for k in _KINDS)
    detail = ", ".join(f"{k} {counts[k]}" for k in _KINDS)
    yield f"index {name}: {total} differences ({detail}){unindexable}"
    per_shard: dict[str, Counter[int]] = {
        "missing": Counter(k[0] for k in diff.missing),
        "extra": Counter(k[0] for k in diff.extra),
        "behind": Counter(k[0] for k in diff.behind),
    }
    shards = sorted(set().union(*(c.keys() for c in per_shard.values())))
    for shard in shards:
        yield "  shard {}: {}".format(
            shard, ", ".join(f"{k} {per_shard[k][shard]}" for k in _KINDS)
        )
    found: dict[str, dict[RowKey, Any]] = {
        "missing": dict(diff.missing),
        "extra": dict(diff.extra),
        "behind": dict(diff.behind),
    }
    for kind in _KINDS:
        for key in sorted(found[kind], key=lambda k: (k[0], k[2]))[:examples]:
            yield _example(index, kind, key, found[kind][key])
