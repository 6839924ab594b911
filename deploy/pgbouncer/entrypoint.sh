#!/bin/sh
# The one user PgBouncer lets in (and uses towards PostgreSQL), from the environment.
set -eu
: "${DB_USER:?set DB_USER}" "${DB_PASSWORD:?set DB_PASSWORD}"
printf '"%s" "%s"\n' "$DB_USER" "$DB_PASSWORD" > /etc/pgbouncer/userlist.txt
chmod 0600 /etc/pgbouncer/userlist.txt
exec pgbouncer /etc/pgbouncer/pgbouncer.ini
