"""A local cluster of real ``mariadbd`` processes, for development, the demo and tests.

Everything lives under one base directory::

    cluster.json          state: the servers and their ports, the durable flag
    client.cnf            [client] user and password of the application user (0600)
    server<i>/my.cnf      the server's only option file
    server<i>/data/       its data directory (made by mariadb-install-db)
    server<i>/mysqld.sock, mysqld.pid, error.log, install.log
    replica<j>/           a read replica (``replicas=N``, ``add_replica``), the same files
    replication.cnf       [client] user and password of the replication user (0600)
    tls/                  ``tls=True``: ca.pem, server-cert.pem, server-key.pem (0600)

Servers run detached (their own session), so they outlive the process that started
them; a later :class:`LocalCluster` on the same directory finds them again through
the state file, the pid file and a TCP probe.  The application user's password is
written only to ``client.cnf``; connect with::

    MySQLdb.connect(host="127.0.0.1", port=port,
                    read_default_file=str(cluster.option_file), read_default_group="client")

The package's layers, each on the one below: :mod:`.server` (one server's files and
probes), :mod:`.state` (the state file and the lock), :mod:`.process` (install, start,
stop), :mod:`.users` (the application user), :mod:`.replicas` and :mod:`.cluster`
(:class:`LocalCluster`, the public API); :mod:`.tls` makes certificates.  Development
tooling: the runtime imports it only when used (``open_store``'s local fallback,
``schemaless local``), never when ``schemaless``, the CLI or the Cleaner start.
"""

from __future__ import annotations

from ..errors import LocalClusterError
from .cluster import LocalCluster
from .server import LocalServer, default_base_dir

__all__ = ["LocalCluster", "LocalClusterError", "LocalServer", "default_base_dir"]
