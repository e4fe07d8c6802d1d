# The floor of `pgfleet bench major-upgrade`, run in the primary's Pod
# (pods/exec, as the instance's user, with its binaries): a copy of the same
# data (pg_basebackup), then the least an in-place upgrade must do while
# writes are refused — stop, `pg_upgrade --link`, start — with the new
# cluster initialised beforehand, outside that window.
# Usage: sh -c "$SCRIPT" floor prepare|window|cleanup OLD_BIN NEW_BIN POD_IP PORT
set -eu
phase=$1 old=$2 new=$3 ip=$4 port=$5
f="$PGDATA/../bench-floor"
sock="$f/sock"
opts="-c port=$port -c listen_addresses='$ip' -c unix_socket_directories='$sock'"
now() { date +%s%N; }
stop_all() {
  "$new/pg_ctl" -D "$f/new" status >/dev/null 2>&1 && "$new/pg_ctl" -D "$f/new" -w stop -m immediate >/dev/null 2>&1 || true
  "$old/pg_ctl" -D "$f/old" status >/dev/null 2>&1 && "$old/pg_ctl" -D "$f/old" -w stop -m immediate >/dev/null 2>&1 || true
}
case "$phase" in
prepare)
  stop_all
  rm -rf "$f"; mkdir -p "$sock"; chmod 700 "$f"
  # As a replica clones: the replication role, its password from the Pod.
  pw=$(sed -e 's/\\/\\\\/g' -e 's/:/\\:/g' "${PGFLEET_SECRETS:-/etc/pgfleet/secrets}/replication-password")
  (umask 077 && printf '*:*:*:replicator:%s\n' "$pw" > "$f/pgpass")
  PGPASSFILE="$f/pgpass" "$old/pg_basebackup" -h "$ip" -p 5432 -U replicator -D "$f/old" -X stream -c fast
  # Only the data: none of pgfleet's settings (archiving, replication).
  rm -f "$f/old/standby.signal" "$f/old/recovery.signal"
  : > "$f/old/postgresql.auto.conf"
  [ ! -e "$f/old/pgfleet.conf" ] || : > "$f/old/pgfleet.conf"
  # Without pgfleet's settings the copy has no TLS: its TLS-only rules
  # read as plain-text ones (as instance.sh does for an image without SSL).
  sed -i -e 's/^hostssl /host /' -e '/^hostnossl all all all reject$/d' "$f/old/pg_hba.conf"
  "$old/pg_ctl" -D "$f/old" -w -l "$f/old.log" -o "$opts" start >/dev/null
  set -- $("$old/psql" -h "$sock" -p "$port" -U postgres -XAtq -F ' ' -c \
    "SELECT pg_encoding_to_char(encoding), datcollate, datctype FROM pg_database WHERE datname = 'template1'")
  ck=--no-data-checksums
  "$old/pg_controldata" "$f/old" | grep -q 'Data page checksum version: *0' || ck=--data-checksums
  "$new/initdb" -D "$f/new" -U postgres -E "$1" --lc-collate="$2" --lc-ctype="$3" "$ck" >/dev/null
  cp "$f/old/pg_hba.conf" "$f/new/pg_hba.conf"
  echo '{"prepared":true}'
  ;;
window)
  t0=$(now)
  "$old/pg_ctl" -D "$f/old" -w stop -m fast >/dev/null
  t1=$(now)
  (cd "$f" && "$new/pg_upgrade" --link -b "$old" -B "$new" -d "$f/old" -D "$f/new" -U postgres \
    -s "$sock" -p 50532 -P 50533 >"$f/upgrade.log" 2>&1) || { cat "$f/upgrade.log" >&2; exit 1; }
  t2=$(now)
  "$new/pg_ctl" -D "$f/new" -w -l "$f/new.log" -o "$opts" start >/dev/null
  t3=$(now)
  echo "{\"stop_ms\":$(((t1 - t0) / 1000000)),\"pg_upgrade_ms\":$(((t2 - t1) / 1000000)),\"start_ms\":$(((t3 - t2) / 1000000))}"
  ;;
cleanup)
  stop_all
  rm -rf "$f"
  echo '{"cleaned":true}'
  ;;
esac
