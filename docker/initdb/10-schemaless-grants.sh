# Sourced (not executed: keep this file non-executable) by the MariaDB image's
# entrypoint on the first start of an empty data directory, after it has created
# MARIADB_USER.  Lets that user create and use the datastore's databases
# (<prefix>_catalog and <prefix>_data; in the databases layout <prefix>_0000, ..., and
# the <prefix>_NNNN_old* copies a shard move leaves behind) and nothing else.
schemaless_prefix="${SCHEMALESS_PREFIX:-schemaless}"
case "$schemaless_prefix" in
    "" | [!a-z]* | *[!a-z0-9_]*)
        mysql_error "SCHEMALESS_PREFIX must be lowercase letters, digits and '_': $schemaless_prefix"
        ;;
esac
schemaless_user="$(docker_sql_escape_string_literal "$MARIADB_USER")"
# '_' is a wildcard in a grant's database name: escape the prefix's own ones.
schemaless_pattern="${schemaless_prefix//_/\\_}\\_%"
mysql_note "granting ${MARIADB_USER} the databases ${schemaless_prefix}_*"
docker_process_sql --database=mysql <<EOSQL
GRANT ALL PRIVILEGES ON \`${schemaless_pattern}\`.* TO '${schemaless_user}'@'%';
EOSQL
unset schemaless_prefix schemaless_user schemaless_pattern
