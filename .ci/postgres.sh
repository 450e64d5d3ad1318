# Sourced by .ci/run: install (Debian's packages) and start a throwaway PostgreSQL server on
# loopback for the storage tests; exports NF4TUNE_TEST_POSTGRES_URL and stops it on exit.
start_postgres() {
  if ! ls /usr/lib/postgresql/*/bin/postgres >/dev/null 2>&1; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq postgresql >/dev/null
  fi
  local pgbin
  pgbin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  id postgres >/dev/null 2>&1 || useradd --system --no-create-home postgres
  PGDATA_DIR=$(mktemp -d /tmp/nf4tune-pg.XXXXXX)
  chown postgres "$PGDATA_DIR"
  runuser -u postgres -- "$pgbin/initdb" -D "$PGDATA_DIR" -A trust -U postgres >/dev/null
  local port=${NF4TUNE_PG_PORT:-54329}
  runuser -u postgres -- "$pgbin/pg_ctl" -D "$PGDATA_DIR" -l "$PGDATA_DIR/server.log" -w \
    -o "-h 127.0.0.1 -p $port -k $PGDATA_DIR" start >/dev/null
  PG_CTL="$pgbin/pg_ctl"
  export NF4TUNE_TEST_POSTGRES_URL="postgresql+psycopg://postgres@127.0.0.1:$port/postgres"
  trap stop_postgres EXIT
}

stop_postgres() {
  [ -n "${PGDATA_DIR:-}" ] && runuser -u postgres -- "$PG_CTL" -D "$PGDATA_DIR" -m fast stop >/dev/null 2>&1
  rm -rf "${PGDATA_DIR:-/nonexistent}"
}
