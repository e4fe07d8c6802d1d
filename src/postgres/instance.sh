#!/bin/sh
# pgfleet-instance — the instance contract between the pgfleet manager and one
# PostgreSQL instance (contract version 1, docs/instance-contract.md).
#
# The manager never connects to a pod: it runs `pgfleet-instance <verb>`
# through pods/exec. The container's command is `pgfleet-instance run`, so the
# same pod spec works with the stock postgres image and in the embedded
# runtime. Needs POSIX sh and the PostgreSQL client/server tools of the image.
#
# Environment (set by the pod spec):
#   PGDATA                 data directory (on the instance's PVC)
#   POD_NAME, POD_IP       from the downward API
#   PGFLEET_CLUSTER        the PostgresCluster name
#   PGFLEET_INIT           initdb | clone — how an empty PGDATA is created
#   PGFLEET_PRIMARY_HOST   the -rw Service: where replicas stream from
#   PGFLEET_PODINFO        downward-API dir with `labels` (wanted role lives there)
#   PGFLEET_CONFIG         ConfigMap dir with postgresql.conf and pg_hba.conf
#   PGFLEET_SECRETS        dir with superuser-password and replication-password
set -eu

CONTRACT=1
PODINFO=${PGFLEET_PODINFO:-/etc/pgfleet/podinfo}
CONFIG=${PGFLEET_CONFIG:-/etc/pgfleet/config}
SECRETS=${PGFLEET_SECRETS:-/etc/pgfleet/secrets}
SOCKDIR=${PGFLEET_SOCKET_DIR:-/tmp}
PGBIN=${PGFLEET_PGBIN:-}
# In the pod's own /tmp (an emptyDir): a new pod starts unfenced, and the
# wanted-role label decides whether it may run as primary.
FENCE="${SOCKDIR}/pgfleet.fenced"

bin() { if [ -n "$PGBIN" ]; then echo "$PGBIN/$1"; else echo "$1"; fi; }
log() { echo "pgfleet-instance: $*" >&2; }
sql() { "$(bin psql)" -h "$SOCKDIR" -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 -c "$1"; }

# Set by `demote` until `promote`/`unfence`: the run loop must restart a
# demoted primary as a standby even before its label changes.
DEMOTED="${SOCKDIR}/pgfleet.demoted"

wanted_role() {
  if [ -e "$DEMOTED" ]; then echo replica; return; fi
  if grep -q 'pgfleet.io/role="primary"' "$PODINFO/labels" 2>/dev/null; then echo primary; else echo replica; fi
}

primary_conninfo() {
  echo "host=${PGFLEET_PRIMARY_HOST} port=5432 user=replicator passfile=$PGDATA/../pgpass application_name=${POD_NAME} sslmode=prefer"
}

write_passfile() {
  umask 077
  printf '*:*:*:replicator:%s\n' "$(cat "$SECRETS/replication-password")" > "$PGDATA/../pgpass"
}

configure() {
  cp "$CONFIG/postgresql.conf" "$PGDATA/pgfleet.conf"
  cp "$CONFIG/pg_hba.conf" "$PGDATA/pg_hba.conf"
  grep -q "include_if_exists = 'pgfleet.conf'" "$PGDATA/postgresql.conf" ||
    echo "include_if_exists = 'pgfleet.conf'" >> "$PGDATA/postgresql.conf"
  if [ "$(wanted_role)" = replica ]; then
    {
      echo "primary_conninfo = '$(primary_conninfo)'"
      echo "primary_slot_name = '$(echo "$POD_NAME" | tr '-' '_')'"
    } > "$PGDATA/pgfleet-standby.conf"
    grep -q "include_if_exists = 'pgfleet-standby.conf'" "$PGDATA/postgresql.conf" ||
      echo "include_if_exists = 'pgfleet-standby.conf'" >> "$PGDATA/postgresql.conf"
    touch "$PGDATA/standby.signal"
  else
    : > "$PGDATA/pgfleet-standby.conf"
    rm -f "$PGDATA/standby.signal"
  fi
}

do_initdb() {
  log "initdb in $PGDATA"
  "$(bin initdb)" -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 \
    --pwfile="$SECRETS/superuser-password" --data-checksums >&2
  "$(bin pg_ctl)" -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$SOCKDIR" start >&2
  sql "CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD '$(cat "$SECRETS/replication-password")'" >&2
  "$(bin pg_ctl)" -D "$PGDATA" -w -m fast stop >&2
}

do_clone() {
  log "cloning from $PGFLEET_PRIMARY_HOST"
  until "$(bin pg_isready)" -h "$PGFLEET_PRIMARY_HOST" -p 5432 -q; do sleep 1; done
  rm -rf "${PGDATA:?}"/*
  slot=$(echo "$POD_NAME" | tr '-' '_')
  # Create this replica's slot as part of the clone; it may exist already.
  PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_basebackup)" -h "$PGFLEET_PRIMARY_HOST" -U replicator \
    -D "$PGDATA" -X stream -c fast -C -S "$slot" >&2 ||
  { rm -rf "${PGDATA:?}"/*
    PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_basebackup)" -h "$PGFLEET_PRIMARY_HOST" -U replicator \
      -D "$PGDATA" -X stream -c fast >&2; }
}

# A former primary told to be a replica rewinds to the new timeline first,
# and re-clones when rewind cannot help.
do_rewind() {
  log "rewinding to follow $PGFLEET_PRIMARY_HOST"
  if ! PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_rewind)" -D "$PGDATA" \
      --source-server="host=$PGFLEET_PRIMARY_HOST port=5432 user=postgres dbname=postgres" >&2; then
    log "pg_rewind failed; re-cloning"
    do_clone
  fi
}

# Supervises postgres instead of exec'ing it, so that a clean demotion or a
# fence stops PostgreSQL without ending the container: the loop starts it
# again in the role the pod's labels ask for (or waits while fenced).
cmd_run() {
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  write_passfile
  if [ ! -s "$PGDATA/PG_VERSION" ]; then
    if [ "${PGFLEET_INIT:-clone}" = initdb ] && [ "$(wanted_role)" = primary ]; then do_initdb; else do_clone; fi
  fi
  stop=0
  pid=""
  trap 'stop=1; [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null' TERM INT
  while [ "$stop" = 0 ]; do
    while [ -e "$FENCE" ] && [ "$stop" = 0 ]; do sleep 0.2; done
    [ "$stop" = 0 ] || break
    if [ "$(wanted_role)" = replica ] && [ ! -e "$PGDATA/standby.signal" ]; then
      do_rewind
    fi
    configure
    "$(bin postgres)" -D "$PGDATA" -c listen_addresses="${POD_IP:-*}" -c unix_socket_directories="$SOCKDIR" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
    pid=""
    [ "$stop" = 0 ] || break
    log "postgres stopped; starting it again as $(wanted_role)"
    sleep 0.2
  done
}

cmd_status() {
  out=$(sql "SELECT json_build_object(
      'contract', $CONTRACT,
      'role', CASE WHEN pg_is_in_recovery() THEN 'replica' ELSE 'primary' END,
      'ready', true,
      'timeline', CASE WHEN pg_is_in_recovery()
          THEN (SELECT received_tli FROM pg_stat_wal_receiver)
          ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
      'currentLsn', CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END,
      'receivedLsn', pg_last_wal_receive_lsn()::text,
      'replayedLsn', pg_last_wal_replay_lsn()::text,
      'version', current_setting('server_version'),
      'pendingRestart', EXISTS (SELECT 1 FROM pg_settings WHERE pending_restart))" 2>/dev/null) ||
    out="{\"contract\":$CONTRACT,\"role\":\"stopped\",\"ready\":false,\"fenced\":$([ -e "$FENCE" ] && echo true || echo false)}"
  echo "$out"
}

cmd_promote() {
  rm -f "$DEMOTED"
  if [ "$(sql "SELECT pg_is_in_recovery()")" = t ]; then
    "$(bin pg_ctl)" -D "$PGDATA" -w -t 60 promote >&2
  fi
  sql "SELECT pg_is_in_recovery()" | grep -q f && echo "{\"contract\":$CONTRACT,\"promoted\":true}"
}

# Clean demotion for a switchover: standby.signal first, then a fast
# shutdown (walsenders send all WAL up to the shutdown checkpoint first); the
# run loop starts it again as a standby. Prints the final WAL position.
cmd_demote() {
  touch "$DEMOTED"
  touch "$PGDATA/standby.signal"
  "$(bin pg_ctl)" -D "$PGDATA" -w -m fast stop >&2 || true
  lsn=$("$(bin pg_controldata)" -D "$PGDATA" | sed -n 's/^Latest checkpoint location: *//p')
  echo "{\"contract\":$CONTRACT,\"demoted\":true,\"lsn\":\"$lsn\"}"
}

# Fencing stops the instance and keeps it stopped (run waits while the fence
# file exists), so a lost primary can never take writes again on its own.
cmd_fence() {
  touch "$FENCE"
  "$(bin pg_ctl)" -D "$PGDATA" -w -m fast stop >&2 || true
  echo "{\"contract\":$CONTRACT,\"fenced\":true}"
}

cmd_unfence() { rm -f "$FENCE" "$DEMOTED"; echo "{\"contract\":$CONTRACT,\"fenced\":false}"; }

# `reload [HASH]`: with a hash, first wait until the mounted ConfigMap
# carries it (the kubelet refreshes ConfigMap volumes with a delay).
cmd_reload() {
  if [ -n "${2:-}" ]; then
    n=0
    until grep -q "pgfleet-config-hash: $2" "$CONFIG/postgresql.conf"; do
      n=$((n + 1)); [ "$n" -le 110 ] || { log "configuration $2 not mounted yet"; exit 75; }
      sleep 1
    done
  fi
  configure
  "$(bin pg_ctl)" -D "$PGDATA" reload >&2
  echo "{\"contract\":$CONTRACT,\"reloaded\":true}"
}

# One physical slot per listed instance, so a replica never loses WAL it
# still needs (after a failover the new primary has none); inactive slots of
# instances no longer listed are dropped.
cmd_slots() {
  shift
  keep=""
  for n in "$@"; do
    slot=$(echo "$n" | tr '-' '_')
    keep="$keep,'$slot'"
    sql "SELECT pg_create_physical_replication_slot('$slot', true) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$slot')" >/dev/null
  done
  sql "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active AND slot_type = 'physical' AND slot_name NOT IN (''$keep)" >/dev/null
  echo "{\"contract\":$CONTRACT,\"slots\":$#}"
}

cmd_checkpoint() { sql "CHECKPOINT" >/dev/null && echo "{\"contract\":$CONTRACT,\"checkpoint\":true}"; }

case "${1:-}" in
  run) cmd_run ;;
  status) cmd_status ;;
  promote) cmd_promote ;;
  demote) cmd_demote ;;
  fence) cmd_fence ;;
  unfence) cmd_unfence ;;
  reload) cmd_reload "$@" ;;
  checkpoint) cmd_checkpoint ;;
  slots) cmd_slots "$@" ;;
  version) echo "{\"contract\":$CONTRACT}" ;;
  *) echo "usage: pgfleet-instance run|status|promote|demote|fence|unfence|reload|checkpoint|slots NAME...|version" >&2; exit 64 ;;
esac
