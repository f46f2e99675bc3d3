#!/usr/bin/env bash
# pg_upgrade from a cluster of the default major (Debian's 15) with idem in
# use to the major of PG_CONFIG, idem installed in both:
#
#   - the state: orders and their records, 500 expired records, a task
#     leased for an hour (PROCESSING, a fencing token held), a task due,
#     unacknowledged outbox messages of two keys, inbox entries;
#   - "behaves as before": the same script of calls (replays, a fingerprint
#     mismatch, a new key, heartbeat with the token held and with a stale
#     one, a lease, complete, the task's replay, fetch, ack, consume of a
#     redelivery and of a new message) gives the same answers on a copy of
#     the database taken just before the upgrade (CREATE DATABASE ...
#     TEMPLATE, which keeps the sequences' positions) and on the upgraded
#     database; and those answers are the protocol's (checked one by one);
#   - the cleanup worker did not run during the upgrade: both clusters are
#     configured with idem.cleanup_interval = 1s while pg_upgrade runs them,
#     the expired records are all still there afterwards, and the servers
#     pg_upgrade started logged no start of idem's launcher (log at debug1),
#     while the upgraded cluster's normal start does, and its worker then
#     deletes them.
#
#   PG_CONFIG=/path/to/new/pg_config IDEM_UPGRADE_FROM=/path/to/old/pg_config \
#     bash test/upgrade/pg_upgrade.sh
#
# idem must be installed in both majors (test/run_all.sh does so).  Prints
# "ok - ..." / "not ok - ..." lines.
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
source "$IDEM_ROOT/test/lib.sh"

OLD_PG_CONFIG=${IDEM_UPGRADE_FROM:-$DEBIAN_PG_CONFIG}
OLD_BIN=$("$OLD_PG_CONFIG" --bindir)
NEW_BIN=$PG_BINDIR
old_version=$("$OLD_PG_CONFIG" --version | awk '{print $2}')
new_version=$("$PG_CONFIG" --version | awk '{print $2}')
what="pg_upgrade $old_version -> $new_version"
if [ "${new_version%%.*}" -le "${old_version%%.*}" ] 2>/dev/null || [ "${old_version%%.*}" = "${new_version%%.*}" ]; then
	echo "skip - $what: pg_upgrade goes to a newer major only"
	exit 0
fi
for c in "$OLD_PG_CONFIG" "$PG_CONFIG"; do
	if [ ! -f "$("$c" --pkglibdir)/idem.so" ]; then
		echo "skip - $what: idem is not installed for $("$c" --version)"
		exit 0
	fi
done

work=$(mktemp -d -t idem-pg-upgrade.XXXXXX)
port=$(free_port)	# both clusters' (one runs at a time), on a socket in $work
chmod 755 "$work"
[ "$(id -u)" -eq 0 ] && chown postgres: "$work"
cleanup() {
	local d
	for d in "$work"/old "$work"/new "$work"/control/old "$work"/control/new; do
		if [ -f "$d/postmaster.pid" ]; then
			as_pg_user "$([ "$(basename "$d")" = old ] && echo "$OLD_BIN" || echo "$NEW_BIN")/pg_ctl" \
				-D "$d" -m immediate -w -s stop || true
		fi
	done
	[ -n "${IDEM_KEEP_TMP:-}" ] || rm -rf "$work"
}
at_exit cleanup

# initdb with the options pg_upgrade needs alike in both clusters (18 turns
# data checksums on by default; 15 has them off)
new_initdb() {
	local bin=$1 dir=$2 extra=()
	if "$bin/initdb" --help | grep -q -- --no-data-checksums; then
		extra+=(--no-data-checksums)
	fi
	as_pg_user "$bin/initdb" -D "$dir" -U postgres --auth=trust --encoding=UTF8 \
		--locale=C.UTF-8 --no-sync "${extra[@]}" >"$dir.initdb.log" 2>&1
	{
		echo "listen_addresses = ''"
		echo "unix_socket_directories = '$work'"
		echo "port = $port"
		echo "shared_preload_libraries = 'idem'"
		echo "fsync = off"
		echo "idem.cleanup_interval = 0"
	} >>"$dir/postgresql.conf"
}
set_conf() {	# set_conf DIR "name = value"
	echo "$2" >>"$1/postgresql.conf"
}
pg() { as_pg_user "$@"; }
q() { "$1/psql" -X -q -v ON_ERROR_STOP=1 -At -h "$work" -p "$port" -U postgres -d shop -c "$2"; }

new_initdb "$OLD_BIN" "$work/old"
new_initdb "$NEW_BIN" "$work/new"
pg "$OLD_BIN/pg_ctl" -D "$work/old" -l "$work/old.log" -w -s start
"$OLD_BIN/createdb" -h "$work" -p "$port" -U postgres shop

# --- the state, in the old cluster ---
"$OLD_BIN/psql" -X -q -v ON_ERROR_STOP=1 -h "$work" -p "$port" -U postgres -d shop >/dev/null <<'SQL'
CREATE EXTENSION idem;
SELECT count(idem_create_order(7, 'upg-key-' || lpad(g::text, 12, '0'), g, 1)) FROM generate_series(1, 20) g;
INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
SELECT 1, 'test', 'expired-' || g, repeat('0', 64), 'SUCCEEDED', now() - interval '1 minute'
FROM generate_series(1, 500) g;
SELECT idem_submit(3, 'SHIP', 'upg-task-000000001', '{"n": 1}');
SELECT idem_submit(3, 'SHIP', 'upg-task-000000002', '{"n": 2}');
SELECT count(*) FROM idem_lease('SHIP', 'w-before', '1 hour', 1);
BEGIN;
SELECT idem_outbox_emit('orders', jsonb_build_object('n', g), 'k' || g % 2) FROM generate_series(1, 6) g;
COMMIT;
SELECT idem_consume('billing', 'm-' || g) FROM generate_series(1, 5) g;
SQL
read -r task token < <(q "$OLD_BIN" "SELECT id, task_token FROM idem_internal.idempotency_record WHERE status = 'PROCESSING' AND task_token IS NOT NULL" | tr '|' ' ')

# The calls whose answers must not change across the upgrade.
checks() {	# checks BIN DB
	"$1/psql" -X -q -At -h "$work" -p "$port" -U postgres -d "$2" -v task="$task" -v token="$token" 2>&1 <<'SQL'
\set VERBOSITY sqlstate
SELECT 'replay', replayed, order_id, http_status FROM idem_create_order(7, 'upg-key-000000000005', 5, 1);
SELECT 'mismatch', order_id FROM idem_create_order(7, 'upg-key-000000000005', 6, 1);
SELECT 'new key', replayed, order_id FROM idem_create_order(7, 'upg-key-after-the-upgrade', 1, 1);
SELECT 'heartbeat', idem_heartbeat(:task, :token) > now() + interval '50 minutes';
SELECT 'stale token', idem_heartbeat(:task, :token - 1);
SELECT 'lease', key, attempt FROM idem_lease('SHIP', 'w-after', '1 hour', 10);
SELECT 'complete', idem_complete(:task, :token, 200, '{"shipped": true}');
SELECT 'task replay', replayed, status, http_status, body::text FROM idem_submit(3, 'SHIP', 'upg-task-000000001', '{"n": 1}');
CREATE TEMP TABLE got AS SELECT * FROM idem_outbox_fetch('orders', 10, '1 hour');
SELECT 'fetch', string_agg(message_id || ':' || msg_key || ':' || (payload->>'n') || ':' || attempt, ',' ORDER BY message_id) FROM got;
SELECT 'ack', idem_outbox_ack(array_agg(message_id)) FROM got;
TRUNCATE got; INSERT INTO got SELECT * FROM idem_outbox_fetch('orders', 10, '1 hour');
SELECT 'fetch', string_agg(message_id || ':' || msg_key || ':' || (payload->>'n') || ':' || attempt, ',' ORDER BY message_id) FROM got;
SELECT 'ack', idem_outbox_ack(array_agg(message_id)) FROM got;
TRUNCATE got; INSERT INTO got SELECT * FROM idem_outbox_fetch('orders', 10, '1 hour');
SELECT 'fetch', string_agg(message_id || ':' || msg_key || ':' || (payload->>'n') || ':' || attempt, ',' ORDER BY message_id) FROM got;
SELECT 'ack', idem_outbox_ack(array_agg(message_id)) FROM got;
SELECT 'fetch after ack', count(*) FROM idem_outbox_fetch('orders', 10);
SELECT 'consume redelivery', idem_consume('billing', 'm-3');
SELECT 'consume new', idem_consume('billing', 'm-new');
SELECT 'expired kept', count(*) FROM idem_internal.idempotency_record WHERE expires_at < now();
SQL
}

# the answers before: on a copy taken now, in the old cluster
"$OLD_BIN/createdb" -h "$work" -p "$port" -U postgres --template=shop probe
before=$(checks "$OLD_BIN" probe)
"$OLD_BIN/dropdb" -h "$work" -p "$port" -U postgres probe
pg "$OLD_BIN/pg_ctl" -D "$work/old" -m fast -w -s stop

# When the upgrade fails: does it fail without idem as well?  Upgrades two
# fresh clusters holding one plain table; prints the error of that upgrade
# and returns 0 if it fails too.
fails_without_idem() {
	local c=$work/control
	mkdir -p "$c"
	[ "$(id -u)" -eq 0 ] && chown postgres: "$c"
	new_initdb "$OLD_BIN" "$c/old"
	new_initdb "$NEW_BIN" "$c/new"
	sed -i "s/^shared_preload_libraries = 'idem'$//" "$c/old/postgresql.conf" "$c/new/postgresql.conf"
	pg "$OLD_BIN/pg_ctl" -D "$c/old" -l "$c/old.log" -w -s start
	"$OLD_BIN/psql" -X -q -h "$work" -p "$port" -U postgres -d postgres -c "CREATE TABLE plain (a int)"
	pg "$OLD_BIN/pg_ctl" -D "$c/old" -m fast -w -s stop
	if (cd "$c" && pg "$NEW_BIN/pg_upgrade" --old-bindir="$OLD_BIN" --new-bindir="$NEW_BIN" \
		--old-datadir="$c/old" --new-datadir="$c/new" --socketdir="$work" \
		--old-port="$port" --new-port="$port" --username=postgres --retain >"$c/pg_upgrade.log" 2>&1); then
		return 1
	fi
	grep -rh 'ERROR: ' "$c/new" --include='*.log' 2>/dev/null | head -n 1 | sed 's/.*ERROR: *//' || true
	return 0
}

# --- the upgrade: the worker would run every second in either cluster ---
for d in "$work/old" "$work/new"; do
	set_conf "$d" "idem.cleanup_interval = 1"
	set_conf "$d" "log_min_messages = debug1"
done
if (cd "$work" && pg "$NEW_BIN/pg_upgrade" --old-bindir="$OLD_BIN" --new-bindir="$NEW_BIN" \
	--old-datadir="$work/old" --new-datadir="$work/new" \
	--socketdir="$work" --old-port="$port" --new-port="$port" --username=postgres \
	--retain --link >"$work/pg_upgrade.log" 2>&1); then
	echo "ok - $what: pg_upgrade --check and the upgrade of a cluster with idem in use succeed"
elif why=$(fails_without_idem); then
	echo "skip - $what: pg_upgrade fails for a cluster without idem too (one plain table), so it cannot test idem here: $why"
	exit 0
else
	echo "not ok - $what: pg_upgrade failed"
	tail -n 30 "$work/pg_upgrade.log"
	find "$work" -name '*.log' -path '*pg_upgrade_output.d*' -exec tail -n 20 {} \;
	exit 0
fi
server_logs=$(find "$work" -path '*pg_upgrade_output.d*' -name 'pg_upgrade_server*.log' | head -n 20)
launches=$(cat $server_logs /dev/null | grep -c 'starting background worker process "idem cleanup' || true)
upgrade_ran_servers=$(cat $server_logs /dev/null | grep -c 'database system is ready\|database system was shut down' || true)
check "$what: the servers pg_upgrade ran (binary-upgrade mode, $upgrade_ran_servers log lines of theirs read) started no idem worker" \
	"0 true" "$launches $([ "$upgrade_ran_servers" -gt 0 ] && echo true || echo false)"

# --- after: the new cluster, the worker held off until the checks ran ---
set_conf "$work/new" "idem.cleanup_interval = 0"
pg "$NEW_BIN/pg_ctl" -D "$work/new" -l "$work/new.log" -w -s start
check "$what: the extension is at the same version" \
	"$("$NEW_BIN/psql" -X -At -h "$work" -p "$port" -U postgres -d shop -c "SELECT default_version FROM pg_available_extensions WHERE name = 'idem'")" \
	"$(q "$NEW_BIN" "SELECT extversion FROM pg_extension WHERE extname = 'idem'")"
after=$(checks "$NEW_BIN" shop)
if [ "$before" = "$after" ]; then
	echo "ok - $what: the calls answer as on a copy taken before the upgrade ($(echo "$after" | wc -l) lines)"
else
	echo "not ok - $what: the calls answer differently after the upgrade"
	diff <(echo "$before") <(echo "$after") || true
fi
expect_line() {	# expect_line NAME REGEX
	if grep -qE "$2" <<<"$after"; then
		echo "ok - $what: $1"
	else
		echo "not ok - $what: $1 (no line matches /$2/)"
		echo "$after"
	fi
}
expect_line "a retry replays its stored order" '^replay\|t\|[0-9]+\|201$'
expect_line "a different request under the key is refused (IK001)" '^ERROR:  IK001'
expect_line "a new key executes, order 21" '^new key\|f\|21$'
expect_line "the lease taken before the upgrade still holds: its token extends it" '^heartbeat\|t$'
expect_line "a stale token is refused (IK004)" '^ERROR:  IK004'
expect_line "the due task is leased, attempt 1; the held one is not handed out again" '^lease\|upg-task-000000002\|1$'
expect_line "the task completes with its token and replays its result" '^task replay\|t\|SUCCEEDED\|200\|\{"shipped": true\}$'
check "$what: the unacknowledged messages are fetched key by key in emit order, and acknowledged" \
	'fetch|1:k1:1:1,2:k0:2:1 ack|2 fetch|3:k1:3:1,4:k0:4:1 ack|2 fetch|5:k1:5:1,6:k0:6:1 ack|2 fetch after ack|0' \
	"$(echo "$after" | grep -E '^(fetch|ack)' | paste -sd' ')"
expect_line "a redelivered message is not consumed twice" '^consume redelivery\|f$'
expect_line "a new message is consumed" '^consume new\|t$'
expect_line "the 500 expired records are all still there: no cleanup ran" '^expired kept\|500$'

# the worker, turned on now, runs in the upgraded cluster and deletes them
set_conf "$work/new" "idem.cleanup_interval = 1"
"$NEW_BIN/psql" -X -q -h "$work" -p "$port" -U postgres -d shop -c "SELECT pg_reload_conf()" >/dev/null
expired="SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()"
until_sql 0 q "$NEW_BIN" "$expired" || true
left=$(q "$NEW_BIN" "$expired")
check "$what: the worker of the upgraded cluster then deletes the expired records" "0" "$left"
check "$what: ... and its server log shows the launcher's start (what the upgrade's logs lacked)" "true" \
	"$(grep -q 'starting background worker process "idem cleanup' "$work/new.log" && echo true || echo false)"
