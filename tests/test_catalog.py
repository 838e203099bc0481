"""The catalog's named index states and its result helpers, against real servers."""

from __future__ import annotations

from typing import Any

import pytest

from schemaless import CatalogError, Index, IndexState, ServerError, new_id
from schemaless.catalog import now_us
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
