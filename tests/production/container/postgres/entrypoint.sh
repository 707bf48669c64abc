#!/bin/sh
# The first start makes the cluster (the superuser POSTGRES_USER with its
# password, the database POSTGRES_DB, password logins from the network);
# every start then runs the server in the foreground as postgres.
set -eu
BIN=$(ls -d /usr/lib/postgresql/*/bin | tail -1)
mkdir -p "$PGDATA" /run/postgresql
chown postgres "$PGDATA" /run/postgresql
chmod 700 "$PGDATA"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ -n "${POSTGRES_PASSWORD_FILE:-}" ]; then POSTGRES_PASSWORD=$(cat "$POSTGRES_PASSWORD_FILE"); fi
    printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
    chown postgres /tmp/pwfile
    runuser -u postgres -- "$BIN/initdb" -D "$PGDATA" -U "$POSTGRES_USER" --pwfile=/tmp/pwfile \
        --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    rm -f /tmp/pwfile
    echo "host all all 0.0.0.0/0 scram-sha-256" >> "$PGDATA/pg_hba.conf"
    echo "listen_addresses = '*'" >> "$PGDATA/postgresql.conf"
    echo "CREATE DATABASE \"$POSTGRES_DB\";" | runuser -u postgres -- "$BIN/postgres" --single -D "$PGDATA" postgres >/dev/null
fi
exec runuser -u postgres -- "$BIN/postgres" -D "$PGDATA"
