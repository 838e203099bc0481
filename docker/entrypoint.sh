#!/bin/sh
# Entrypoint of the schemaless image.
#
#   schemaless-entrypoint schemaless init ...   runs the admin command
#   schemaless-entrypoint cleaner ...           runs the Cleaner
#   schemaless-entrypoint init ...              anything else: a `schemaless` subcommand
#
# SCHEMALESS_PASSWORD_FILE (e.g. a Docker secret under /run/secrets) fills
# SCHEMALESS_PASSWORD, so the password need not be in the environment at all.
set -eu

if [ -n "${SCHEMALESS_PASSWORD_FILE:-}" ]; then
    if [ -n "${SCHEMALESS_PASSWORD:-}" ]; then
        echo "schemaless-entrypoint: set SCHEMALESS_PASSWORD or SCHEMALESS_PASSWORD_FILE, not both" >&2
        exit 2
    fi
    SCHEMALESS_PASSWORD="$(cat "$SCHEMALESS_PASSWORD_FILE")"
    export SCHEMALESS_PASSWORD
    unset SCHEMALESS_PASSWORD_FILE
fi

case "${1:-}" in
    schemaless | cleaner | sh | bash | python | python3)
        exec "$@"
        ;;
    *)
        exec schemaless "$@"
        ;;
esac
