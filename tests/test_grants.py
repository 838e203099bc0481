"""Least-privilege grants (schemaless.grants, ``schemaless grants``) on real servers.

Three users with random names and passwords on both servers of the session cluster,
each given the grants of its role: the application (no DDL), the Cleaner (no writes
to entity bodies, no deletes of entities) and the admin.  Whatever a user tries
outside its grant fails with ``PermissionDenied`` naming the privilege.
"""

from __future__ import annotations

import contextlib
import re
import secrets
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import MySQLdb
import pytest
from click.testing import CliRunner, Result
from conftest import shard_rows
from test_cleaner import plant
from test_cli import cluster_env, drop_prefix

from schemaless import (
    DataStore,
    Index,
    PermissionDenied,
    SchemalessError,
    ShardUnavailable,
    TableMissing,
)
from schemaless.cleaner import Cleaner, diff_indexes
from schemaless.cleaner.main import main as cleaner_main
from schemaless.cli.main import cli
from schemaless.deferrals import Deferral, Deferrals
from schemaless.grants import (
    GrantError,
    account,
    apply_grants,
    check_account,
    grant_plan,
    grant_statements,
)
from schemaless.ids import new_id
from schemaless.local import LocalCluster
from schemaless.move import ShardMover
from schemaless.names import quote
from schemaless.owned import admin
from schemaless.schema import canary_db
from schemaless.translate import translate

BY_LINK = Index("by_link", {"link": "str(100)"})
BY_N = Index("by_n", {"n": "int"})
#: A key too long to name the owner's version as well: its table keeps the update trigger
WIDE = Index("by_wide", {"w": "str(763)"})
HOSTILE = ["a'b", "a`b", "a;b", "a b", "", "a\\b", "x'@'%", 'a"b', "a/*", "é", "-x", "a\n"]


@dataclass(frozen=True)
class User:
    name: str
    password: str

    @property
    def account(self) -> str:
        return account(self.name, "%")


def _admin(cluster: LocalCluster, port: int) -> Any:
    return MySQLdb.connect(
        host="127.0.0.1",
        port=port,
        read_default_file=str(cluster.option_file),
        read_default_group="client",
        autocommit=True,
    )


def _users_exist(cluster: LocalCluster, name: str) -> list[int]:
    counts = []
    for server in cluster.servers:
        conn = _admin(cluster, server.port)
        try:
            cur = conn.cursor()
            cur.execute("SELECT COUNT(*) FROM mysql.user WHERE user = %s", (name,))
            counts.append(int(cur.fetchone()[0]))
        finally:
            conn.close()
    return counts


@pytest.fixture(scope="module")
def users(local_cluster: LocalCluster) -> Iterator[dict[str, User]]:
    """``app``, ``cleaner`` and ``admin`` users (random names and passwords) on both
    servers, without any privilege yet; dropped at the end."""
    with new_users(local_cluster, uuid.uuid4().hex[:8], ("app", "cleaner", "admin")) as made:
        yield made


@contextlib.contextmanager
def new_users(cluster: LocalCluster, tag: str, roles: tuple[str, ...]) -> Iterator[dict[str, User]]:
    """A user per role (``<role>_<tag>``, random password) on every server, without any
    privilege yet; dropped at the end."""
    made = {role: User(f"{role}_{tag}", secrets.token_urlsafe(18)) for role in roles}
    conns = [_admin(cluster, s.port) for s in cluster.servers]
    try:
        for conn in conns:
            for user in made.values():
                conn.cursor().execute(
                    "CREATE USER %s@'%%' IDENTIFIED BY %s", (user.name, user.password)
                )
        yield made
    finally:
        for conn in conns:
            for user in made.values():
                conn.cursor().execute("DROP USER IF EXISTS %s@'%%'", (user.name,))
            conn.close()


@pytest.fixture(scope="module")
def store(local_cluster: LocalCluster, users: dict[str, User]) -> Iterator[DataStore]:
    """A datastore made by the local cluster's admin user: 4 logical shards, by_link
    ready, 40 entities; the app user has the grants of its role."""
    prefix = "grants_" + uuid.uuid4().hex[:8]
    ds = DataStore(
        local_cluster.addresses,
        [BY_LINK],
        prefix=prefix,
        shards=4,
        refresh_interval=0.2,
        option_file=str(local_cluster.option_file),
    )
    try:
        ds.put_many({"link": f"http://example.com/{i}", "n": i} for i in range(40))
        apply_grants(ds, "app", users["app"].account)
        yield ds
    finally:
        ds.close()
        drop_prefix(local_cluster, prefix)


def open_as(cluster: LocalCluster, store: DataStore, user: User, **kwargs: Any) -> DataStore:
    kwargs.setdefault("create", False)
    return DataStore(
        cluster.addresses,
        user=user.name,
        password=user.password,
        prefix=store.cluster.topology.prefix,
        refresh_interval=0.2,
        **kwargs,
    )


def user_env(cluster: LocalCluster, store: DataStore, user: User) -> dict[str, str | None]:
    return {
        "SCHEMALESS_URL": f"mysql://{cluster.addresses[0]}",
        "SCHEMALESS_PREFIX": store.cluster.topology.prefix,
        "SCHEMALESS_USER": user.name,
        "SCHEMALESS_PASSWORD": user.password,
        "SCHEMALESS_OPTION_FILE": None,
    }


def schemaless(cluster: LocalCluster, store: DataStore, *args: str) -> Result:
    """``schemaless ...`` as the local cluster's admin user."""
    env = cluster_env(cluster, store.cluster.topology.prefix)
    return CliRunner(env=env).invoke(cli, list(args), catch_exceptions=False)


def statements(output: str) -> list[str]:
    return [line for line in output.splitlines() if line and not line.startswith("--")]


# -- names ------------------------------------------------------------------------------


def test_only_plain_user_and_host_names_go_into_a_grant() -> None:
    assert account("app") == "'app'@'%'"
    assert account("app.v2-x", "10.0.%") == "'app.v2-x'@'10.0.%'"
    assert check_account("'cleaner'@'127.0.0.1'") == "'cleaner'@'127.0.0.1'"
    for bad in HOSTILE:
        with pytest.raises(GrantError, match="invalid user name"):
            account(bad)
    for bad in [*HOSTILE[:8], "a*", "é", "a\n", "%' OR 1", "10.0.0.%;"]:
        with pytest.raises(GrantError, match="invalid host"):
            account("app", bad)
    for bad in ("app@%", "'app'@'%'; DROP USER x", "'a'b'@'%'", "'app'@'%' ", "`app`@`%`"):
        with pytest.raises(GrantError):
            check_account(bad)
    with pytest.raises(GrantError, match="unknown role"):
        grant_plan(None, "root", "'app'@'%'")  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", ["a'b", "a`b", "x;DROP USER root", "a b", "a\\b", "x'@'%"])
def test_cli_refuses_hostile_names_in_one_line(bad: str) -> None:
    runner = CliRunner(env={"SCHEMALESS_URL": "127.0.0.1:9"})  # never reached
    for args in (["--user", bad], ["--user", "app", "--host", bad]):
        result = runner.invoke(cli, ["grants", "app", *args])
        assert result.exit_code == 1, result.output
        lines = result.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: Invalid value for '--"), lines
    role = runner.invoke(cli, ["grants", "nope", "--user", "app"])  # was '{app|cleaner|admin}'
    assert role.exit_code == 1 and role.stderr.startswith("Error: Invalid value for 'ROLE': 'nope'")


# -- what the roles grant -------------------------------------------------------------


def test_printed_grants_of_each_role(local_cluster: LocalCluster, store: DataStore) -> None:
    topo = store.cluster.refresh()
    prefix = topo.prefix
    shard_dbs = set(topo.dbs)

    app = schemaless(local_cluster, store, "grants", "app", "--user", "x")
    assert app.exit_code == 0, app.output
    lines = statements(app.output)
    escaped = prefix.replace("_", "\\_")  # database-level: '_' would be a wildcard
    assert f"GRANT SELECT ON `{escaped}\\_catalog`.* TO 'x'@'%';" in lines
    dml = re.compile(r"GRANT SELECT, INSERT, UPDATE, DELETE ON `([\w\\]+)`\.\* TO 'x'@'%';\Z")
    shard_lines = [line for line in lines if "_catalog" not in line]
    assert all(dml.match(line) for line in shard_lines), shard_lines
    # every shard database on every server: a shard that moves keeps working
    assert len(shard_lines) == len(shard_dbs) * len(topo.servers)
    granted = {dml.match(line).group(1) for line in shard_lines}  # type: ignore[union-attr]
    assert granted == {db.replace("_", "\\_") for db in shard_dbs}
    for word in ("CREATE", "DROP", "ALTER", "INDEX", "ALL", "GRANT OPTION", "TRIGGER"):
        assert not any(word in line.removeprefix("GRANT") for line in lines), word
    assert app.output.count("\n-- on ") == len(topo.servers)

    cleaner = statements(
        schemaless(local_cluster, store, "grants", "cleaner", "--user", "c").output
    )
    entities = [line for line in cleaner if "`entities`" in line]
    assert len(entities) == len(topo.servers)  # the data database, on every server
    assert all(
        "INSERT (`shard`, `id`, `version`, `updated`), UPDATE (`version`, `updated`) ON"
        f" `{prefix}_data`.`entities`" in line
        for line in entities
    )
    assert not any("DELETE ON" in line and "`entities`" in line for line in cleaner)
    assert (
        f"GRANT UPDATE (`state`, `changed`) ON `{prefix}_catalog`.`indexes` TO 'c'@'%';" in cleaner
    )
    deferrals = f"GRANT INSERT, UPDATE, DELETE ON `{prefix}_catalog`.`deferrals` TO 'c'@'%';"
    assert deferrals in cleaner
    assert not any("`deferrals`" in line for line in lines)  # not the app's

    admin_output = schemaless(
        local_cluster, store, "grants", "admin", "--user", "a", "--host", "10.%"
    ).output
    assert "log_bin_trust_function_creators = 1" in admin_output  # the owned layout's triggers
    admin = statements(admin_output)
    assert admin == [f"GRANT ALL PRIVILEGES ON `{escaped}\\_%`.* TO 'a'@'10.%';"] * len(
        topo.servers
    )
    assert grant_statements(store, "admin", "'a'@'10.%'") == [s.rstrip(";") for s in admin]


def test_grants_never_create_a_user(local_cluster: LocalCluster, store: DataStore) -> None:
    ghost = "ghost_" + uuid.uuid4().hex[:8]
    result = schemaless(local_cluster, store, "grants", "app", "--user", ghost, "--apply")
    assert result.exit_code == 1
    assert "does not exist there; create it first" in result.stderr
    assert len(result.stderr.splitlines()) == 1
    assert _users_exist(local_cluster, ghost) == [0, 0]


# -- the application user ---------------------------------------------------------------


def test_the_application_user_reads_and_writes_but_runs_no_ddl(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    app = users["app"]
    # create=True with existing tables and an identical index: no DDL is attempted
    with open_as(local_cluster, store, app, create=True, indexes=[BY_LINK]) as ds:
        entity = {"link": "http://grants.example/1", "n": 1}
        v1 = ds.put(entity)
        assert ds.get(entity["id"]) == entity
        updated = ds.update(entity["id"], lambda e: {**(e or {}), "n": 2})
        assert updated.version > v1
        assert [e["n"] for e in ds.query("by_link", link="http://grants.example/1")] == [2]
        assert ds.delete(entity["id"]) is True
        assert ds.get(entity["id"]) is None
        assert ds.query("by_link", link="http://grants.example/1") == []

        with pytest.raises(PermissionDenied) as denied:
            ds.declare_index(BY_N)
        message = str(denied.value)
        assert message.startswith("permission denied: 127.0.0.1:")
        assert f"denied to user '{app.name}'" in message  # CREATE TABLE, the first DDL
        assert message.endswith("this user's grants do not allow it")
        assert "by_n" not in store.cluster.refresh().indexes

        topo = ds.cluster.refresh()
        server = ds.cluster.server_of_shard(topo, 0)
        table = quote(topo.dbs[0], BY_LINK.table)
        with pytest.raises(PermissionDenied, match="DROP command denied"):
            server.run(admin([f"DROP TABLE {table}"]))
        with pytest.raises(PermissionDenied, match="ALTER command denied"):
            server.run(admin([f"ALTER TABLE {table} ADD COLUMN `x` INT"]))
        catalog = ds.cluster.catalog
        with pytest.raises(PermissionDenied, match="UPDATE command denied"):
            catalog.set_index_state("by_link", "dropped")
        catalog.report_client("app-test", {"x": {"p99_ms": 1.0, "n": 10}})  # its latency
        assert "app-test" in catalog.client_reports(0)
    assert store.cluster.refresh().indexes["by_link"].state == "ready"
    runner = CliRunner(env=user_env(local_cluster, store, app))
    for args, expected in (
        (["index", "status", "by_link"], "index by_link: ready"),
        (["query", "by_link", "--where", "link=http://example.com/3"], "example.com/3"),
    ):
        result = runner.invoke(cli, args)
        assert result.exit_code == 0 and expected in result.output, result.output
    refused = runner.invoke(cli, ["index", "create", "by_x", "--property", "n:int"])
    assert refused.exit_code == 1 and "permission denied" in refused.stderr
    assert "run it as the datastore's admin" in refused.stderr  # what to do, in one line
    assert len(refused.stderr.splitlines()) == 1 and "by_x" not in store.cluster.refresh().indexes
    with pytest.raises(PermissionDenied) as login:
        open_as(local_cluster, store, User(app.name, "wrong-" + app.password))
    assert "(MySQL error 1045)" in str(login.value) and "grants" not in str(login.value)


def test_a_user_at_its_connection_limit_gets_a_retryable_error(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    """An account's ``MAX_USER_CONNECTIONS`` reached (error 1226; 1203 for the server's
    ``max_user_connections``) means "try again later", like "too many connections":
    ``ShardUnavailable``, not a permanent ``ServerError``."""
    app = open_as(local_cluster, store, users["app"])
    conns = [_admin(local_cluster, s.port) for s in local_cluster.servers]
    try:
        for conn in conns:
            conn.cursor().execute(
                "ALTER USER %s@'%%' WITH MAX_USER_CONNECTIONS 1", (users["app"].name,)
            )
        server = app.cluster.server_of_shard(app.cluster.current(), 0)
        with contextlib.ExitStack() as held, pytest.raises(ShardUnavailable, match="1226"):
            for _ in range(app.cluster.catalog.server.options.pool_size):
                held.enter_context(server.connection())  # the pooled ones, then a new one
        assert app.get(new_id()) is None  # connections free again: it answers
    finally:
        for conn in conns:
            conn.cursor().execute(
                "ALTER USER %s@'%%' WITH MAX_USER_CONNECTIONS 0", (users["app"].name,)
            )
            conn.close()
        app.close()


def test_an_application_user_opens_past_an_interrupted_declaration(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    """Dropping the old fences a died declaration left is an admin's re-declaration;
    an application user declaring the same index at open (no DROP right) opens and
    writes, and the old fences stay until the admin finishes it."""
    topo = store.cluster.refresh()
    store.cluster.create_index_tables(topo, BY_N)
    store.cluster.create_fences(topo, topo.index_epoch + 1)
    assert store.cluster.catalog.record_index(BY_N, "building", topo.index_epoch)
    try:
        with open_as(local_cluster, store, users["app"], indexes=[BY_N]) as ds:
            entity = {"link": "http://grants.example/fenced", "n": 7}
            ds.put(entity)
            assert ds.get(entity["id"]) == entity
        now = store.cluster.refresh()
        epochs = {e for dbs in store.cluster.fences(now).values() for _, e in dbs}
        assert epochs == {topo.index_epoch, now.index_epoch}  # left for the admin
        assert store.declare_index(BY_N) == "building"  # the admin finishes it
        epochs = {e for dbs in store.cluster.fences(now).values() for _, e in dbs}
        assert epochs == {now.index_epoch}
    finally:
        store.drop_index(BY_N.name)
        store.purge_index(BY_N.name)


# -- the Cleaner user -----------------------------------------------------------------


def test_the_cleaner_user_backfills_and_repairs_but_never_writes_a_body(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    cleaner = users["cleaner"]
    assert store.declare_index(BY_N) == "building"
    # the index table is new: the grants are made again (table-level grants)
    applied = schemaless(
        local_cluster, store, "grants", "cleaner", "--user", cleaner.name, "--apply"
    )
    assert applied.exit_code == 0, applied.output
    assert applied.output.count(f"grants applied to {cleaner.account} (role cleaner)") == 2
    env = user_env(local_cluster, store, cleaner)

    backfill = CliRunner().invoke(cleaner_main, ["--index=by_n", "-q"], env=env)
    assert backfill.exit_code == 0, backfill.output
    assert store.cluster.refresh().indexes["by_n"].state == "ready"
    # its throttle made its canary table on every server, and probed with writes
    canary = quote(canary_db(store.cluster.topology.prefix), "canary")
    for server in store.cluster.all_servers(store.cluster.topology).values():
        rows = server.run(f"SELECT `name`, `probes` FROM {canary}")[0]
        assert [(name, probes > 0) for name, probes in rows] == [("backfill:by_n", True)]

    # orphans: of an absent entity (fenced), ahead of a live one (its version raised),
    # a stale row (deleted); and a tombstone old enough to purge
    topo = store.cluster.refresh()
    absent = new_id()
    plant(store, BY_LINK, ("http://orphan.example/",), absent, 2**62)
    version = store.put({"link": "http://live.example/", "n": 700})
    live = store.query("by_n", n=700)[0]
    assert live.version == version
    plant(store, BY_LINK, ("http://ahead.example/",), live.id, version + 10)
    plant(store, BY_N, (800,), live.id, version)
    doomed = {"link": "http://doomed.example/", "n": 9}
    store.put(doomed)
    store.delete(doomed["id"])
    assert not all(d.clean for d in diff_indexes(store).values())

    once = CliRunner().invoke(
        cleaner_main, ["--once", "--fence-after", "0", "--tombstone-retention", "0"], env=env
    )
    assert once.exit_code == 0, once.output
    assert "tombstone purge skipped: the cleaner user may not delete entities" in once.output
    assert once.output.count("tombstone purge skipped") == 1
    assert "orphans deleted 3" in once.output and "fenced 2" in once.output
    assert all(d.clean for d in diff_indexes(store).values())
    after = store.get(live.id)
    assert after == live and after is not None and after.version == version + 10
    tombstones = _tombstones(store)
    assert absent in tombstones and doomed["id"] in tombstones

    # verify --repair under the same grant
    plant(store, BY_N, (900,), new_id(), 2**62)
    repaired = CliRunner().invoke(
        cleaner_main, ["verify", "--repair", "--fence-after", "0"], env=env
    )
    assert repaired.exit_code == 0, repaired.output
    assert "1 entities fenced" in repaired.output and "after repair: clean" in repaired.output

    # raw statements outside the grant
    with open_as(local_cluster, store, cleaner) as ds:
        shard = ds.cluster.shard_of_id(live.id)
        server = ds.cluster.server_of_shard(topo, shard)
        entities = quote(topo.dbs[shard], "entities")
        with pytest.raises(PermissionDenied, match=r"UPDATE command denied .* column 'body'"):
            server.run(
                admin([f"UPDATE {entities} SET `body` = %s WHERE `id` = %s"]), (b"x", live.id)
            )
        with pytest.raises(PermissionDenied, match="DELETE command denied"):
            server.run(admin([f"DELETE FROM {entities}"]))
        with pytest.raises(PermissionDenied, match=r"INSERT command denied .* column 'body'"):
            server.run(
                admin(
                    [
                        f"INSERT INTO {entities} (`shard`, `id`, `version`, `updated`, `body`)"
                        " VALUES (%s, %s, 1, 1, %s)"
                    ]
                ),
                (shard, new_id(), b"x"),
            )
        with pytest.raises(PermissionDenied, match="DROP command denied"):
            server.run(admin([f"DROP TABLE {quote(topo.dbs[shard], BY_N.table)}"]))
        with pytest.raises(PermissionDenied, match="INSERT command denied"):
            ds.cluster.catalog.add_dictionary(b"d" * 100)
        # a backfill's deferred rows (a server down): recorded, read, forgotten
        deferrals = Deferrals(ds.cluster.catalog)
        deferred = Deferral("by_n", 0, 1, 0, 5)
        deferrals.checkpoint("grants-test", 0, 5, False, 5, [deferred])
        assert deferrals.of("by_n") == [deferred]
        assert deferrals.finish(deferred) and deferrals.of("by_n") == []
        # in-process too: the purge is skipped and counted, the pass goes on
        figures = Cleaner(ds, tombstone_retention=0).run_once()
        assert figures["purge_skipped"] == 1 and figures["purged"] == 0
    assert store.get(live.id) == live

    # the admin's Cleaner purges them
    assert Cleaner(store, tombstone_retention=0).run_once()["purged"] >= 2
    assert not {absent, doomed["id"]} & _tombstones(store)
    assert all(d.clean for d in diff_indexes(store).values())


def _tombstones(store: DataStore) -> set[bytes]:
    topo = store.cluster.refresh()
    found: set[bytes] = set()
    for shard in range(topo.n_shards):
        found |= {
            bytes(r[0]) for r in shard_rows(store, shard, "entities", "`id`", "`body` IS NULL")
        }
    return found


# -- the admin user -------------------------------------------------------------------


def test_the_admin_user_inits_declares_and_moves(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    admin = users["admin"]
    prefix = "grantsinit_" + uuid.uuid4().hex[:8]
    try:
        # init needs CREATE on <prefix>\_% before there is a catalog to read: by hand
        for server in local_cluster.servers:
            conn = _admin(local_cluster, server.port)
            try:
                escaped = prefix.replace("_", "\\_")
                conn.cursor().execute(
                    f"GRANT ALL PRIVILEGES ON `{escaped}\\_%`.* TO {admin.account}"
                )
            finally:
                conn.close()
        with DataStore(
            local_cluster.addresses,
            [BY_LINK],
            user=admin.name,
            password=admin.password,
            prefix=prefix,
            shards=2,
        ) as ds:
            assert ds.indexes()["by_link"].state == "ready"
            assert len(grant_statements(ds, "admin", admin.account)) == 2
    finally:
        drop_prefix(local_cluster, prefix)

    apply_grants(store, "admin", admin.account)
    apply_grants(store, "cleaner", users["cleaner"].account)
    with open_as(local_cluster, store, admin) as ds:
        assert ds.declare_index(Index("by_both", {"n": "int", "link": "str(100)"})) == "building"
        ds.drop_index("by_both")
        ds.purge_index("by_both")
        topo = ds.cluster.refresh()
        target = 1 - topo.shard_servers[3]
        report = ShardMover(ds).move(3, target)
        assert report.rows_copied > 0
        assert ShardMover(ds).drop_old_copies()
    # the application follows the shard without new grants
    store.cluster.refresh()  # (iter does not reroute after a move: a fresh map)
    with open_as(local_cluster, store, users["app"]) as ds:
        assert len(list(ds.iter("by_link"))) == len(list(store.iter("by_link")))
        ds.put({"link": "http://after-move.example/", "n": 0})
    # the Cleaner's grants are on the data database of every server: no new ones
    with open_as(local_cluster, store, users["cleaner"]) as ds:
        assert Cleaner(ds).run_once()["passes"] == 1


def test_the_guard_runs_with_its_definers_rights(local_cluster: LocalCluster) -> None:
    """The owned layout's guard runs as the admin who created the tables: the app
    user writes through it without any right on triggers, a row of a shard the
    server does not own is refused, and with the triggers' definer dropped every
    update of a row whose table keeps a trigger (an index whose key could not name the
    version, an edge's, a feed's, a feed head's) fails, where an entity's or another
    index's, guarded by the key alone, does not (what docs/operations.md warns of)."""
    tag = uuid.uuid4().hex[:8]
    prefix = "grantsdef_" + tag
    with new_users(local_cluster, tag, ("admin", "app")) as made:
        try:
            for server in local_cluster.servers:
                conn = _admin(local_cluster, server.port)
                escaped = prefix.replace("_", "\\_")
                conn.cursor().execute(
                    f"GRANT ALL PRIVILEGES ON `{escaped}\\_%`.* TO {made['admin'].account}"
                )
                conn.close()
            root = DataStore(
                local_cluster.addresses,
                prefix=prefix,
                indexes=[BY_N, WIDE],
                shards=2,
                user=made["admin"].name,
                password=made["admin"].password,
            )
            root.close()
            with DataStore(
                local_cluster.addresses, prefix=prefix, option_file=str(local_cluster.option_file)
            ) as ds:
                apply_grants(ds, "app", made["app"].account)
                topo = ds.cluster.refresh()
            with open_as(local_cluster, ds, made["app"]) as app:
                entity = {"n": 1, "w": "a"}
                app.put(entity)
                assert app.get(entity["id"]) == entity
                server = app.cluster.server_of_shard(topo, 0)  # shard 1 is the other one's
                insert = (
                    f"INSERT INTO {quote(topo.dbs[1], 'entities')}"
                    " (`shard`, `id`, `version`, `updated`, `body`) VALUES (1, %s, 1, 1, NULL)"
                )
                with pytest.raises(TableMissing, match="not on this server"):
                    server.run(admin([insert]), (new_id(),))
                for conn in (_admin(local_cluster, s.port) for s in local_cluster.servers):
                    conn.cursor().execute("DROP USER %s@'%%'", (made["admin"].name,))
                    conn.close()
                with pytest.raises(SchemalessError, match="definer"):
                    app.put({**entity, "v": 2})  # by_wide's row present: its trigger
                app.put({"id": entity["id"], "n": 1, "v": 3})  # by_n's row present: the key
                app.put({"id": entity["id"], "n": 2})  # a new index row: the key
                assert app.get(entity["id"]) == {"id": entity["id"], "n": 2}
        finally:
            drop_prefix(local_cluster, prefix)


def test_a_trigger_refused_for_want_of_super_is_permission_denied() -> None:
    """With binary logging on, MariaDB lets only SUPER create the owned layout's
    triggers (error 1419, docs/reliability.md): the admin user is told it lacks a
    right, not handed a generic server error."""
    message = "You do not have the SUPER privilege and binary logging is enabled"
    error = translate("db1:3306", MySQLdb.OperationalError(1419, message), sent=True, commits=False)
    assert isinstance(error, PermissionDenied) and "(MySQL error 1419)" in str(error)


def test_grants_in_the_layout_of_a_database_per_shard(local_cluster: LocalCluster) -> None:
    """A datastore in the old layout: the app's grants name every shard's database on
    every server, the Cleaner's each shard's on its server (made again after a move)."""
    prefix = "grantsdbs_" + uuid.uuid4().hex[:8]
    store = DataStore(
        local_cluster.addresses,
        [BY_LINK],
        prefix=prefix,
        shards=4,
        layout="databases",
        refresh_interval=0.2,
        option_file=str(local_cluster.option_file),
    )
    try:
        store.put_many({"link": f"http://example.com/{i}", "n": i} for i in range(20))
        topo = store.cluster.refresh()
        app = [g for g in grant_statements(store, "app", "'x'@'%'") if "_catalog" not in g]
        assert len(app) == topo.n_shards * len(topo.servers)
        cleaner = [g for g in grant_statements(store, "cleaner", "'c'@'%'") if "`entities`" in g]
        assert sorted(cleaner) == [
            f"GRANT INSERT (`id`, `version`, `updated`), UPDATE (`version`, `updated`)"
            f" ON `{db}`.`entities` TO 'c'@'%'"
            for db in topo.dbs
        ]
        with new_users(local_cluster, uuid.uuid4().hex[:8], ("app", "cleaner")) as made:
            for role, user in made.items():
                apply_grants(store, role, user.account)
            with open_as(local_cluster, store, made["app"]) as ds:
                entity = {"link": "http://grants.example/dbs", "n": 1}
                ds.put(entity)
                assert ds.query("by_link", link=entity["link"]) == [entity]
            with open_as(local_cluster, store, made["cleaner"]) as ds:
                assert Cleaner(ds).run_once()["passes"] == 1
            ShardMover(store).move(3, 1 - topo.shard_servers[3])
            assert ShardMover(store).drop_old_copies()
            with open_as(local_cluster, store, made["cleaner"]) as ds:
                with pytest.raises(PermissionDenied, match="SELECT command denied"):
                    Cleaner(ds).run_once()
                apply_grants(store, "cleaner", made["cleaner"].account)
                assert Cleaner(ds).run_once()["passes"] == 1
    finally:
        store.close()
        drop_prefix(local_cluster, prefix)


def test_grants_of_one_datastore_give_nothing_on_another(local_cluster: LocalCluster) -> None:
    """Datastores ``<t>_b`` and ``<t>xb`` on the same servers: as a database-level grant
    pattern, ``<t>_b_data`` also matches ``<t>xb_data`` (``_`` is a wildcard there), so
    the first one's users could read and write the second one's entities and catalog."""
    tag = uuid.uuid4().hex[:6]
    opts: dict[str, Any] = {"option_file": str(local_cluster.option_file), "shards": 2}
    mine = DataStore(local_cluster.addresses, prefix=f"g{tag}_b", **opts)
    other = DataStore(local_cluster.addresses, prefix=f"g{tag}xb", **opts)
    other.put({"secret": "the other datastore's"})
    try:
        with new_users(local_cluster, tag, ("app", "cleaner")) as made:
            for role, user in made.items():
                apply_grants(mine, role, user.account)
            reached = []
            for user in made.values():
                for server in local_cluster.servers:
                    conn = MySQLdb.connect(
                        host="127.0.0.1", port=server.port, user=user.name, password=user.password
                    )
                    for db, table in (
                        (f"g{tag}xb_data", "entities"),
                        (f"g{tag}xb_data", "owned"),
                        (f"g{tag}xb_catalog", "meta"),
                    ):
                        with contextlib.suppress(MySQLdb.Error):  # denied, or not on this server
                            conn.cursor().execute(f"SELECT 1 FROM `{db}`.`{table}` LIMIT 1")
                            reached.append((user.name, server.port, db))
                    conn.close()
            assert reached == []
            # and each user still reaches its own datastore
            own = open_as(local_cluster, mine, made["app"], create=False)
            own.put({"n": 1})
            own.close()
    finally:
        for ds in (mine, other):
            drop_prefix(local_cluster, ds.cluster.topology.prefix)
            ds.close()


def feed_store(local_cluster: LocalCluster, prefix: str, **options: Any) -> DataStore:
    """A new datastore with the change feed on, opened as the cluster's admin."""
    return DataStore(
        local_cluster.addresses,
        prefix=prefix,
        shards=2,
        refresh_interval=0.2,
        option_file=str(local_cluster.option_file),
        changes=True,
        **options,
    )


def test_feed_users_subscribe_and_trim_with_their_grants(local_cluster: LocalCluster) -> None:
    """With the change feed on, the app user subscribes and acknowledges, and the
    Cleaner user trims what was acknowledged; neither can do more than its role."""
    prefix = "grantsfeed_" + uuid.uuid4().hex[:8]
    admin = feed_store(local_cluster, prefix)
    try:
        with new_users(local_cluster, uuid.uuid4().hex[:8], ("app", "cleaner")) as made:
            apply_grants(admin, "app", made["app"].account)
            apply_grants(admin, "cleaner", made["cleaner"].account)
            app = open_as(local_cluster, admin, made["app"])
            app.put_many({"n": i} for i in range(6))
            sub = app.subscribe("reader")
            events = list(sub.changes())
            assert len(events) == 6
            sub.ack(events[-1])
            app.close()
            cleaner = open_as(local_cluster, admin, made["cleaner"])
            figures = Cleaner(cleaner).run_once()
            assert figures["feed_trimmed"] == 6
            cleaner.close()
    finally:
        admin.close()
        drop_prefix(local_cluster, prefix)


def test_cleaner_user_expires_with_the_feed_on_and_the_feed_says_so(
    local_cluster: LocalCluster,
) -> None:
    """Expiry and the change feed together: the Cleaner user's delete of an expired
    entity writes its change row (its grants cover the feed's tables), and a reader
    of the feed sees the delete."""
    prefix = "grantsboth_" + uuid.uuid4().hex[:8]
    admin = feed_store(local_cluster, prefix, expire_on="expires_at")
    try:
        key = new_id()
        admin.put({"id": key, "n": 1, "expires_at": time.time() - 1})  # expired already
        stored = {e.id: e for e in admin.changes()}
        with new_users(local_cluster, uuid.uuid4().hex[:8], ("cleaner",)) as made:
            apply_grants(admin, "cleaner", made["cleaner"].account)
            cleaner = open_as(local_cluster, admin, made["cleaner"])
            figures = Cleaner(cleaner).run_once()
            cleaner.close()
        assert figures["expire_skipped"] == 0 and figures["expired_purged"] == 1
        events = [e for e in admin.changes() if e.id == key]
        assert [e.entity is None for e in events] == [False, True]  # the put, the delete
        assert events[1].version > stored[key].version
    finally:
        admin.close()
        drop_prefix(local_cluster, prefix)


def test_least_privilege_users_meet_a_blocked_index(
    local_cluster: LocalCluster, store: DataStore, users: dict[str, User]
) -> None:
    """The application user's write that meets a building index with a value it cannot
    hold blocks it (its grants cover ``blocks``), and succeeds; the cleaner user's
    backfill cannot reopen it (a new index epoch is DDL): it scans, records what it
    set aside, leaves the index building and says who can."""
    app, cleaner = users["app"], users["cleaner"]
    short = Index("by_short", {"link": "str(8)"})
    assert store.declare_index(short, force=True) == "building"  # every link is longer
    try:
        for role, user in (("app", app), ("cleaner", cleaner)):  # the new index table
            apply_grants(store, role, user.account)
        with open_as(local_cluster, store, app) as ds:
            entity = {"link": "http://far-too-long.example/", "n": 1}
            ds.put(entity)
            assert ds.get(entity["id"]) == entity
        (writes, _), _ = store.cluster.catalog.blocks("by_short")
        assert writes == 1
        env = user_env(local_cluster, store, cleaner)
        backfill = CliRunner().invoke(cleaner_main, ["--index=by_short", "-q"], env=env)
        assert backfill.exit_code == 1, backfill.output
        assert "`schemaless index status by_short` says why" in backfill.output
        (writes, _), unfit = store.cluster.catalog.blocks("by_short")
        # the 40 links of the fixture and this one (earlier tests may have added more)
        assert writes == 1 and sum(count for count, _ in unfit.values()) >= 41
        assert store.cluster.refresh().indexes["by_short"].state == "building"
        store.delete(entity["id"])
    finally:
        store.drop_index("by_short")
        store.purge_index("by_short")
