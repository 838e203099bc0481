"""The catalog's named index states and its result helpers, against real servers."""

from __future__ import annotations

from typing import Any

import pytest

from schemaless import CatalogError, Index, IndexState, ServerError, new_id
from schemaless.catalog import backfill_job, now_us
from schemaless.deferrals import Deferral, Deferrals
from schemaless.results import one, scalar


def test_index_states_are_named_and_stored_as_before(make_store: Any) -> None:
    store = make_store()
    store.put({"id": new_id(), "n": 1})
    assert store.declare_index(Index("by_n", ["n"], "n")) is IndexState.BUILDING
    assert store.indexes()["by_n"].state is IndexState.BUILDING
    catalog = store.cluster.catalog
    sql = f"SELECT state FROM {catalog._t('indexes')} WHERE name = %s"
    assert catalog.server.run(sql, ("by_n",))[0] == (("building",),)  # the stored value
    with pytest.raises(CatalogError, match="unknown index state 'bogus'"):
        catalog.set_index_state("by_n", "bogus")
    assert not catalog.set_index_state("by_n", IndexState.READY, expect=IndexState.DROPPED)
    assert catalog.set_index_state("by_n", IndexState.READY, expect=IndexState.BUILDING)
    assert store.cluster.refresh().indexes["by_n"].state is IndexState.READY
    assert [s.value for s in IndexState] == ["building", "ready", "dropped"]


def test_result_shapes() -> None:
    assert one([]) is None
    assert one([(1, "a")]) == (1, "a")
    assert scalar([(7,)]) == 7
    with pytest.raises(ServerError, match="at most one row, got 2"):
        one([(1,), (2,)])
    with pytest.raises(ServerError, match="expected one row, got none"):
        scalar([])


def test_catalog_reads_by_shape(make_store: Any) -> None:
    store = make_store()
    catalog = store.cluster.catalog
    assert abs(catalog.server_now_us() - now_us()) < 60 * 10**6  # clocks of one machine
    dict_id = catalog.add_dictionary(b"zstd dictionary bytes", activate=False)
    assert catalog.dictionary(dict_id) == b"zstd dictionary bytes"
    with pytest.raises(CatalogError, match=f"dictionary {dict_id + 1} is not in the catalog"):
        catalog.dictionary(dict_id + 1)


def test_deferrals_widen_finish_only_as_read_and_hold_ready_back(make_store: Any) -> None:
    """A backfill's deferred rows: recorded with the checkpoint, one row per (source,
    target) widened by later batches; forgotten only if still the range read; an index
    with one cannot become ready; reopening, rescanning and forgetting clear them."""
    store = make_store()
    store.put({"n": 1})
    assert store.declare_index(Index("by_n", ["n"], "n")) is IndexState.BUILDING
    catalog = store.cluster.catalog
    deferrals = Deferrals(catalog)
    job = backfill_job("by_n")
    deferrals.checkpoint(job, 0, 10, False, 10, [Deferral("by_n", 0, 3, 0, 10)])
    assert catalog.checkpoints(job) == {0: (10, False, 10)}
    deferrals.checkpoint(job, 0, 25, True, 25, [Deferral("by_n", 0, 3, 10, 25)])
    (read,) = deferrals.of("by_n")
    assert read == Deferral("by_n", 0, 3, 0, 25)
    assert catalog.checkpoints(job) == {0: (25, True, 25)}
    assert not catalog.set_ready("by_n")  # a deferral is left
    deferrals.checkpoint(job, 1, 5, True, 5, [Deferral("by_n", 1, 3, 0, 5)])
    deferrals.checkpoint(job, 0, 30, True, 30, [Deferral("by_n", 0, 3, 25, 30)])  # widened
    assert not deferrals.finish(read)  # not the range read: it stays
    assert deferrals.of("by_n")[0] == Deferral("by_n", 0, 3, 0, 30)
    assert deferrals.finish(deferrals.of("by_n")[0])
    deferrals.add([Deferral("by_n", 1, 4, 3, 9)])  # no checkpoint moves
    assert deferrals.of("by_n") == [Deferral("by_n", 1, 3, 0, 5), Deferral("by_n", 1, 4, 3, 9)]
    catalog.rescan("by_n", [1])
    assert deferrals.of("by_n") == [] and catalog.checkpoints(job) == {0: (30, True, 30)}
    assert catalog.set_ready("by_n")
    deferrals.checkpoint(job, 2, 5, True, 5, [Deferral("by_n", 2, 4, 0, 5)])
    assert catalog.set_index_state("by_n", IndexState.DROPPED)
    catalog.forget_index("by_n")
    assert deferrals.of("by_n") == []
