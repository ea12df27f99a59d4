#!/usr/bin/env bash
# The PostgreSQL and Redis the integration and e2e tiers talk to (tests/run.sh runs this;
# tests/README.md "Tests" says what they need on a machine that is not Debian). Starts them where it
# can (Debian's PostgreSQL cluster, a redis-server), creates the role and the database
# FL_TEST_PG_URL names when they are missing, and otherwise says what is missing.
# Exit 0: both usable; 1: not (the message names what to provide). Needs the project's
# virtualenv first on PATH (it reads the URL with SQLAlchemy, as the tests do).
set -euo pipefail
status=0

PG_URL="${FL_TEST_PG_URL:-postgresql+psycopg://127.0.0.1:5432/test}"
# SQLAlchemy's parser, as the tests read the URL; libpq's default user is the process's.
read -r PG_HOST PG_PORT PG_USER PG_DB <<<"$(python - "$PG_URL" <<'EOF'
import os, pwd, sys
from sqlalchemy.engine import make_url
url = make_url(sys.argv[1])
user = url.username or pwd.getpwuid(os.geteuid()).pw_name
print(url.host or "127.0.0.1", url.port or 5432, user, url.database or user)
EOF
)"
# The URL's password, if any, goes to psql in its environment, never on a command line.
PG_PASSWORD="$(python -c 'import sys; from sqlalchemy.engine import make_url
print(make_url(sys.argv[1]).password or "")' "$PG_URL")"
pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" >/dev/null 2>&1; }
pg_as_test_role() {
  env ${PG_PASSWORD:+"PGPASSWORD=$PG_PASSWORD"} \
    psql -h "$PG_HOST" -p "$PG_PORT" -U "$PG_USER" -d "$PG_DB" "$@"
}
# psql as a superuser of that server: `postgres` over TCP (trust auth), or as root through
# the local socket as the postgres user (peer auth, Debian's default).
pg_as_admin() {
  if psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres -Atc '' >/dev/null 2>&1; then
    psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -d postgres "$@"
  elif [ "$(id -u)" = 0 ] && id postgres >/dev/null 2>&1 && command -v runuser >/dev/null \
    && case "$PG_HOST" in 127.0.0.1 | localhost | ::1) true ;; *) false ;; esac; then
    (cd / && runuser -u postgres -- psql -p "$PG_PORT" -d postgres "$@")
  else
    return 1
  fi
}
pg_problem=""
if ! command -v psql >/dev/null || ! command -v pg_isready >/dev/null; then
  pg_problem="PostgreSQL's client tools (psql, pg_isready) are not installed"
else
  # Debian's cluster on that port, if there is one (pg_lsclusters: version name port ...).
  cluster=""
  if ! pg_ready && command -v pg_lsclusters >/dev/null \
    && case "$PG_HOST" in 127.0.0.1 | localhost | ::1) true ;; *) false ;; esac; then
    cluster="$(pg_lsclusters -h | awk -v port="$PG_PORT" '$3 == port {print $1, $2; exit}')"
  fi
  if [ -n "$cluster" ]; then
    echo "starting PostgreSQL $cluster"
    # shellcheck disable=SC2086  # version and name, two words
    pg_ctlcluster --skip-systemctl-redirect $cluster start || true
    for _ in $(seq 30); do pg_ready && break; sleep 1; done
  fi
  if ! pg_ready; then
    pg_problem="no PostgreSQL answers on $PG_HOST:$PG_PORT"
  elif ! pg_as_test_role -Atc '' >/dev/null 2>&1; then
    echo "creating PostgreSQL role $PG_USER and database $PG_DB"
    # psql's :"name" quotes an identifier, :'name' a literal; it interpolates only on stdin.
    if ! pg_as_admin -v ON_ERROR_STOP=1 -qAt -v role="$PG_USER" -v db="$PG_DB" <<'EOF' >/dev/null
SELECT NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'role') AS no_role \gset
\if :no_role
CREATE ROLE :"role" LOGIN CREATEDB;
\endif
SELECT NOT EXISTS (SELECT FROM pg_database WHERE datname = :'db') AS no_db \gset
\if :no_db
CREATE DATABASE :"db" OWNER :"role";
\endif
EOF
    then
      pg_problem="the role $PG_USER cannot log in to database $PG_DB, and no superuser"
      pg_problem+=" connection (postgres without a password, or root through the local socket)"
      pg_problem+=" could create them"
    elif ! pg_as_test_role -Atc '' >/dev/null 2>&1; then
      pg_problem="role $PG_USER and database $PG_DB exist, but $PG_USER cannot log in without"
      pg_problem+=" a password (trust auth in pg_hba.conf, or a password in FL_TEST_PG_URL)"
    fi
  fi
fi
if [ -n "$pg_problem" ]; then
  echo "PostgreSQL: $pg_problem." >&2
  echo "The integration, e2e and containers tiers (and the benchmarks) need a PostgreSQL 13 or" \
    "later on $PG_HOST:$PG_PORT on which the role $PG_USER logs in without a password and may" \
    "create databases, a database $PG_DB, the client tools (psql, pg_isready) and the server" \
    "binaries (initdb, pg_ctl on PATH or under /usr/lib/postgresql/*/bin, for the tests that" \
    "run a PostgreSQL of their own; as root they run as the user postgres). On Debian run as" \
    "root, tests/run.sh starts the cluster and creates the role and the database; elsewhere" \
    "start one yourself (initdb -A trust -U postgres -D DIR && pg_ctl -D DIR -o '-p 5432' start)" \
    "or set FL_TEST_PG_URL. The unit tier needs none of it: bash tests/run.sh -m unit" >&2
  status=1
fi

if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  if command -v redis-server >/dev/null && command -v redis-cli >/dev/null; then
    echo "starting Redis"
    mkdir -p /var/lib/redis /var/log/redis
    redis-server --daemonize yes --bind 127.0.0.1 --port 6379 --save "" --appendonly no \
      --dir /var/lib/redis --logfile /var/log/redis/ci.log
    for _ in $(seq 30); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 1; done
    redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 || { echo "Redis did not start" >&2; status=1; }
  else
    # The integration and e2e tiers also start Redis servers of their own (redis-server).
    echo "Redis: redis-server and redis-cli are not installed (Debian: redis-server); the" \
      "integration and e2e tiers need them, and a Redis on 127.0.0.1:6379" >&2
    status=1
  fi
fi
exit "$status"
