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
#   PGFLEET_INIT           initdb | clone | restore — how an empty PGDATA is created
#   PGFLEET_PRIMARY_HOST   the -rw Service: where replicas stream from
#   PGFLEET_PODINFO        downward-API dir with `labels` (wanted role lives there)
#   PGFLEET_CONFIG         ConfigMap dir with postgresql.conf and pg_hba.conf
#   PGFLEET_SECRETS        dir with superuser-password and replication-password
#   PGFLEET_RESTORE_REPO_PATH, PGFLEET_RESTORE_SET, PGFLEET_RESTORE_TARGET_TIME
#                          where `PGFLEET_INIT=restore` restores from
#   PGFLEET_SERVER_TLS     dir with ca.crt, tls.crt, tls.key: PostgreSQL's own
#                          TLS (ssl = on, replication with verify-full)
#   PGFLEET_BACKUP_TLS     dir with ca.crt, tls.crt, tls.key: pgBackRest's TLS
#                          server runs, and backups may come from a standby
#   PGBACKREST_REPO1_S3_KEY, PGBACKREST_REPO1_S3_KEY_SECRET
#                          object-store credentials (never in pgbackrest.conf)
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

# pgBackRest: one repository (repo1), stanza `db`, configured by the manager
# in the ConfigMap. Credentials come from the environment only.
PGBR_CONF="$CONFIG/pgbackrest.conf"
STANZA_BUSY="${PGDATA:-.}/../pgfleet.stanza-busy"
# In the pod's /tmp: why the last restore attempt failed (cleared when one
# succeeds), and which initialisation is running right now.
INIT_FAILED="${SOCKDIR}/pgfleet.restore-failed"
INITIALIZING="${SOCKDIR}/pgfleet.initializing"
# In the pod's /tmp while the run loop rewinds (or re-clones) this
# instance: reported by `status`, so the manager does not fail over a
# primary side's demoted instance that is only slow to rewind.
REWINDING="${SOCKDIR}/pgfleet.rewinding"
# In the pod's /tmp: touched when the container starts and each time the
# run loop launches postgres; `ready` waits for a server launched recently.
STARTING="${SOCKDIR}/pgfleet.starting"

# BEGIN quoting helpers (src/postgres/shell_tests.rs runs this block alone).
# Nothing from a spec or a Secret is pasted into shell, SQL or a config
# file unquoted: every value goes through one of these, and a value that
# cannot be quoted for its file (a line break) is refused.
NL='
'
CR=$(printf '\r')
# True when $1 has no line break (every file below is line-oriented).
one_line() { case "$1" in *"$NL"*|*"$CR"*) return 1 ;; *) return 0 ;; esac; }
# $1 as a postgresql.conf string: in '...', ' doubled and \ doubled.
conf_q() { printf "'%s'" "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e "s/'/''/g")"; }
# $1 as a libpq conninfo value: in '...', ' and \ escaped with \.
conninfo_q() { printf "'%s'" "$(printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e "s/'/\\\\'/g")"; }
# $1 as one field of a .pgpass line: : and \ escaped with \.
pgpass_field() { printf '%s' "$1" | sed -e 's/\\/\\\\/g' -e 's/:/\\:/g'; }
# A path pasted into a command PostgreSQL runs through the shell and that
# pgBackRest writes into postgresql.auto.conf without escaping
# (restore_command): only characters that need no quoting in either.
safe_path() { case "$1" in ''|*[!A-Za-z0-9._/-]*) return 1 ;; *) return 0 ;; esac; }
# END quoting helpers

bin() { if [ -n "$PGBIN" ]; then echo "$PGBIN/$1"; else echo "$1"; fi; }
log() { echo "pgfleet-instance: $*" >&2; }
sql() { "$(bin psql)" -h "$SOCKDIR" -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 -c "$1"; }
# `sqlj NAME VALUE QUERY`: QUERY with the psql variable NAME (use :'NAME').
# How JSON from pgBackRest is parsed: the image has no jq, PostgreSQL has.
sqlj() { printf '%s\n' "$3" | "$(bin psql)" -h "$SOCKDIR" -U postgres -d postgres -XAtq -v ON_ERROR_STOP=1 -v "$1=$2" -f -; }
# json_agg puts newlines between elements; a verb prints one line.
oneline() { printf '%s' "$1" | tr -d '\n'; echo; }
# One-line JSON string body (no quotes around it) for free text.
json_str() { printf '%s' "$1" | tr '\n\t\r' '   ' | tr -d '\000-\037' | sed 's/\\/\\\\/g; s/"/\\"/g'; }

pgbr() {
  if [ ! -f "$PGBR_CONF" ]; then
    log "backups are not configured: $PGBR_CONF does not exist"
    return 78
  fi
  # $PGDATA and the socket dir of this pod win over the file; pgBackRest
  # rejects command-line options a command does not take.
  cmd=$1; shift
  case "$cmd" in
    stanza-create|stanza-upgrade|backup|check) set -- --pg1-path="${PGDATA:?}" --pg1-socket-path="$SOCKDIR" "$@" ;;
    archive-push|archive-get|restore) set -- --pg1-path="${PGDATA:?}" "$@" ;;
  esac
  "${PGFLEET_PGBACKREST:-pgbackrest}" --config="$PGBR_CONF" --stanza=db "$cmd" "$@"
}

# pgBackRest's TLS server, for backups from a standby (docs/backups.md):
# every instance runs it when the manager mounted the cluster's certificate
# (PGFLEET_BACKUP_TLS); a standby's backup drives the primary's through the
# -rw Service. Only the cluster's own certificate (CN pgfleet) gets in.
TLS_DIR=${PGFLEET_BACKUP_TLS:-}
TLS_PORT=8432
# pgBackRest wants a key file only its owner can read; the Secret's files
# are group-readable.
TLS_KEY="${SOCKDIR}/pgbackrest-tls.key"
tls_on() { [ -n "$TLS_DIR" ] && [ -s "$TLS_DIR/tls.crt" ] && [ -f "$PGBR_CONF" ]; }
tls_key() { (umask 077 && cat "$TLS_DIR/tls.key" > "$TLS_KEY"); }

# Runs (and restarts) the TLS server for the life of the container.
serve_backrest() {
  tls_on || return 0
  tls_key
  while :; do
    "${PGFLEET_PGBACKREST:-pgbackrest}" --config="$PGBR_CONF" server \
      --tls-server-address="${POD_IP:-*}" --tls-server-port="$TLS_PORT" \
      --tls-server-cert-file="$TLS_DIR/tls.crt" --tls-server-key-file="$TLS_KEY" \
      --tls-server-ca-file="$TLS_DIR/ca.crt" --tls-server-auth=pgfleet=db >&2 ||
      log "pgbackrest server exited ($?); starting it again"
    sleep 1
  done
}

# PostgreSQL's TLS (docs/security.md): the server certificate for the
# cluster's Service names and the cluster CA. PostgreSQL wants its key
# 0600 and owned by itself; the Secret's files are group-readable (and on
# a real kubelet owned by root), so `configure` copies the pair, together,
# into the Pod's /tmp. A Pod made before TLS has no certificate: it keeps
# plain text (hostssl rules read as host) until it is replaced.
SERVER_TLS=${PGFLEET_SERVER_TLS:-}
# Whether this PostgreSQL (server and libpq) was built with TLS: without it
# `ssl_ciphers` defaults to "none". An image built that way runs, and says
# so in the log, rather than failing to start (docs/security.md).
ssl_built() {
  if [ -z "${SSL_BUILT:-}" ]; then
    c=$("$(bin postgres)" --describe-config 2>/dev/null | awk -F '\t' '$1 == "ssl_ciphers" {print $5}')
    if [ "$c" = none ]; then SSL_BUILT=no; else SSL_BUILT=yes; fi
  fi
  [ "$SSL_BUILT" = yes ]
}
server_tls_on() { [ -n "$SERVER_TLS" ] && [ -s "$SERVER_TLS/tls.crt" ] && [ -s "$SERVER_TLS/tls.key" ] && ssl_built; }
# libpq options for connections to the primary: the -rw Service's name is
# in the certificate, the CA is the cluster's.
# Across member clusters the address dialled is a load balancer's, which no
# certificate names: verify-ca (every side's certificate comes from the
# topology's one CA, which only the manager can sign with).
repl_ssl() {
  if server_tls_on && { designated || [ "${1:-}" = remote ]; }; then
    echo "sslmode=verify-ca sslrootcert=$(conninfo_q "$SERVER_TLS/ca.crt")"
  elif server_tls_on; then
    echo "sslmode=verify-full sslrootcert=$(conninfo_q "$SERVER_TLS/ca.crt")"
  else
    echo "sslmode=prefer"
  fi
}
# The fingerprint the manager names in `reload-tls`: SHA-256 of the mounted
# tls.crt followed by tls.key.
tls_fingerprint() { cat "$SERVER_TLS/tls.crt" "$SERVER_TLS/tls.key" 2>/dev/null | sha256sum | cut -d' ' -f1; }

configure_tls() {
  if server_tls_on; then
    (umask 077
     cat "$SERVER_TLS/tls.crt" > "$SOCKDIR/server-tls.crt.new"
     cat "$SERVER_TLS/tls.key" > "$SOCKDIR/server-tls.key.new"
     cat "$SERVER_TLS/ca.crt" > "$SOCKDIR/server-tls.ca.new"
     mv "$SOCKDIR/server-tls.crt.new" "$SOCKDIR/server-tls.crt"
     mv "$SOCKDIR/server-tls.key.new" "$SOCKDIR/server-tls.key"
     mv "$SOCKDIR/server-tls.ca.new" "$SOCKDIR/server-tls.ca")
    {
      echo "ssl = on"
      echo "ssl_cert_file = $(conf_q "$SOCKDIR/server-tls.crt")"
      echo "ssl_key_file = $(conf_q "$SOCKDIR/server-tls.key")"
      echo "ssl_ca_file = $(conf_q "$SOCKDIR/server-tls.ca")"
      echo "ssl_min_protocol_version = 'TLSv1.2'"
    } >> "$PGDATA/pgfleet.conf"
    cp "$CONFIG/pg_hba.conf" "$PGDATA/pg_hba.conf"
  else
    if ssl_built; then
      log "no server certificate in ${SERVER_TLS:-(PGFLEET_SERVER_TLS unset)}: TLS stays off until this Pod is replaced"
    else
      log "WARNING: this PostgreSQL is built without SSL support: TLS stays off (use an image built with OpenSSL)"
    fi
    sed -e 's/^hostssl /host /' -e '/^hostnossl all all all reject$/d' "$CONFIG/pg_hba.conf" > "$PGDATA/pg_hba.conf"
  fi
}

# Set by `demote` until `promote`/`unfence`: the run loop must restart a
# demoted primary as a standby even before its label changes.
DEMOTED="${SOCKDIR}/pgfleet.demoted"

# Disaster recovery across member clusters (docs/disaster-recovery.md): in
# a replica cluster the ConfigMap's `replica-source` holds one line
# "HOST PORT NAME" — the primary side's exposed address and this side's
# name there. The instance labelled primary is then the *designated
# primary*: a standby of that address, which the other instances follow
# through -rw (cascading). Nothing in a replica cluster is ever promoted by
# `promote`; only a ConfigMap without `replica-source` lets it be.
REPLICA_SOURCE="$CONFIG/replica-source"
labelled_primary() { grep -q 'pgfleet.io/role="primary"' "$PODINFO/labels" 2>/dev/null; }
replica_cluster() { [ -s "$REPLICA_SOURCE" ]; }
designated() { replica_cluster && [ ! -e "$DEMOTED" ] && labelled_primary; }
source_field() { awk -v f="$1" 'NR == 1 {print $f}' "$REPLICA_SOURCE"; }
upstream_host() { if designated; then source_field 1; else echo "$PGFLEET_PRIMARY_HOST"; fi; }
upstream_port() { if designated; then source_field 2; else echo 5432; fi; }

wanted_role() {
  if [ -e "$DEMOTED" ] || replica_cluster; then echo replica; return; fi
  if labelled_primary; then echo primary; else echo replica; fi
}

# The primary side's watchdog (docs/disaster-recovery.md, "Why there are
# never two primaries"): the ConfigMap's `dr-watchdog` holds FENCE_AFTER in
# seconds. Contact is a manager heartbeat (`status dr`, which only the
# manager runs, through this cluster's API server) or a replica side
# streaming with a reply within FENCE_AFTER. A primary without either for
# FENCE_AFTER fences itself; the manager promotes another side only after
# twice that. The last contact is kept on the volume, so a Pod that starts
# again after a long silence starts fenced.
WATCHDOG="$CONFIG/dr-watchdog"
HEARTBEAT="${SOCKDIR}/pgfleet.dr-heartbeat"
CONTACT="$PGDATA/../pgfleet.dr-contact"
watchdog_on() { [ -s "$WATCHDOG" ] && ! replica_cluster && labelled_primary; }
age_of() { if [ -e "$1" ]; then echo $(( $(date +%s) - $(stat -c %Y "$1") )); else echo 999999; fi; }
replica_side_contact() {
  [ "$(sql "SELECT count(*) FROM pg_stat_replication WHERE application_name LIKE 'dr-%'
    AND reply_time > now() - make_interval(secs => $1)" 2>/dev/null)" -gt 0 ] 2>/dev/null
}
dr_watchdog() {
  # The silence so far is the volume's: a container started again does not
  # get a fresh window.
  if [ -e "$CONTACT" ]; then touch -r "$CONTACT" "$HEARTBEAT"; else touch "$HEARTBEAT"; fi
  while sleep 1; do
    [ ! -e "$FENCE" ] || continue
    rec=$(sql "SELECT pg_is_in_recovery()" 2>/dev/null) || continue
    # A standby (of this cluster or another) can only become this side's
    # primary by the manager's promotion, which is contact: its window
    # starts then. (Not while stopped: a crash must not extend it.)
    if [ "$rec" = t ] || ! watchdog_on; then touch "$HEARTBEAT"; continue; fi
    after=$(head -c 16 "$WATCHDOG" | tr -cd 0-9)
    [ -n "$after" ] || continue
    if [ "$(age_of "$HEARTBEAT")" -lt "$after" ] || replica_side_contact "$after"; then
      touch "$CONTACT"
      continue
    fi
    [ "$(sql "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ] || continue
    log "fencing: no manager heartbeat and no replica side for ${after}s (DR watchdog)"
    touch "$FENCE"
    "$(bin pg_ctl)" -D "$PGDATA" -w -m immediate stop >&2 || true
  done
}
# At start: a primary-side instance whose last contact is older than the
# fence window stays fenced until the manager unfences it.
start_fenced_if_silent() {
  watchdog_on || return 0
  after=$(head -c 16 "$WATCHDOG" | tr -cd 0-9)
  if [ -n "$after" ] && [ -e "$CONTACT" ] && [ "$(age_of "$CONTACT")" -ge "$after" ]; then
    log "starting fenced: no contact with the manager or a replica side for $(age_of "$CONTACT")s (DR watchdog)"
    touch "$FENCE"
  fi
}

# The designated primary names itself by its side (dr-<member>) on the
# primary side and uses no slot there: the primary side's own instances
# have the same pod names, and a slot would keep WAL forever for a
# replica side that is gone (wal_keep_size bounds it instead).
app_name() { if designated; then echo "dr-$(source_field 3)"; else echo "$POD_NAME"; fi; }

primary_conninfo() {
  echo "host=$(conninfo_q "$(upstream_host)") port=$(conninfo_q "$(upstream_port)") user=replicator passfile=$(conninfo_q "$PGDATA/../pgpass") application_name=$(conninfo_q "$(app_name)") $(repl_ssl)"
}

# A password is one line (a trailing newline in the Secret is ignored);
# in .pgpass its : and \ are escaped, or libpq would split it.
write_passfile() {
  umask 077
  pw=$(cat "$SECRETS/replication-password")
  one_line "$pw" || { log "the replication password contains a line break; refusing it"; exit 78; }
  printf '*:*:*:replicator:%s\n' "$(pgpass_field "$pw")" > "$PGDATA/../pgpass"
}

# Creates the replication role. The password is never in an argv or in
# the SQL text: psql reads the file itself (a backquoted command in its
# script, with the path from the environment) and quotes it as a literal.
create_replicator() {
  PGFLEET_PWFILE="$SECRETS/replication-password" "$(bin psql)" -h "$SOCKDIR" -U postgres -d postgres \
    -XAtq -v ON_ERROR_STOP=1 -f - <<'SQL'
\set pw `cat "$PGFLEET_PWFILE"`
CREATE ROLE replicator WITH REPLICATION LOGIN PASSWORD :'pw';
SQL
  sql "$REWIND_GRANTS"
}

# What pg_rewind needs of its source server, granted to `replicator` so a
# former primary rewinds over TCP without the superuser (which pg_hba
# refuses there). Idempotent: also run after every promotion, which covers
# clusters initialised before the grants existed.
REWIND_GRANTS="GRANT EXECUTE ON FUNCTION pg_catalog.pg_ls_dir(text, boolean, boolean) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_stat_file(text, boolean) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean) TO replicator;
GRANT EXECUTE ON FUNCTION pg_catalog.pg_control_checkpoint() TO replicator;"

# `configure start` (the run loop, PostgreSQL not running) also sets or
# clears standby.signal for the role. Any other call (a reload) leaves the
# signal alone: a running standby must keep it until PostgreSQL removes it
# on promotion (without it the promotion fails, and the crash recovery
# after makes a primary on the OLD timeline), and a stopped former primary
# must not get one, or the run loop would skip its rewind.
configure() {
  cp "$CONFIG/postgresql.conf" "$PGDATA/pgfleet.conf"
  configure_tls
  grep -q "include_if_exists = 'pgfleet.conf'" "$PGDATA/postgresql.conf" ||
    echo "include_if_exists = 'pgfleet.conf'" >> "$PGDATA/postgresql.conf"
  if [ "$(wanted_role)" = replica ]; then
    {
      echo "primary_conninfo = $(conf_q "$(primary_conninfo)")"
      designated || echo "primary_slot_name = $(conf_q "$(echo "$POD_NAME" | tr '-' '_')")"
    } > "$PGDATA/pgfleet-standby.conf"
    grep -q "include_if_exists = 'pgfleet-standby.conf'" "$PGDATA/postgresql.conf" ||
      echo "include_if_exists = 'pgfleet-standby.conf'" >> "$PGDATA/postgresql.conf"
    if [ "${1:-}" = start ]; then touch "$PGDATA/standby.signal"; fi
  else
    : > "$PGDATA/pgfleet-standby.conf"
    if [ "${1:-}" = start ]; then rm -f "$PGDATA/standby.signal"; fi
  fi
}

do_initdb() {
  log "initdb in $PGDATA"
  # Without a superuser Secret (superuser access off) postgres gets no
  # password: it can only log in on the local socket.
  set -- -D "$PGDATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 --data-checksums
  [ -s "$SECRETS/superuser-password" ] && set -- "$@" --pwfile="$SECRETS/superuser-password"
  "$(bin initdb)" "$@" >&2
  "$(bin pg_ctl)" -D "$PGDATA" -w -o "-c listen_addresses='' -c unix_socket_directories=$SOCKDIR" start >&2
  create_replicator >&2
  "$(bin pg_ctl)" -D "$PGDATA" -w -m fast stop >&2
}

do_clone() {
  host=$(upstream_host) port=$(upstream_port)
  log "cloning from $host:$port"
  until "$(bin pg_isready)" -h "$host" -p "$port" -q; do sleep 1; done
  rm -rf "${PGDATA:?}"/*
  slot=$(echo "$POD_NAME" | tr '-' '_')
  if server_tls_on && designated; then export PGSSLMODE=verify-ca PGSSLROOTCERT="$SERVER_TLS/ca.crt"
  elif server_tls_on; then export PGSSLMODE=verify-full PGSSLROOTCERT="$SERVER_TLS/ca.crt"; fi
  # Create this replica's slot as part of the clone; it may exist already.
  # (The designated primary of a replica cluster uses none: see app_name.)
  designated && slot=""
  PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_basebackup)" -h "$host" -p "$port" -U replicator \
    -D "$PGDATA" -X stream -c fast ${slot:+-C -S "$slot"} >&2 ||
  { rm -rf "${PGDATA:?}"/*
    PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_basebackup)" -h "$host" -p "$port" -U replicator \
      -D "$PGDATA" -X stream -c fast >&2; }
  # A clone is a standby from birth: without the signal the run loop would
  # take it for a former primary and "rewind" it, and pg_rewind's crash
  # recovery of the copy would write WAL past the primary's.
  touch "$PGDATA/standby.signal"
}

# `PGFLEET_INIT=restore`: restore from the SOURCE repository path, replay the
# archive (to the target time, or to its end), promote, and make sure nothing
# of the source stays behind: the recovery settings pgBackRest wrote into
# postgresql.auto.conf are reset before PostgreSQL runs for real, so this
# instance archives into its own repo1-path (pgbackrest.conf) and a replica
# cloned from it, or a later standby, never reads the source's archive.
# A marker on the volume makes an interrupted restore start over.
RESTORE_SETTINGS="restore_command recovery_target recovery_target_name recovery_target_time recovery_target_xid recovery_target_lsn recovery_target_inclusive recovery_target_timeline recovery_target_action"

restore_failed() {
  log "restore failed: $1"
  printf '%s\n' "$1" > "$INIT_FAILED"
  rm -f "$INITIALIZING"
  exit 1
}

do_restore() {
  src=${PGFLEET_RESTORE_REPO_PATH:-}
  [ -n "$src" ] || restore_failed "PGFLEET_INIT=restore needs PGFLEET_RESTORE_REPO_PATH"
  [ -f "$PGBR_CONF" ] || restore_failed "PGFLEET_INIT=restore needs $PGBR_CONF"
  for p in "$src" "$PGBR_CONF" "$PGDATA" "${PGFLEET_PGBACKREST:-pgbackrest}"; do
    safe_path "$p" || restore_failed "refusing to restore: a path for restore_command has characters other than A-Z a-z 0-9 . _ / -"
  done
  echo restore > "$INITIALIZING"
  touch "$PGDATA/../pgfleet.restore-incomplete"
  rm -rf "${PGDATA:?}"/* "${PGDATA:?}"/.[!.]* 2>/dev/null || true
  set -- --repo1-path="$src"
  # Quoted for the shell PostgreSQL runs it with; safe_path above keeps
  # out what postgresql.auto.conf could not hold.
  set -- "$@" "--recovery-option=restore_command=\"${PGFLEET_PGBACKREST:-pgbackrest}\" \"--config=$PGBR_CONF\" --stanza=db \"--repo1-path=$src\" \"--pg1-path=$PGDATA\" archive-get %f \"%p\""
  [ -z "${PGFLEET_RESTORE_SET:-}" ] || set -- "$@" --set="$PGFLEET_RESTORE_SET"
  if [ -n "${PGFLEET_RESTORE_TARGET_TIME:-}" ]; then
    # pgBackRest picks the backup set by the target only in its own format
    # ("YYYY-MM-DD HH:MM:SS+00"), so RFC 3339's T and Z are rewritten.
    t=$(printf '%s' "$PGFLEET_RESTORE_TARGET_TIME" | sed 's/T/ /; s/Z$/+00/; s/z$/+00/')
    set -- "$@" --type=time --target="$t" --target-action=promote
  else
    # Replays everything the archive has, then ends recovery and promotes.
    set -- "$@" --type=default
  fi
  log "restoring from $src ${PGFLEET_RESTORE_SET:+set $PGFLEET_RESTORE_SET }${PGFLEET_RESTORE_TARGET_TIME:+to $PGFLEET_RESTORE_TARGET_TIME}"
  err="$SOCKDIR/pgfleet.restore.err"
  if ! pgbr restore --log-level-console=info --log-level-stderr=warn "$@" 2>"$err" >&2; then
    cat "$err" >&2
    restore_failed "pgbackrest restore: $(awk '/ERROR:/ {p = 1; print; next} p && /^[ \t]/ {print; next} {p = 0}' "$err" | head -c 2000)"
  fi
  cat "$err" >&2
  # Recovery: PostgreSQL replays from the source archive, reachable only on
  # the pod's socket (status says ready=false), and promotes; the run loop
  # starts it for real after.
  configure
  # archive_command stays empty meanwhile: the new timeline's first files
  # wait as .ready until the instance runs for real (and its stanza exists).
  "$(bin postgres)" -D "$PGDATA" -c listen_addresses='' -c unix_socket_directories="$SOCKDIR" \
    -c archive_command= 2>"$SOCKDIR/pgfleet.recovery.log" &
  rpid=$!
  until [ "$(sql "SELECT pg_is_in_recovery()" 2>/dev/null)" = f ]; do
    if ! kill -0 "$rpid" 2>/dev/null; then
      cat "$SOCKDIR/pgfleet.recovery.log" >&2
      restore_failed "recovery: $(grep -E 'FATAL|PANIC' "$SOCKDIR/pgfleet.recovery.log" | tail -3 | head -c 2000)"
    fi
    sleep 1
  done
  for g in $RESTORE_SETTINGS; do sql "ALTER SYSTEM RESET $g" >&2; done
  "$(bin pg_ctl)" -D "$PGDATA" -w -t 300 -m fast stop >&2
  wait "$rpid" || true
  cat "$SOCKDIR/pgfleet.recovery.log" >&2
  rm -f "$PGDATA/../pgfleet.restore-incomplete" "$INIT_FAILED" "$INITIALIZING" "$PGDATA/recovery.signal"
  log "restore finished: promoted on timeline $("$(bin pg_controldata)" -D "$PGDATA" | sed -n 's/^Latest checkpoint.s TimeLineID: *//p')"
}

# True on a primary whose last checkpoint is on its current timeline.
REWIND_SOURCE_READY="SELECT CASE WHEN pg_is_in_recovery() THEN false
  ELSE timeline_id = ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END
  FROM pg_control_checkpoint()"

# A postmaster.pid whose PID is not a running postgres is left over from a
# postgres that was killed (SIGKILL, or its container killed): the kernel
# kills every process of a container with its PID 1, and a new container
# numbers its processes from 1 again, so the stale PID often names one of
# this script's own processes. PostgreSQL then refuses to start ("lock file
# already exists"), and pg_rewind's single-user crash recovery fails the
# same way, turning every rewind into a re-clone. Removed when the PID is
# not a postgres process (as Patroni does); a live postgres keeps its file.
clear_stale_pidfile() {
  f="$PGDATA/postmaster.pid"
  [ -e "$f" ] || return 0
  p=$(head -n 1 "$f" 2>/dev/null | tr -cd 0-9)
  if [ -n "$p" ] && [ "$(cat "/proc/$p/comm" 2>/dev/null)" = postgres ]; then return 0; fi
  log "removing a stale postmaster.pid (PID ${p:-none} is not a running postgres)"
  rm -f "$f"
}

# A former primary told to be a replica rewinds to the new timeline first,
# and re-clones when rewind cannot help.
do_rewind() {
  touch "$REWINDING"
  rewind_from_source
  rm -f "$REWINDING"
}

# The source is the primary: on a replica side of a DR topology every
# instance rewinds against the primary side's primary (the replica-source;
# an instance of this side may be a standby, which pg_rewind cannot use),
# elsewhere against this cluster's primary.
rewind_from_source() {
  if replica_cluster; then
    host=$(source_field 1) port=$(source_field 2) ssl=$(repl_ssl remote)
  else
    host=$(upstream_host) port=$(upstream_port) ssl=$(repl_ssl)
  fi
  src="host=$(conninfo_q "$host") port=$(conninfo_q "$port") user=replicator dbname=postgres $ssl"
  # Only against a promoted primary whose pg_control names its timeline
  # (its first checkpoint after the promotion completed): otherwise
  # pg_rewind sees one timeline, finds "no rewind required", and this
  # instance keeps WAL the new timeline forked off before — it could never
  # stream again. A source that does not get there in time (or lacks the
  # grants) means a re-clone, which is always safe.
  n=0
  until [ "$(PGPASSFILE="$PGDATA/../pgpass" "$(bin psql)" "$src" -XAtqc "$REWIND_SOURCE_READY" 2>/dev/null)" = t ]; do
    n=$((n + 1))
    if [ "$n" -gt 120 ]; then
      log "$host is not a checkpointed primary after 120 s; re-cloning instead of rewinding"
      do_clone
      return
    fi
    sleep 1
  done
  log "rewinding to follow $host"
  clear_stale_pidfile
  if ! PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_rewind)" -D "$PGDATA" --source-server="$src" >&2; then
    log "pg_rewind failed; re-cloning"
    do_clone
    return
  fi
}

# A standby streams through its slot on its upstream (primary_slot_name).
# A clone creates it; after a rewind, on a new primary, or when the
# upstream was itself rewound (pg_rewind drops its slots) it may be
# missing, and the WAL receiver would fail until someone creates it: so
# every start as a standby makes sure it exists, retrying in the
# background while the upstream is not up yet. A designated primary
# streams without one.
ensure_slot() {
  designated && return 0
  up="host=$(conninfo_q "$PGFLEET_PRIMARY_HOST") port=5432 user=replicator dbname=postgres connect_timeout=10 $(repl_ssl)"
  n=0
  until PGPASSFILE="$PGDATA/../pgpass" "$(bin pg_receivewal)" -d "$up" \
    --slot="$(echo "$POD_NAME" | tr '-' '_')" --create-slot --if-not-exists 2>/dev/null; do
    n=$((n + 1))
    [ "$n" -lt 120 ] || { log "could not create this instance's replication slot on $PGFLEET_PRIMARY_HOST"; return 0; }
    sleep 1
  done
}

# A primary archives from its first segment on, and pgBackRest refuses every
# segment until the stanza exists (each refusal retried three times, one
# second apart — a shutdown, so a switchover, waits for those too). The
# manager's archive check creates it as well, but only every 30 s and not
# while a switchover stops the primary. In the background, bounded; not on
# a drill's copy (archive_mode off) or a standby.
ensure_stanza() {
  [ -f "$PGBR_CONF" ] || return 0
  # Taken before PostgreSQL answers: a backup asked for meanwhile waits.
  touch "$STANZA_BUSY"
  n=0
  until on=$(sql "SELECT current_setting('archive_mode') <> 'off' AND NOT pg_is_in_recovery()" 2>/dev/null); do
    n=$((n + 1)); [ "$n" -lt 300 ] || { rm -f "$STANZA_BUSY"; return 0; }
    sleep 0.2
  done
  # A designated primary (in recovery) or a drill's copy: nothing to do.
  [ "$on" = t ] || { rm -f "$STANZA_BUSY"; return 0; }
  ( backup_init >/dev/null ) || log "the backup stanza could not be created yet; the manager retries"
  rm -f "$STANZA_BUSY"
}
# stanza-create takes every pgBackRest lock of the stanza, and a backup or
# an expire that finds one taken fails at once: those verbs wait (60 s at
# most) while this instance's own `ensure_stanza` runs. A marker older than
# two minutes is left over from a killed run.
wait_stanza() {
  n=0
  while [ "$(age_of "$STANZA_BUSY")" -lt 120 ] && [ "$n" -lt 300 ]; do n=$((n + 1)); sleep 0.2; done
}

# Supervises postgres instead of exec'ing it, so that a clean demotion or a
# fence stops PostgreSQL without ending the container: the loop starts it
# again in the role the pod's labels ask for (or waits while fenced).
cmd_run() {
  touch "$STARTING"
  mkdir -p "$PGDATA" && chmod 700 "$PGDATA"
  rm -f "$REWINDING"
  write_passfile
  if [ ! -s "$PGDATA/PG_VERSION" ] || [ -e "$PGDATA/../pgfleet.restore-incomplete" ]; then
    case "${PGFLEET_INIT:-clone}:$(wanted_role)" in
      initdb:primary) do_initdb ;;
      restore:primary) do_restore ;;
      *) rm -f "$PGDATA/../pgfleet.restore-incomplete"; do_clone ;;
    esac
  fi
  serve_backrest &
  srv=$!
  start_fenced_if_silent
  dr_watchdog &
  dog=$!
  stop=0
  pid=""
  trap 'stop=1; [ -n "$pid" ] && kill -TERM "$pid" 2>/dev/null' TERM INT
  while [ "$stop" = 0 ]; do
    while [ -e "$FENCE" ] && [ "$stop" = 0 ]; do sleep 0.2; done
    [ "$stop" = 0 ] || break
    if [ "$(wanted_role)" = replica ] && [ ! -e "$PGDATA/standby.signal" ]; then
      do_rewind
    fi
    configure start
    clear_stale_pidfile
    touch "$STARTING"
    "$(bin postgres)" -D "$PGDATA" -c listen_addresses="${POD_IP:-*}" -c unix_socket_directories="$SOCKDIR" &
    pid=$!
    if [ "$(wanted_role)" = replica ]; then ensure_slot </dev/null >/dev/null & else ensure_stanza </dev/null & fi
    while kill -0 "$pid" 2>/dev/null; do wait "$pid" || true; done
    pid=""
    [ "$stop" = 0 ] || break
    log "postgres stopped; starting it again as $(wanted_role)"
    sleep 0.2
  done
  kill "$srv" "$dog" 2>/dev/null || true
}

# RFC 3339 (UTC) of a timestamptz expression, for the SQL below.
ts() { echo "to_char(($1) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"')"; }

cmd_status() {
  # `status dr`: the DR engine's call, which is also its heartbeat.
  [ "${2:-}" != dr ] || touch "$HEARTBEAT"
  out=$(sql "SELECT json_build_object(
      'contract', $CONTRACT,
      'role', CASE WHEN pg_is_in_recovery() THEN 'replica' ELSE 'primary' END,
      'ready', $([ -s "$INITIALIZING" ] && echo false || echo true),
      'timeline', CASE WHEN pg_is_in_recovery()
          THEN (SELECT received_tli FROM pg_stat_wal_receiver)
          ELSE ('x' || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8))::bit(32)::int END,
      'currentLsn', CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_current_wal_lsn()::text END,
      'receivedLsn', pg_last_wal_receive_lsn()::text,
      'replayedLsn', pg_last_wal_replay_lsn()::text,
      'walReceiver', (SELECT status FROM pg_stat_wal_receiver),
      'receiverIdleMs', (SELECT (EXTRACT(EPOCH FROM now() - last_msg_receipt_time) * 1000)::bigint FROM pg_stat_wal_receiver),
      'version', current_setting('server_version'),
      'pendingRestart', EXISTS (SELECT 1 FROM pg_settings WHERE pending_restart),
      'archive', (SELECT json_build_object(
          'mode', current_setting('archive_mode'),
          'currentWal', CASE WHEN pg_is_in_recovery() THEN NULL ELSE pg_walfile_name(pg_current_wal_lsn()) END,
          'lastArchivedWal', last_archived_wal,
          'lastArchivedAt', $(ts last_archived_time),
          'lastFailedWal', last_failed_wal,
          'lastFailedAt', $(ts last_failed_time),
          'archivedCount', archived_count,
          'failedCount', failed_count) FROM pg_stat_archiver))" 2>/dev/null) ||
    out="{\"contract\":$CONTRACT,\"role\":\"stopped\",\"ready\":false,\"fenced\":$([ -e "$FENCE" ] && echo true || echo false),\"rewinding\":$([ -e "$REWINDING" ] && echo true || echo false)}"
  # An initialisation (restore) running now, and why the last one failed.
  extra=""
  [ ! -s "$INITIALIZING" ] || extra="$extra,\"initializing\":\"$(json_str "$(cat "$INITIALIZING")")\""
  [ ! -s "$INIT_FAILED" ] || extra="$extra,\"initError\":\"$(json_str "$(cat "$INIT_FAILED")")\""
  echo "${out%\}}$extra}"
}

cmd_promote() {
  rm -f "$DEMOTED"
  # In a replica cluster a promotion only moves the designated primary:
  # the new one follows the other cluster's primary from now on.
  if replica_cluster; then
    configure
    "$(bin pg_ctl)" -D "$PGDATA" reload >&2
    echo "{\"contract\":$CONTRACT,\"promoted\":true,\"designated\":true}"
    return
  fi
  if [ "$(sql "SELECT pg_is_in_recovery()")" = t ]; then
    # Not `pg_ctl -w`: it checks every 100 ms, and clients of a
    # switchover wait for this; one session polls every 10 ms instead.
    "$(bin pg_ctl)" -D "$PGDATA" -W promote >&2
    sql "DO \$\$ BEGIN FOR i IN 1..6000 LOOP EXIT WHEN NOT pg_is_in_recovery(); PERFORM pg_sleep(0.01); END LOOP; END \$\$" >/dev/null
  fi
  # In the background, so the promotion does not wait: pg_rewind's grants
  # (committed locally: a synchronous cluster's other standbys still follow
  # the old primary and a synchronous commit would wait for them), then a
  # checkpoint, since until one completes pg_control names the old timeline
  # and a former primary's pg_rewind would find "no rewind required".
  # Should either fail, a former primary re-clones instead of rewinding.
  ( sql "SET synchronous_commit = local; $REWIND_GRANTS"; sql "CHECKPOINT" ) >/dev/null 2>&1 </dev/null &
  sql "SELECT pg_is_in_recovery()" | grep -q f && echo "{\"contract\":$CONTRACT,\"promoted\":true}"
}

# `promote-after LSN` (a switchover): waits up to 30 s until this standby
# received or replayed past LSN (the old primary's shutdown checkpoint
# record), then promotes; otherwise answers "behind" and changes nothing,
# and the manager aborts the switchover. One exec where a status poll and
# `promote` took several round trips while clients wait.
cmd_promote_after() {
  want=${2:-}
  case "$want" in
    */*) case "$want" in *[!0-9A-Fa-f/]*) want="" ;; esac ;;
    *) want="" ;;
  esac
  [ -n "$want" ] || { log "promote-after: an LSN (like 0/3000028) is required"; exit 64; }
  n=0
  until [ "$(sql "SELECT NOT pg_is_in_recovery() OR greatest(coalesce(pg_last_wal_receive_lsn(), '0/0'),
      coalesce(pg_last_wal_replay_lsn(), '0/0')) > '$want'::pg_lsn" 2>/dev/null)" = t ]; do
    n=$((n + 1))
    if [ "$n" -ge 1500 ]; then
      echo "{\"contract\":$CONTRACT,\"promoted\":false,\"behind\":true}"
      return
    fi
    sleep 0.02
  done
  cmd_promote
}

# A fast shutdown, waited for every 10 ms (`pg_ctl -w` checks every 100 ms
# and a switchover's clients wait for it); bounded at 60 s like pg_ctl.
# Waits for that postmaster (its pid), not for the file: the run loop starts
# the next one 200 ms after it exits.
stop_fast() {
  old=$(head -n 1 "$PGDATA/postmaster.pid" 2>/dev/null) || old=""
  "$(bin pg_ctl)" -D "$PGDATA" -W -m fast stop >&2 || return 0
  n=0
  while [ "$n" -lt 6000 ] && [ "$(head -n 1 "$PGDATA/postmaster.pid" 2>/dev/null)" = "$old" ]; do
    n=$((n + 1)); sleep 0.01
  done
}

# Clean demotion for a switchover: standby.signal first, then a fast
# shutdown (walsenders send all WAL up to the shutdown checkpoint first); the
# run loop starts it again as a standby. Prints the final WAL position.
cmd_demote() {
  # `demote dr`: the whole cluster becomes a replica cluster (the
  # ConfigMap names the new source); its primary stays the designated one.
  # `demote dr-rewind`: after a forced promotion elsewhere this side may
  # hold WAL the new primary never saw: no standby.signal, so the run loop
  # rewinds it before it follows. The manager runs it on every instance of
  # the side: a standby of the lost primary may hold its last WAL too.
  # The kubelet refreshes a ConfigMap volume with a delay, pod by pod.
  n=0
  case "${2:-}" in dr|dr-rewind) until replica_cluster || [ "$n" -ge 100 ]; do n=$((n + 1)); sleep 0.2; done ;; esac
  case "${2:-}" in
    dr|dr-rewind) replica_cluster || { log "demote ${2}: no replica-source in the mounted configuration yet"; exit 75; } ;;
    *) touch "$DEMOTED" ;;
  esac
  if [ "${2:-}" = dr-rewind ]; then rm -f "$PGDATA/standby.signal"; else touch "$PGDATA/standby.signal"; fi
  stop_fast
  lsn=$("$(bin pg_controldata)" -D "$PGDATA" | sed -n 's/^Latest checkpoint location: *//p')
  echo "{\"contract\":$CONTRACT,\"demoted\":true,\"lsn\":\"$lsn\"}"
}

# `ready`: the readiness probe. Ready is accepting connections and not
# initialising (a restore's temporary server is not the instance). A
# server the run loop launched less than 10 s ago (not fenced, not
# rewinding) is waited for, up to 3 s, every 50 ms: with the probe's 2 s
# period, a server up just after a failed attempt would otherwise stay out
# of its Services for most of a period — downtime for a major upgrade's new
# primary or a restarted one. Anything else fails at once.
cmd_ready() {
  [ ! -e "$INITIALIZING" ] || exit 1
  ! isready || exit 0
  { [ ! -e "$FENCE" ] && [ ! -e "$REWINDING" ] && [ "$(age_of "$STARTING")" -lt 10 ]; } || exit 1
  n=0
  while [ "$n" -lt 60 ]; do
    sleep 0.05
    [ ! -e "$INITIALIZING" ] || exit 1
    ! isready || exit 0
    n=$((n + 1))
  done
  exit 1
}
isready() { "$(bin pg_isready)" -q -h "$SOCKDIR" -p 5432; }

# Fencing stops the instance and keeps it stopped (run waits while the fence
# file exists), so a lost primary can never take writes again on its own.
cmd_fence() {
  touch "$FENCE"
  stop_fast
  echo "{\"contract\":$CONTRACT,\"fenced\":true}"
}

# `unfence dr`: only once the mounted configuration makes this a replica
# cluster (`replica-source`): unfenced before that, a former primary side
# would start as a primary again next to the promoted one.
cmd_unfence() {
  if [ "${2:-}" = dr ] && ! replica_cluster; then
    log "unfence dr: no replica-source in the mounted configuration yet"; exit 75
  fi
  rm -f "$FENCE" "$DEMOTED"; echo "{\"contract\":$CONTRACT,\"fenced\":false}"
}

# `reload [HASH]`: with a hash, first wait until the mounted ConfigMap
# carries it (the kubelet refreshes ConfigMap volumes with a delay).
cmd_reload() {
  if [ -n "${2:-}" ]; then
    n=0
    until grep -qF "pgfleet-config-hash: $2" "$CONFIG/postgresql.conf"; do
      n=$((n + 1)); [ "$n" -le 110 ] || { log "configuration $2 not mounted yet"; exit 75; }
      sleep 1
    done
  fi
  configure
  # Stopped since the manager looked (fenced, demoted, rewinding): it reads
  # what `configure` just copied when it starts; nothing failed.
  if ! "$(bin pg_ctl)" -D "$PGDATA" status >/dev/null 2>&1; then
    echo "{\"contract\":$CONTRACT,\"reloaded\":false,\"stopped\":true}"
    return
  fi
  "$(bin pg_ctl)" -D "$PGDATA" reload >&2
  echo "{\"contract\":$CONTRACT,\"reloaded\":true}"
}

# `reload-tls FINGERPRINT`: a renewed server certificate. Waits until the
# mounted Secret holds it (the kubelet refreshes Secret volumes with a
# delay), then copies it and reloads: sessions stay open. A server not
# running picks it up when it starts.
cmd_reload_tls() {
  want=${2:-}
  case "$want" in ''|*[!0-9a-f]*) log "usage: reload-tls SHA256"; exit 64 ;; esac
  n=0
  until [ "$(tls_fingerprint)" = "$want" ]; do
    n=$((n + 1)); [ "$n" -le 110 ] || { log "certificate $want not mounted yet"; exit 75; }
    sleep 1
  done
  if [ -s "$PGDATA/PG_VERSION" ] && "$(bin pg_ctl)" -D "$PGDATA" status >/dev/null 2>&1; then
    configure
    "$(bin pg_ctl)" -D "$PGDATA" reload >&2
  fi
  echo "{\"contract\":$CONTRACT,\"reloaded\":true}"
}

# One physical slot per listed instance, so a replica never loses WAL it
# still needs (after a failover the new primary has none); inactive slots of
# instances no longer listed are dropped.
cmd_slots() {
  shift
  keep=""
  for n in "$@"; do
    # Instance names only: they go into SQL below.
    case "$n" in ''|*[!a-z0-9-]*) log "slots: $n is not an instance name"; exit 64 ;; esac
    slot=$(echo "$n" | tr '-' '_')
    keep="$keep,'$slot'"
    sql "SELECT pg_create_physical_replication_slot('$slot', true) WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = '$slot')" >/dev/null
  done
  sql "SELECT pg_drop_replication_slot(slot_name) FROM pg_replication_slots WHERE NOT active AND slot_type = 'physical' AND slot_name NOT IN (''$keep)" >/dev/null
  echo "{\"contract\":$CONTRACT,\"slots\":$#}"
}

# The file system PGDATA is on (df -P, in bytes: used, available, total),
# the size of pg_wal, and the WAL each replication slot keeps from being
# removed. df and du work while postgres is down (a full volume makes it
# PANIC): then `slots` is null, as nobody can ask the server.
cmd_usage() {
  df=$(df -Pk "$PGDATA" | awk 'NR == 2 { printf "%.0f %.0f %.0f\n", $(NF-4) * 1024, $(NF-3) * 1024, $(NF-2) * 1024 }')
  [ -n "$df" ] || { log "usage: df -P $PGDATA printed nothing"; exit 1; }
  total=${df%% *}; rest=${df#* }; used=${rest%% *}; avail=${rest#* }
  wal=$(du -sk "$PGDATA/pg_wal" 2>/dev/null | cut -f1) || wal=0
  slots=$(sql "SELECT coalesce(json_agg(json_build_object('name', slot_name, 'active', active,
      'walBytes', coalesce(pg_wal_lsn_diff(CASE WHEN pg_is_in_recovery()
          THEN pg_last_wal_receive_lsn() ELSE pg_current_wal_lsn() END, restart_lsn), 0)::bigint)), '[]')
      FROM pg_replication_slots" 2>/dev/null) || slots=null
  [ -n "$slots" ] || slots=null
  echo "{\"contract\":$CONTRACT,\"totalBytes\":$total,\"usedBytes\":$used,\"availableBytes\":$avail,\"walBytes\":$((${wal:-0} * 1024)),\"slots\":$(oneline "$slots")}"
}

cmd_checkpoint() { sql "CHECKPOINT" >/dev/null && echo "{\"contract\":$CONTRACT,\"checkpoint\":true}"; }

# --- Backups (pgBackRest). The instance must be running for every verb but
# archive-push: pgBackRest talks to it, and its JSON is parsed with psql.

# archive_command: PostgreSQL keeps (and retries) the segment on any non-zero
# exit, so a missing configuration must never look like success. Silent on
# success (its output would land in the server log once per segment).
# Arguments after PATH are ignored: archive_command ends in the word
# `pgbackrest` because pgBackRest's backup and check refuse an
# archive_command that does not contain it (ERROR [068]).
cmd_archive_push() {
  [ -n "${2:-}" ] || { log "usage: archive-push PATH [pgbackrest]"; exit 64; }
  # archive_command runs in the data directory, with the server's environment.
  PGDATA=${PGDATA:-$(pwd)}
  pgbr archive-push "$2" >&2
}

# Creates the stanza only when the repository lacks it: `info` takes no
# lock, so an unreachable store fails here with pgBackRest's own reason (not
# with the archive lock a retrying archive-push holds).
cmd_backup_init() {
  wait_stanza
  backup_init
}
backup_init() {
  j=$(pgbr info --output=json) || exit $?
  code=$(sqlj j "$j" "SELECT (:'j'::json)->0->'status'->>'code'")
  case "$code" in
    0|2|6) created=false ;;
    1|3) pgbr stanza-create >&2; created=true ;;
    *) log "pgbackrest info: $(info_message "$j")"; exit 1 ;;
  esac
  # The archiver gave up on the segments refused before (three tries, then
  # a minute's pause): a reload's SIGHUP wakes it to push them now, so a
  # backup started next does not time out waiting for them.
  sql "SELECT pg_reload_conf()" >/dev/null 2>&1 || true
  echo "{\"contract\":$CONTRACT,\"stanza\":\"db\",\"created\":$created}"
}

# `backup-upgrade`, after a major upgrade (run on the new primary): the
# stanza learns the new version and system identifier (pgBackRest's
# stanza-upgrade), so WAL archiving and backups go on; the old version's
# backups and WAL stay, for a point-in-time restore to before the upgrade
# into a cluster of the old version. A stanza that never existed (archiving
# was off on the old version) is created. Idempotent: pgBackRest leaves an
# up-to-date stanza as it is.
cmd_backup_upgrade() {
  wait_stanza
  j=$(pgbr info --output=json) || exit $?
  code=$(sqlj j "$j" "SELECT (:'j'::json)->0->'status'->>'code'")
  case "$code" in
    0|2|6) pgbr stanza-upgrade >&2 || exit $?; created=false ;;
    1|3) pgbr stanza-create >&2 || exit $?; created=true ;;
    *) log "pgbackrest info: $(info_message "$j")"; exit 1 ;;
  esac
  echo "{\"contract\":$CONTRACT,\"stanza\":\"db\",\"created\":$created}"
}

# The stanza's status message from `info --output=json`, with the
# repository's own (e.g. why it cannot be reached).
info_message() {
  sqlj j "$1" "SELECT (:'j'::json)->0->'status'->>'message' || coalesce(': ' || ((:'j'::json)->0->'repo'->0->'status'->>'message'), '')"
}

# `pgbackrest info --output=json`, checked: a repository that cannot be read
# is an error, a stanza without backups is not.
info_json() {
  j=$(pgbr info --output=json) || exit $?
  code=$(sqlj j "$j" "SELECT (:'j'::json)->0->'status'->>'code'")
  case "$code" in
    0|1|2|6) printf '%s' "$j" ;;
    *) log "pgbackrest info: $(info_message "$j")"; exit 1 ;;
  esac
}

# The fields of one backup `b` (a json element of info's "backup").
BACKUP_FIELDS="
    'label', b->>'label', 'type', b->>'type', 'prior', b->>'prior',
    'startedAt', $(ts "to_timestamp((b->'timestamp'->>'start')::bigint)"),
    'stoppedAt', $(ts "to_timestamp((b->'timestamp'->>'stop')::bigint)"),
    'size', (b->'info'->>'size')::bigint,
    'repoSize', (b->'info'->'repository'->>'delta')::bigint,
    'walStart', b->'archive'->>'start', 'walStop', b->'archive'->>'stop',
    'lsnStart', b->'lsn'->>'start', 'lsnStop', b->'lsn'->>'stop'"

# `backup full|diff|incr [--standby]`: on the primary, or with --standby on
# a streaming standby, which copies the files while pgBackRest drives the
# primary through its TLS server; prints the backup just taken (pgBackRest
# makes a diff/incr without a prior full a full one).
cmd_backup() {
  case "${2:-}:${3:-}" in full:|diff:|incr:|full:--standby|diff:--standby|incr:--standby) ;;
    *) log "usage: backup full|diff|incr [--standby]"; exit 64 ;; esac
  wait_stanza
  if [ -z "${3:-}" ]; then
    pgbr backup --type="$2" >&2
  else
    tls_on || { log "no pgBackRest TLS certificate here (PGFLEET_BACKUP_TLS): cannot back up from a standby"; exit 78; }
    [ "$(sql 'SELECT pg_is_in_recovery()')" = t ] || { log "not a standby: back up on the primary instead"; exit 1; }
    tls_key
    # pg1 is the primary (same paths in every pod), pg2 this standby.
    pgbr backup --type="$2" --backup-standby \
      --pg1-host="${PGFLEET_PRIMARY_HOST:?}" --pg1-host-type=tls --pg1-host-port="$TLS_PORT" \
      --pg1-host-cert-file="$TLS_DIR/tls.crt" --pg1-host-key-file="$TLS_KEY" \
      --pg1-host-ca-file="$TLS_DIR/ca.crt" \
      --pg2-path="$PGDATA" --pg2-socket-path="$SOCKDIR" --pg2-port=5432 --pg2-user=postgres >&2
  fi
  j=$(info_json)
  out=$(sqlj j "$j" "SELECT json_build_object('contract', $CONTRACT, $BACKUP_FIELDS)
    FROM json_array_elements(:'j'::json) s, json_array_elements(s->'backup') b
    ORDER BY (b->'timestamp'->>'stop')::bigint DESC, b->>'label' DESC LIMIT 1")
  [ -n "$out" ] || { log "pgbackrest info lists no backup after the backup"; exit 1; }
  oneline "$out"
}

cmd_backup_info() {
  j=$(info_json)
  out=$(sqlj j "$j" "SELECT json_build_object('contract', $CONTRACT,
      'backups', coalesce((SELECT json_agg(json_build_object($BACKUP_FIELDS) ORDER BY (b->'timestamp'->>'stop')::bigint)
          FROM json_array_elements(:'j'::json) s, json_array_elements(s->'backup') b), '[]'),
      'archiveMin', (SELECT a->>'min' FROM json_array_elements(:'j'::json) s, json_array_elements(s->'archive') a
          ORDER BY (a->'database'->>'id')::int DESC LIMIT 1),
      'archiveMax', (SELECT a->>'max' FROM json_array_elements(:'j'::json) s, json_array_elements(s->'archive') a
          ORDER BY (a->'database'->>'id')::int DESC LIMIT 1))")
  oneline "$out"
}

# `expire [--retention-full N | --retention-full-days D]`: retention comes
# from pgbackrest.conf (repo1-retention-full*) unless overridden here.
cmd_expire() {
  wait_stanza
  shift
  set_opts=""
  while [ $# -gt 0 ]; do
    # Numbers only: set_opts is split into words below.
    case "$1:${2:-}" in
      --retention-full*:|--retention-full*:*[!0-9]*) log "$1 needs a number"; exit 64 ;;
      --retention-full:*) set_opts="--repo1-retention-full-type=count --repo1-retention-full=$2"; shift 2 ;;
      --retention-full-days:*) set_opts="--repo1-retention-full-type=time --repo1-retention-full=$2"; shift 2 ;;
      *) log "usage: expire [--retention-full N | --retention-full-days D]"; exit 64 ;;
    esac
  done
  # shellcheck disable=SC2086 # two options or none
  pgbr expire $set_opts >&2
  j=$(info_json)
  out=$(sqlj j "$j" "SELECT json_build_object('contract', $CONTRACT,
      'backups', coalesce((SELECT json_agg(b->>'label' ORDER BY (b->'timestamp'->>'stop')::bigint)
          FROM json_array_elements(:'j'::json) s, json_array_elements(s->'backup') b), '[]'))")
  oneline "$out"
}

# `query [--db NAME] SQL`: restore drills. Read-only by default
# (default_transaction_read_only); prints the row count of the last statement.
cmd_query() {
  shift
  db=postgres
  if [ "${1:-}" = --db ]; then db=${2:?--db needs a name}; shift 2; fi
  [ -n "${1:-}" ] || { log "usage: query [--db NAME] SQL"; exit 64; }
  rows=$(PGOPTIONS="${PGOPTIONS:-} -c default_transaction_read_only=on" "$(bin psql)" -h "$SOCKDIR" -U postgres -d "$db" \
    -XAtq -v ON_ERROR_STOP=1 -o /dev/null -c "$1" -c '\echo :ROW_COUNT')
  echo "{\"contract\":$CONTRACT,\"ok\":true,\"rows\":${rows:-0}}"
}

# --- Roles and databases (controller::access). The manager reads the
# catalog, decides (postgres::roles, postgres::databases) and sends the
# statements on stdin: never in an argv, and passwords only as SCRAM
# verifiers.

# psql on the local socket into database $1 (any name: it goes into a
# conninfo value, quoted).
psql_db() { db=$1; shift; "$(bin psql)" -h "$SOCKDIR" -U postgres -d "dbname=$(conninfo_q "$db")" -XAtq -v ON_ERROR_STOP=1 "$@"; }

# UTC, to the second, as postgres::roles::valid_until prints a spec's.
ts_s() { echo "to_char(($1) AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS\"Z\"')"; }

# Schema `pgfleet` (the pooler's auth_query lookup, controller::pooler::auth)
# of the current database: owners, grants and every `pooler_lookup`
# function, for the manager to compare with what it installs; null when
# the schema does not exist.
POOLER_LOOKUP="(SELECT json_build_object('schemaOwner', pg_get_userbyid(n.nspowner),
    'schemaGrants', coalesce((SELECT json_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC'
        ELSE pg_get_userbyid(a.grantee) END || ':' || a.privilege_type) FROM aclexplode(n.nspacl) a), '[]'),
    'functions', coalesce((SELECT json_agg(json_build_object('owner', pg_get_userbyid(p.proowner),
        'securityDefiner', p.prosecdef, 'config', coalesce(p.proconfig, '{}'), 'source', p.prosrc,
        'arguments', pg_get_function_arguments(p.oid), 'result', pg_get_function_result(p.oid),
        'grants', coalesce((SELECT json_agg(CASE WHEN a.grantee = 0 THEN 'PUBLIC'
            ELSE pg_get_userbyid(a.grantee) END || ':' || a.privilege_type) FROM aclexplode(p.proacl) a), '[]')))
        FROM pg_proc p WHERE p.pronamespace = n.oid AND p.proname = 'pooler_lookup'), '[]'))
  FROM pg_namespace n WHERE n.nspname = 'pgfleet')"

# `catalog [DB...]`: roles (no pg_*), databases, the extensions the image
# offers; for each DB named, its extensions and schemas.
cmd_catalog() {
  shift
  inspect=""
  for db in "$@"; do
    one_line "$db" || continue
    j=$(psql_db "$db" -c "SELECT json_build_object('name', current_database(),
        'extensions', coalesce((SELECT json_agg(json_build_object('name', extname, 'version', extversion)) FROM pg_extension), '[]'),
        'schemas', coalesce((SELECT json_agg(nspname) FROM pg_namespace), '[]'),
        'poolerLookup', $POOLER_LOOKUP)" 2>/dev/null) || continue
    inspect="$inspect,$(printf '%s' "$j" | tr -d '\n')"
  done
  out=$(sqlj i "[${inspect#,}]" "SELECT json_build_object('contract', $CONTRACT,
    'roles', coalesce((SELECT json_agg(json_build_object(
        'name', a.rolname, 'superuser', a.rolsuper, 'inherit', a.rolinherit,
        'createrole', a.rolcreaterole, 'createdb', a.rolcreatedb, 'login', a.rolcanlogin,
        'replication', a.rolreplication, 'bypassrls', a.rolbypassrls,
        'connectionLimit', a.rolconnlimit,
        'validUntil', CASE WHEN a.rolvaliduntil IS NULL OR a.rolvaliduntil = 'infinity' THEN NULL
            ELSE $(ts_s a.rolvaliduntil) END,
        'memberOf', coalesce((SELECT json_agg(g.rolname ORDER BY g.rolname) FROM pg_auth_members m
            JOIN pg_authid g ON g.oid = m.roleid WHERE m.member = a.oid), '[]'),
        'comment', shobj_description(a.oid, 'pg_authid'),
        'verifier', a.rolpassword) ORDER BY a.rolname) FROM pg_authid a WHERE a.rolname !~ '^pg_'), '[]'),
    'databases', coalesce((SELECT json_agg(CASE WHEN x.e IS NULL
            THEN json_build_object('name', d.datname, 'owner', pg_get_userbyid(d.datdba))
            ELSE json_build_object('name', d.datname, 'owner', pg_get_userbyid(d.datdba), 'inspected', true,
                'extensions', x.e->'extensions', 'schemas', x.e->'schemas',
                'poolerLookup', x.e->'poolerLookup') END ORDER BY d.datname)
        FROM pg_database d LEFT JOIN LATERAL (SELECT e FROM json_array_elements(:'i'::json) e
            WHERE e->>'name' = d.datname) x ON true WHERE NOT d.datistemplate), '[]'),
    'available', coalesce((SELECT json_agg(json_build_object('name', name, 'versions', versions))
        FROM (SELECT name, json_agg(version ORDER BY version) versions
            FROM pg_available_extension_versions GROUP BY name) v), '[]'))")
  oneline "$out"
}

# `apply-sql [--db NAME]`: runs the statements on stdin in database NAME
# (default postgres), stopping at the first error. Terse errors: a failing
# statement's text (with a verifier) is not echoed back.
cmd_apply_sql() {
  shift
  db=postgres
  if [ "${1:-}" = --db ]; then db=${2:?--db needs a name}; shift 2; fi
  one_line "$db" || { log "apply-sql: the database name has a line break"; exit 64; }
  if ! err=$(psql_db "$db" -v VERBOSITY=terse -f - 2>&1 >/dev/null); then
    log "apply-sql: $(printf '%s' "$err" | head -c 2000)"
    exit 1
  fi
  echo "{\"contract\":$CONTRACT,\"applied\":true}"
}

# --- In-place major upgrade (docs/major-upgrades.md). The manager runs
# upgrade-check on the running primary, fences every instance, runs
# `upgrade OLD_BIN NEW_BIN` on the stopped primary's volume, then replaces
# the Pods with the new version's image and runs `analyze` on the new
# primary. State lives on the volume, next to PGDATA, so a repeated verb
# (a manager killed mid-step) resumes instead of starting over.
UPGRADE_BASE=${PGFLEET_UPGRADE_BASE:-}
upgrade_base() { if [ -n "$UPGRADE_BASE" ]; then echo "$UPGRADE_BASE"; else dirname "${PGDATA:?}"; fi; }
upgrade_fail() { log "$1"; echo "{\"contract\":$CONTRACT,\"ok\":false,\"reason\":\"$(json_str "$1")\"}"; exit 1; }
major_of_bin() { "$1/postgres" --version 2>/dev/null | sed -n 's/.* \([0-9][0-9]*\)[.0-9a-z]*$/\1/p' | head -1; }
running_bin() { d=$(command -v "$(bin postgres)") && dirname "$d"; }

# `upgrade-check NEW_BIN [MIN_FREE_MB [keep]]`: on the running primary, the
# pre-flight of an in-place upgrade to the binaries in NEW_BIN. Changes
# nothing the old version uses (a new cluster is made next to PGDATA for
# `pg_upgrade --check`). With `keep` that checked, empty new cluster stays
# as pgdata.new for `upgrade`, so its initdb is not inside the downtime;
# without, it is removed. Prints ok or the first reason it would fail.
cmd_upgrade_check() {
  new=${2:-}; min_free_mb=${3:-256}; keep=${4:-}
  case "$min_free_mb" in ''|*[!0-9]*) upgrade_fail "upgrade-check: MIN_FREE_MB must be a number" ;; esac
  [ -n "$new" ] && [ -x "$new/pg_upgrade" ] && [ -x "$new/initdb" ] ||
    upgrade_fail "the new version's binaries are not in ${new:-(no directory given)}: pg_upgrade and initdb are needed"
  safe_path "$new" || upgrade_fail "upgrade-check: the binaries directory has characters other than A-Z a-z 0-9 . _ / -"
  old=$(running_bin) || upgrade_fail "the running version's binaries are not on PATH"
  [ "$(sql "SELECT pg_is_in_recovery()")" = f ] || upgrade_fail "upgrade-check runs on the primary"
  base=$(upgrade_base)
  # One check at a time: a manager killed mid-check runs the verb again
  # while the first run (its exec session gone) may still initialise the
  # same directory.
  lock="$base/pgfleet.upgrade-check.pid"
  if [ -s "$lock" ] && kill -0 "$(cat "$lock")" 2>/dev/null; then
    upgrade_fail "upgrade-check: already running (pid $(cat "$lock")); try again when it has finished"
  fi
  echo $$ > "$lock"
  trap 'rm -f "$lock"' EXIT
  # Extensions: each one installed in any database must exist in the new
  # installation (pg_upgrade would only find the missing library later).
  share=$("$new/pg_config" --sharedir 2>/dev/null) || share="$new/../share"
  for db in $(sql "SELECT datname FROM pg_database WHERE datallowconn AND datname ~ '^[A-Za-z0-9_]+\$'"); do
    for ext in $("$(bin psql)" -h "$SOCKDIR" -U postgres -d "$db" -XAtq -c "SELECT extname FROM pg_extension WHERE extname ~ '^[A-Za-z0-9_-]+\$'"); do
      [ -f "$share/extension/$ext.control" ] ||
        upgrade_fail "extension $ext (database $db) is not available in PostgreSQL $(major_of_bin "$new") ($share/extension)"
    done
  done
  # Free space: the new catalog, pg_upgrade's dump of the schema and logs.
  used_kb=$(du -sk "$PGDATA" 2>/dev/null | awk '{print $1}')
  free_kb=$(df -Pk "$base" | awk 'NR == 2 {print $4}')
  need_kb=$((min_free_mb * 1024 + ${used_kb:-0} / 10))
  [ "${free_kb:-0}" -ge "$need_kb" ] ||
    upgrade_fail "not enough free space on the data volume: ${free_kb:-0} KiB free, ${need_kb} KiB needed"
  # The new cluster must match the old one: checksums, encoding, locale
  # (initdb 18 turns checksums on by default). Kept for `upgrade`.
  sums=$("$(bin pg_controldata)" -D "$PGDATA" | sed -n 's/^Data page checksum version: *//p')
  sql "SELECT pg_encoding_to_char(encoding) || ' ' || datcollate || ' ' || datctype FROM pg_database WHERE datname = 'template0'" > "$base/pgfleet.upgrade-locale"
  echo "${sums:-0}" > "$base/pgfleet.upgrade-checksums"
  work="$base/pgdata.check"
  rm -rf "$work"
  new_initdb "$new" "$work" "$base" >&2 || { rm -rf "$work"; upgrade_fail "initdb of the new version failed"; }
  out="$base/pgfleet.upgrade-check.log"
  if ! (cd "$base" && "$new/pg_upgrade" --check -b "$old" -B "$new" -d "$PGDATA" -D "$work" -U postgres \
      -s "$SOCKDIR" -p 5432 -P 50433) >"$out" 2>&1; then
    why=$(grep -vE '^(Performing|Checking|-|$)' "$out" | grep -v ' ok$' | head -8 | tr '\n' ' ')
    cat "$out" >&2; rm -rf "$work"
    upgrade_fail "pg_upgrade --check: ${why:-see the instance log}"
  fi
  cat "$out" >&2
  if [ "$keep" = keep ]; then
    rm -f "$base/pgfleet.upgrade-prepared"; rm -rf "$base/pgdata.new"
    mv "$work" "$base/pgdata.new" && major_of_bin "$new" > "$base/pgfleet.upgrade-prepared"
  else
    rm -rf "$work"
  fi
  echo "{\"contract\":$CONTRACT,\"ok\":true,\"checksums\":$([ "${sums:-0}" = 0 ] && echo false || echo true),\"freeKb\":${free_kb:-0}}"
}

# initdb of the new version matching the old cluster (see upgrade-check).
new_initdb() {
  nb=$1; nd=$2; nbase=$3
  sums=$(cat "$nbase/pgfleet.upgrade-checksums" 2>/dev/null || echo 1)
  if [ "$sums" = 0 ]; then set -- --no-data-checksums; else set -- --data-checksums; fi
  if read -r enc coll ctype < "$nbase/pgfleet.upgrade-locale" 2>/dev/null && [ -n "$ctype" ]; then
    set -- "$@" --encoding="$enc" --lc-collate="$coll" --lc-ctype="$ctype"
  fi
  "$nb/initdb" -D "$nd" -U postgres --auth-local=trust --auth-host=scram-sha-256 "$@"
}

# `upgrade OLD_BIN NEW_BIN`: on the fenced, stopped primary: pg_upgrade
# --link into a new data directory next to PGDATA, then the new one takes
# PGDATA's place (the old stays as pgdata.old until `analyze`). A failure
# puts the old data directory back as it was: nothing has started on the
# new version, so the old one can run again.
cmd_upgrade() {
  old=${2:-}; new=${3:-}
  [ -x "$old/postgres" ] && [ -x "$new/pg_upgrade" ] || upgrade_fail "upgrade OLD_BIN NEW_BIN: binaries not found"
  base=$(upgrade_base); newdata="$base/pgdata.new"; olddata="$base/pgdata.old"
  want=$(major_of_bin "$new")
  if [ "$(cat "$PGDATA/PG_VERSION" 2>/dev/null)" = "$want" ]; then
    echo "{\"contract\":$CONTRACT,\"ok\":true,\"upgraded\":true,\"resumed\":true}"; return
  fi
  [ -e "$FENCE" ] || upgrade_fail "upgrade: the instance must be fenced first"
  # One pg_upgrade at a time: a manager killed mid-step runs the verb again
  # while the first run may still be going (its exec session gone).
  lock="$base/pgfleet.upgrade.pid"
  if [ -s "$lock" ] && kill -0 "$(cat "$lock")" 2>/dev/null; then
    upgrade_fail "upgrade: already running (pid $(cat "$lock")); try again when it has finished"
  fi
  echo $$ > "$lock"
  trap 'rm -f "$lock"' EXIT
  if "$old/pg_ctl" -D "$PGDATA" status >/dev/null 2>&1; then upgrade_fail "upgrade: PostgreSQL is still running"; fi
  # pg_upgrade finished earlier but the swap did not: finish the swap.
  if [ -e "$base/pgfleet.upgrade-linked" ] && [ -s "$newdata/PG_VERSION" ]; then
    swap_data "$newdata" "$olddata"; return
  fi
  [ ! -e "$PGDATA/global/pg_control.old" ] || mv "$PGDATA/global/pg_control.old" "$PGDATA/global/pg_control"
  # The pre-flight's checked, empty new cluster (upgrade-check keep) is used
  # once: the marker goes first, so a run that dies below initialises anew.
  if [ "$(cat "$base/pgfleet.upgrade-prepared" 2>/dev/null)" = "$want" ] && [ -s "$newdata/PG_VERSION" ]; then
    rm -f "$base/pgfleet.upgrade-prepared"
  else
    rm -f "$base/pgfleet.upgrade-prepared"; rm -rf "$newdata"
    new_initdb "$new" "$newdata" "$base" >&2 || { rm -rf "$newdata"; upgrade_fail "initdb of the new version failed"; }
  fi
  out="$base/pgfleet.upgrade.log"
  if ! (cd "$base" && "$new/pg_upgrade" --link -b "$old" -B "$new" -d "$PGDATA" -D "$newdata" -U postgres \
      -s "$SOCKDIR" -p 50432 -P 50433) >"$out" 2>&1; then
    cat "$out" >&2
    rm -rf "$newdata"
    [ ! -e "$PGDATA/global/pg_control.old" ] || mv "$PGDATA/global/pg_control.old" "$PGDATA/global/pg_control"
    upgrade_fail "pg_upgrade --link: $(grep -vE '^(Performing|Checking|-|$)' "$out" | grep -v ' ok$' | head -8 | tr '\n' ' ')"
  fi
  cat "$out" >&2
  touch "$base/pgfleet.upgrade-linked"
  swap_data "$newdata" "$olddata"
}

swap_data() {
  cp "$PGDATA/postgresql.auto.conf" "$1/postgresql.auto.conf" 2>/dev/null || true
  rm -rf "$2"
  mv "$PGDATA" "$2" && mv "$1" "$PGDATA"
  rm -f "$(upgrade_base)/pgfleet.upgrade-linked"
  echo "{\"contract\":$CONTRACT,\"ok\":true,\"upgraded\":true}"
}

# `analyze`: on the new primary: statistics pg_upgrade did not carry over
# (PostgreSQL 18 keeps the optimizer statistics; --missing-stats-only skips
# what is there), then the old data directory goes: from now on, rollback
# is a restore.
cmd_analyze() {
  set -- --all --analyze-in-stages
  if "$(bin vacuumdb)" --help 2>/dev/null | grep -q -- --missing-stats-only; then set -- "$@" --missing-stats-only; fi
  "$(bin vacuumdb)" -h "$SOCKDIR" -U postgres "$@" >&2 || upgrade_fail "vacuumdb --analyze-in-stages failed"
  base=$(upgrade_base)
  rm -rf "$base/pgdata.old" "$base/pgfleet.upgrade-prepared" "$base/pgfleet.upgrade-locale" "$base/pgfleet.upgrade-checksums" "$base/delete_old_cluster.sh"
  echo "{\"contract\":$CONTRACT,\"ok\":true,\"analyzed\":true}"
}

# --- Blue/green major upgrade (controller::major_upgrade::blue_green_exec).
# The manager relays what blue dumps into green through exec stdin: green's
# PostgreSQL may have no SSL, and the superuser never logs in over the pod
# network.

# `json [--db NAME]`: one read-only query on stdin; its single value (JSON,
# by the manager's query) printed on one line.
cmd_json() {
  shift
  db=postgres
  if [ "${1:-}" = --db ]; then db=${2:?--db needs a name}; shift 2; fi
  one_line "$db" || { log "json: the database name has a line break"; exit 64; }
  if ! out=$(PGOPTIONS="${PGOPTIONS:-} -c default_transaction_read_only=on" psql_db "$db" -v VERBOSITY=terse -f - 2>/tmp/pgfleet.json.err); then
    log "json: $(head -c 2000 /tmp/pgfleet.json.err)"; exit 1
  fi
  oneline "$out"
}

# `bg-dump roles` | `bg-dump schema DB`: what green is seeded with, on
# stdout (roles with their SCRAM verifiers; one database's schema, no data,
# no publications or subscriptions), ending with a line that says it is
# complete (the manager's exec keeps a bounded output: a cut dump must not
# be applied).
cmd_bg_dump() {
  case "${2:-}" in
    roles) "$(bin pg_dumpall)" -h "$SOCKDIR" -U postgres --roles-only ;;
    schema)
      db=${3:?bg-dump schema needs a database}
      one_line "$db" || { log "bg-dump: the database name has a line break"; exit 64; }
      "$(bin pg_dump)" -h "$SOCKDIR" -U postgres -d "dbname=$(conninfo_q "$db")" --schema-only \
        --no-publications --no-subscriptions ;;
    *) log "usage: bg-dump roles|schema DB"; exit 64 ;;
  esac
  echo "-- pgfleet bg-dump complete"
}

# `bg-passfile`: the upgrade role's password on stdin, written where green's
# subscriptions read it (next to PGDATA, on the volume); prints the path.
cmd_bg_passfile() {
  f="$(dirname "${PGDATA:?}")/pgfleet-bluegreen.pass"
  pw=$(head -c 512)
  ( umask 077; printf '*:*:*:pgfleet_bluegreen:%s\n' "$(pgpass_field "$pw")" > "$f.tmp" ) && mv "$f.tmp" "$f"
  echo "{\"contract\":$CONTRACT,\"passfile\":\"$(json_str "$f")\"}"
}

case "${1:-}" in
  run) cmd_run ;;
  catalog) cmd_catalog "$@" ;;
  apply-sql) cmd_apply_sql "$@" ;;
  archive-push) cmd_archive_push "$@" ;;
  backup-init) cmd_backup_init ;;
  backup-upgrade) cmd_backup_upgrade ;;
  backup) cmd_backup "$@" ;;
  backup-info) cmd_backup_info ;;
  expire) cmd_expire "$@" ;;
  query) cmd_query "$@" ;;
  status) cmd_status "$@" ;;
  promote) cmd_promote ;;
  promote-after) cmd_promote_after "$@" ;;
  demote) cmd_demote "$@" ;;
  fence) cmd_fence ;;
  unfence) cmd_unfence "$@" ;;
  reload) cmd_reload "$@" ;;
  reload-tls) cmd_reload_tls "$@" ;;
  checkpoint) cmd_checkpoint ;;
  slots) cmd_slots "$@" ;;
  usage) cmd_usage ;;
  upgrade-check) cmd_upgrade_check "$@" ;;
  upgrade) cmd_upgrade "$@" ;;
  analyze) cmd_analyze ;;
  json) cmd_json "$@" ;;
  bg-dump) cmd_bg_dump "$@" ;;
  bg-passfile) cmd_bg_passfile ;;
  ready) cmd_ready ;;
  version) echo "{\"contract\":$CONTRACT}" ;;
  *) echo "usage: pgfleet-instance run|ready|status|promote|promote-after LSN|demote|fence|unfence|reload|reload-tls SHA256|checkpoint|slots NAME...|usage|version|archive-push PATH [pgbackrest]|backup-init|backup-upgrade|backup full|diff|incr [--standby]|backup-info|expire [--retention-full N|--retention-full-days D]|query [--db NAME] SQL|catalog [DB...]|apply-sql [--db NAME] < SQL|upgrade-check NEW_BIN [MIN_FREE_MB]|upgrade OLD_BIN NEW_BIN|analyze|json [--db NAME] < SQL|bg-dump roles|schema DB|bg-passfile < PASSWORD" >&2; exit 64 ;;
esac
