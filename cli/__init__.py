"""The ``schemaless`` admin command line (click), installed as ``schemaless.cli``.

One place to run a datastore's whole lifecycle: start a local cluster, ``init`` the
catalog and logical shards, declare indexes and watch them backfill, inspect and
write entities, and look at the shards.  ``schemaless --help`` lists the commands;
docs/cli.md is the reference.
"""
