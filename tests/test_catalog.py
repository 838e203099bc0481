"""The catalog's named index states and its result helpers, against real servers."""

from __future__ import annotations

from typing import Any

import pytest

from schemaless import CatalogError, Index, IndexState, new_id


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
