"""Security: hostile identifiers, credentials that never leak, TLS with CA verification.

(Least-privilege grants are covered elsewhere.)
"""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import secrets
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import drop_datastore
from faults.helpers import open_store, scratch_cluster
from hypothesis import event, given, settings
from hypothesis import strategies as st

from schemaless import (
    CatalogError,
    CatalogUnavailable,
    DataStore,
    Index,
    IndexDefinitionError,
    InvalidCursor,
    InvalidEntity,
    InvalidId,
    InvalidQuery,
    PermissionDenied,
    SchemalessError,
    ShardUnavailable,
    new_id,
)
from schemaless.dsn import parse_address
from schemaless.local import LocalCluster

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent

# -- hostile names --------------------------------------------------------------------

_RESERVED = (
    "select order from where table key index drop limit group union by desc null true all "
    "primary values"
).split()
_HOSTILE = st.text(max_size=70) | st.text(alphabet="`'\";-/*\\ \n\t\0%_aZ09", max_size=20)
_VALID = st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True) | st.sampled_from(
    _RESERVED + [w.upper() for w in _RESERVED]
)
_NAMES = _HOSTILE | _VALID | _VALID
_counter = itertools.count()


@pytest.fixture(scope="module")
def fuzz_store(local_cluster: LocalCluster) -> Iterator[DataStore]:
    store = open_store(local_cluster, shards=2)  # two tables per index declared
    store.put({"id": new_id(), "seed": 1})
    yield store
    drop_datastore(store)


_QUERY_PARAMETERS = set(inspect.signature(DataStore.query).parameters)


@settings(max_examples=60, deadline=None)
@given(
    index_name=st.from_regex(r"[a-z][a-z0-9_]{0,12}", fullmatch=True) | _NAMES,
    prop=_NAMES.filter(lambda p: p.lower() != "n"),
)
def test_hostile_names_are_refused_or_work(
    fuzz_store: DataStore, index_name: str, prop: str
) -> None:
    """Either IndexDefinitionError, or a valid index whose SQL runs as intended."""
    index_name += f"_{next(_counter)}"  # a new name each time (hostile ones stay hostile)
    try:
        index = Index(index_name, {prop: "int", "n": "int"}, shard_on=prop)
    except IndexDefinitionError as exc:
        assert repr(index_name) in str(exc) or repr(prop) in str(exc)
        event("refused")
        return
    try:
        fuzz_store.declare_index(index)  # building: the store holds an entity
    except IndexDefinitionError as exc:
        assert "already exists" in str(exc)  # the same name drawn twice
        event("name taken")
        return
    event("declared")
    key = new_id()
    entity = {"id": key, prop: 42, "n": 7}
    fuzz_store.put(entity)
    assert fuzz_store.get(key) == entity
    if prop not in _QUERY_PARAMETERS:  # see test_bad_input: such a condition has no syntax
        page = fuzz_store.query(index, include_building=True, **{prop: 42, "n__gte": 7})
        assert key in [e.id for e in page]


# -- credentials ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def sentinel_user(local_cluster: LocalCluster) -> Iterator[tuple[str, str]]:
    """A MariaDB user whose password is a unique sentinel: (user, password)."""
    user = "sl_sentinel_" + secrets.token_hex(4)
    password = "S3ntinel-" + secrets.token_hex(12)
    admin = open_store(local_cluster, shards=2)
    servers = admin.cluster.all_servers(admin.cluster.topology).values()
    try:
        for server in servers:
            for host in ("127.0.0.1", "localhost"):
                server.run("CREATE USER %s@%s IDENTIFIED BY %s", (user, host, password))
                server.run("GRANT ALL PRIVILEGES ON *.* TO %s@%s", (user, host))
        yield user, password
    finally:
        for server in servers:
            for host in ("127.0.0.1", "localhost"):
                server.run("DROP USER IF EXISTS %s@%s", (user, host))
        drop_datastore(admin)


def _texts(exc: BaseException) -> Iterator[str]:
    """Every text an exception shows: str, repr, args, the formatted traceback, and the
    same for its chain (__cause__, __context__)."""
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop()
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        yield str(e)
        yield repr(e)
        yield from (repr(a) for a in e.args)
        yield "".join(traceback.format_exception(e))
        todo += [e.__cause__, e.__context__]


def _assert_clean(secret: str, *things: object) -> None:
    for thing in things:
        texts = _texts(thing) if isinstance(thing, BaseException) else [repr(thing), str(thing)]
        for text in texts:
            assert secret not in text, f"the password leaked: {text[:300]}"


def test_the_password_never_leaks(
    local_cluster: LocalCluster,
    sentinel_user: tuple[str, str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    user, password = sentinel_user
    caplog.set_level(logging.DEBUG)  # every logger, every level
    traced: list[str] = []
    errors: list[BaseException] = []

    def expect_error(fn: Any) -> None:
        try:
            fn()
        except SchemalessError as exc:
            errors.append(exc)
        else:
            raise AssertionError(f"{fn} raised nothing")

    # The right password (keyword arguments), and the same in a mysql:// URL.
    store = DataStore(
        local_cluster.addresses,
        [Index("by_n", {"n": "int"})],
        user=user,
        password=password,
        prefix="t_" + secrets.token_hex(6),
        shards=2,
        tracer=lambda server, sql, seconds: traced.append(f"{server} {sql}"),
    )
    port = local_cluster.servers[0].port
    by_url = DataStore(
        [f"mysql://{user}:{password}@127.0.0.1:{port}"], prefix=store.cluster.topology.prefix
    )
    try:
        key = new_id()
        store.put({"id": key, "n": 1})
        assert by_url.get(key) == {"id": key, "n": 1}
        assert [e.id for e in by_url.query("by_n", n=1)] == [key]
        expect_error(lambda: store.put({"id": key, "n": "one"}))
        expect_error(lambda: store.query("nope", n=1))
        expect_error(lambda: store.get(b"short"))
        expect_error(lambda: by_url.query("by_n", n=1, cursor="bad"))
        _assert_clean(
            password, store, by_url, store.cluster.options, store.cluster.options.credentials,
            by_url.cluster.options, *store.cluster.all_servers(store.cluster.topology).values(),
            store.cluster.topology, by_url.cluster.topology,
        )  # fmt: skip
    finally:
        drop_datastore(store)
        by_url.close()

    # Wrong passwords, an unreachable server, malformed URLs.
    wrong = password + "x"
    expect_error(lambda: DataStore(local_cluster.addresses, user=user, password=wrong))
    expect_error(lambda: DataStore([f"mysql://{user}:{wrong}@127.0.0.1:{port}"]))
    expect_error(lambda: DataStore(["127.0.0.1:1"], user=user, password=password))
    for url in (
        f"mysql://{user}:{password}@127.0.0.1:notaport",
        f"mysql://{user}:{password}@:3306",
        f"mysql://{user}:{password}@127.0.0.1:99999",
        f"ftp://{user}:{password}@127.0.0.1:3306",
    ):
        expect_error(lambda url=url: DataStore([url]))
    assert [type(e) for e in errors[:4]] == [InvalidEntity, InvalidQuery, InvalidId, InvalidCursor]
    assert [type(e) for e in errors[4:7]] == [
        PermissionDenied,
        PermissionDenied,
        CatalogUnavailable,
    ]
    assert all(isinstance(e, CatalogError) for e in errors[7:]) and len(errors) == 11
    _assert_clean(password, *errors)
    _assert_clean(wrong, *errors)
    for record in caplog.records:
        assert password not in record.getMessage() and password not in repr(record.args)
    assert password not in caplog.text
    assert all(password not in t for t in traced)


def test_a_dsn_without_scheme_does_not_echo_the_password() -> None:
    """``user:pw@host:port`` without ``mysql://`` is refused, without quoting the
    password (taken for a host name, it would go into error messages, reprs and, at
    init, the catalog's server list)."""
    secret = "Sentinel-" + secrets.token_hex(6)  # not in this file's source lines
    with pytest.raises(CatalogError) as info:
        parse_address(f"app:{secret}@db.example:3306")
    _assert_clean(secret, info.value)


def _run_until(cmd: list[str], env: dict[str, str], ready: Any, timeout: float = 20.0) -> str:
    """Start ``cmd``; once ``ready()`` holds, read its /proc cmdline; stop it (SIGTERM);
    return cmdline + comm + everything it printed."""
    proc = subprocess.Popen(
        cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        deadline = time.monotonic() + timeout
        while not ready():
            assert proc.poll() is None, proc.communicate()[0].decode()
            assert time.monotonic() < deadline, "the process never got going"
            time.sleep(0.1)
        seen = Path(f"/proc/{proc.pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
        seen += " " + Path(f"/proc/{proc.pid}/comm").read_text()
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            out = proc.communicate(timeout=30)[0].decode()
        except subprocess.TimeoutExpired:
            proc.kill()
            out = proc.communicate()[0].decode()
    return seen + "\n" + out


def test_the_password_is_not_in_process_titles_or_output(
    local_cluster: LocalCluster, sentinel_user: tuple[str, str]
) -> None:
    """``cleaner`` and ``schemaless`` with the password in the environment: it is not in
    /proc/<pid>/cmdline (which every local user can read), nor in what they print."""
    user, password = sentinel_user
    store = open_store(local_cluster, shards=2)
    try:
        store.put({"id": new_id(), "n": 1})
        store.declare_index(Index("by_n", {"n": "int"}))  # building: there is data
        prefix = store.cluster.topology.prefix
        env = {
            **os.environ,
            "SCHEMALESS_URL": f"mysql://{local_cluster.addresses[0]}",
            "SCHEMALESS_USER": user,
            "SCHEMALESS_PASSWORD": password,
            "SCHEMALESS_PREFIX": prefix,
        }
        env.pop("SCHEMALESS_OPTION_FILE", None)
        catalog = store.cluster.catalog.server

        def cleaner_beat() -> bool:
            rows = catalog.run(f"SELECT COUNT(*) FROM `{prefix}_catalog`.`status`")[0]
            return int(rows[0][0]) > 0

        shown = _run_until([str(BIN / "cleaner"), "-v", "--interval", "0.2"], env, cleaner_beat)
        assert password not in shown and "cleaner" in shown
        started = time.monotonic()
        shown = _run_until(
            [str(BIN / "schemaless"), "index", "status", "by_n", "--watch", "0.2"],
            env,
            lambda: time.monotonic() - started > 1.5,
        )
        assert password not in shown and "by_n" in shown
        for cmd in (["schemaless", "index", "list"], ["cleaner", "verify"]):
            done = subprocess.run(
                [str(BIN / cmd[0]), *cmd[1:]], env=env, capture_output=True, timeout=60
            )
            assert password not in (done.stdout + done.stderr).decode()
        wrong = {**env, "SCHEMALESS_PASSWORD": password + "x"}
        for cmd in (["schemaless", "index", "list"], ["cleaner", "--once"]):
            done = subprocess.run(
                [str(BIN / cmd[0]), *cmd[1:]], env=wrong, capture_output=True, timeout=60
            )
            text = (done.stdout + done.stderr).decode()
            assert done.returncode != 0 and "denied" in text.lower()
            assert password not in text
    finally:
        drop_datastore(store)


# -- TLS ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tls_cluster() -> Iterator[LocalCluster]:
    """One server with a certificate of its own CA, refusing plaintext TCP."""
    with scratch_cluster("tls", servers=1, durable=False, tls=True) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def other_ca(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA that did not sign the server's certificate."""
    where = tmp_path_factory.mktemp("evil")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2",
         "-subj", "/CN=schemaless local CA", "-keyout", "key.pem", "-out", "ca.pem"],
        cwd=where, check=True, capture_output=True,
    )  # fmt: skip
    return where / "ca.pem"


def _tls_store(cluster: LocalCluster, **kwargs: Any) -> DataStore:
    return open_store(cluster, shards=2, connect_timeout=2, **kwargs)


def test_tls_with_ca_verification(tls_cluster: LocalCluster) -> None:
    store = _tls_store(tls_cluster, ssl={"ca": str(tls_cluster.ca_file)})
    try:
        key = new_id()
        store.put({"id": key, "n": 1})
        assert store.get(key) == {"id": key, "n": 1}
        server = store.cluster.server_of_shard(store.cluster.topology, 0)
        for _ in range(3):  # every pooled connection
            cipher = server.run("SHOW SESSION STATUS LIKE 'Ssl_cipher'")[0][0][1]
            assert cipher, "the connection is not encrypted"
        version = server.run("SHOW SESSION STATUS LIKE 'Ssl_version'")[0][0][1]
        assert version.startswith("TLSv1.")
    finally:
        drop_datastore(store)
    also = _tls_store(tls_cluster, ssl={"ca": str(tls_cluster.ca_file), "mode": "VERIFY_CA"})
    drop_datastore(also)


def test_tls_refuses_a_certificate_of_another_ca(tls_cluster: LocalCluster, other_ca: Path) -> None:
    for ssl in ({"ca": str(other_ca)}, {}):  # {}: the system's CAs, which do not know it
        with pytest.raises(ShardUnavailable) as info:
            _tls_store(tls_cluster, ssl=ssl)
        assert "TLS" in str(info.value) and "certificate" in str(info.value)


def test_plaintext_is_refused_by_a_tls_server(tls_cluster: LocalCluster) -> None:
    with pytest.raises((PermissionDenied, ShardUnavailable)):
        _tls_store(tls_cluster)


def test_tls_never_falls_back_to_plaintext(
    local_cluster: LocalCluster, tls_cluster: LocalCluster
) -> None:
    """TLS asked for, a server (or a man in the middle) that offers none: refused."""
    with pytest.raises(ShardUnavailable) as info:
        DataStore(
            local_cluster.addresses,
            option_file=str(local_cluster.option_file),
            prefix="never_created",
            ssl={"ca": str(tls_cluster.ca_file)},
        )
    assert "TLS" in str(info.value)


@pytest.mark.parametrize(
    ("ssl", "word"),
    [({"ssl_ca": "/x"}, "unknown ssl option"), ({"mode": "REQUIRED"}, "not supported"),
     ({"mode": "DISABLED"}, "not supported"), ({"ca": "/x", "mode": "PREFERRED"}, "not supported")],
)  # fmt: skip
def test_unverified_tls_modes_are_refused(
    local_cluster: LocalCluster, ssl: dict[str, str], word: str
) -> None:
    with pytest.raises(ValueError, match=word):
        DataStore(local_cluster.addresses, ssl=ssl, option_file=str(local_cluster.option_file))
