"""``schemaless init --expire-on``, ``schemaless expiry`` and ``schemaless put --ttl``."""

from __future__ import annotations

import json
import time
import uuid

from click.testing import CliRunner
from test_cli import Cli, cluster_env, drop_prefix

from schemaless.cleaner.main import main as cleaner_main
from schemaless.local import LocalCluster


def test_expiry_commands(local_cluster: LocalCluster) -> None:
    prefix = "cli_" + uuid.uuid4().hex[:8]
    run = Cli(cluster_env(local_cluster, prefix))
    try:
        assert "'--expire-on'" in run.fails("init", "--shards", "4", "--expire-on", "a b")
        out = run.ok("init", "--shards", "4", "--expire-on", "exp").output
        assert "entities expire at the time in 'exp'" in out
        line = run.fails("init", "--expire-on", "other")
        assert "expires entities on 'exp', not 'other'" in line
        later = run.ok("put", "--ttl", "3600", "--json", input='{"n": 1}').output
        key = json.loads(later)["id"]
        gone = json.dumps({"n": 2, "exp": time.time() - 1})
        past = json.loads(run.ok("put", "--json", input=gone).output)["id"]
        assert '"n": 1' in run.ok("get", key, "--json").output
        assert run.fails("get", past) == f"Error: not found: {past}"
        for bad in ("-1", "0", "nan"):  # named the library's ttl, not the option
            refused = run.fails("put", "--ttl", bad, input='{"n": 3}')
            assert refused.startswith("Error: Invalid value for '--ttl': "), refused
        assert "'exp'" in run.ok("expiry").output
        once = CliRunner().invoke(cleaner_main, ["--once", "-q"], env=run.env)
        assert once.exit_code == 0, once.output
        assert "expired purged 1," in once.output
        again = json.dumps({"n": 4, "exp": time.time() - 1})
        hidden = json.loads(run.ok("put", "--json", input=again).output)["id"]
        assert run.fails("get", hidden) == f"Error: not found: {hidden}"
        assert "never expire" in run.ok("expiry", "--off").output
        assert '"n": 4' in run.ok("get", hidden, "--json").output  # no longer expired
        assert run.fails("get", past) == f"Error: not found: {past}"  # deleted
        assert "'until'" in run.ok("expiry", "until").output
        assert "'PROPERTY'" in run.fails("expiry", "id")
        assert "not both" in run.fails("expiry", "until", "--off")
    finally:
        drop_prefix(local_cluster, prefix)
