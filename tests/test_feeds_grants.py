"""Edges and feeds under least privilege (real servers): the application's user has no
DDL, so an admin creates an edge type's or a feed's tables (``schemaless edges
create``, ``schemaless feeds create``); before that the application gets
``NotCreated`` naming the command, and nothing is created."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest
from click.testing import CliRunner
from test_cli import drop_prefix
from test_grants import User, new_users, open_as, schemaless, user_env

from schemaless import DataStore, Edges, Feeds, PermissionDenied, new_id
from schemaless.cli.main import cli
from schemaless.edges import NotCreated
from schemaless.grants import apply_grants
from schemaless.local import LocalCluster


@contextlib.contextmanager
def admin_datastore(local_cluster: LocalCluster, tag: str) -> Iterator[DataStore]:
    """A new datastore (4 shards, change feed off) opened as the cluster's admin,
    dropped at the end."""
    prefix = f"{tag}_{uuid.uuid4().hex[:8]}"
    ds = DataStore(
        local_cluster.addresses,
        prefix=prefix,
        shards=4,
        refresh_interval=0.2,
        option_file=str(local_cluster.option_file),
    )
    try:
        yield ds
    finally:
        ds.close()
        drop_prefix(local_cluster, prefix)


@pytest.fixture
def admin(local_cluster: LocalCluster) -> Iterator[DataStore]:
    """A new datastore (change feed off) opened as the cluster's admin."""
    with admin_datastore(local_cluster, "feedgrants") as ds:
        yield ds


@pytest.fixture
def app(local_cluster: LocalCluster, admin: DataStore) -> Iterator[User]:
    """The application's user with the grants of its role."""
    with new_users(local_cluster, uuid.uuid4().hex[:8], ("app",)) as made:
        apply_grants(admin, "app", made["app"].account)
        yield made["app"]


def _tables(ds: DataStore) -> set[str]:
    db = ds.cluster.current().owned_db
    rows = ds.cluster.catalog.server.run(
        "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", (db,)
    )[0]
    return {str(r[0]) for r in rows if str(r[0]).startswith(("edges__", "feed__"))}


def test_the_app_user_is_told_to_create_an_edge_type_then_uses_it(
    local_cluster: LocalCluster, admin: DataStore, app: User
) -> None:
    with open_as(local_cluster, admin, app) as ds:
        with pytest.raises(NotCreated) as refused:
            Edges(ds, "likes", inverse="liked_by")
        assert isinstance(refused.value, PermissionDenied)
        assert "`schemaless edges create likes --inverse liked_by`" in str(refused.value)
        assert _tables(admin) == set()
    runner = CliRunner(env=user_env(local_cluster, admin, app))
    denied = runner.invoke(cli, ["edges", "create", "likes", "--inverse", "liked_by"])
    assert denied.exit_code == 1 and "may not create them" in denied.stderr
    assert _tables(admin) == set()

    made = schemaless(local_cluster, admin, "edges", "create", "likes", "--inverse", "liked_by")
    assert made.exit_code == 0 and "edge type likes/liked_by: tables on 2" in made.output
    assert _tables(admin) == {"edges__likes", "edges__likes__n", "edges__liked_by"} | {
        "edges__liked_by__n"
    }
    with open_as(local_cluster, admin, app) as ds:
        likes = Edges(ds, "likes", inverse="liked_by")  # the tables exist: no DDL
        user, entry = new_id(), new_id()
        assert likes.add(user, entry) is True and likes.add(user, entry) is False
        assert (likes.count(user), likes.count_inverse(entry)) == (1, 1)
        assert likes.remove(user, entry) is True and likes.count_inverse(entry) == 0
        with pytest.raises(NotCreated, match="`schemaless edges create shares`"):
            Edges(ds, "shares")


def test_the_app_user_is_told_to_create_a_feed_then_posts_and_fans_out(
    local_cluster: LocalCluster, admin: DataStore, app: User
) -> None:
    with (
        open_as(local_cluster, admin, app) as ds,
        pytest.raises(NotCreated, match="`schemaless feeds create home`"),
    ):
        Feeds(ds, "home")  # the change feed is off: the app may not turn it on
    assert not admin.cluster.refresh().changes and _tables(admin) == set()

    made = schemaless(local_cluster, admin, "feeds", "create", "home")
    assert made.exit_code == 0 and "feed 'home': change feed on, tables on 2" in made.output
    assert admin.cluster.refresh().changes
    assert {"feed__home__inbox", "edges__home_follows", "edges__home_followers"} <= _tables(admin)
    apply_grants(admin, "app", app.account)  # the feed's subscriptions need their grant
    with open_as(local_cluster, admin, app) as ds:
        feeds = Feeds(ds, "home")
        ann, bob = new_id(), new_id()
        feeds.follow(ann, bob)
        post = {"text": "hello"}
        feeds.post(bob, post)
        assert feeds.work(once=True) == 1  # the worker runs as the app user too
        assert [e["id"] for e in feeds.home(ann)] == [post["id"]]
