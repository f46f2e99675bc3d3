#!/usr/bin/env bash
# The Citus stage: idem distributed by owner on a coordinator and two workers
# on loopback (test/citus/cluster.sh), every call made through the
# coordinator.  Runs when Citus is installed for the server under test
# (citus.control in its pg_config --sharedir, citus.so in its
# --pkglibdir); otherwise prints one "skip - citus: ..." line and exits.
# Prints one "ok - ..." or "not ok - ..." line per check.
#
#   bash test/citus/run.sh
source "$(dirname "$0")/../lib.sh"
source "$(dirname "$0")/cluster.sh"
here=$(cd "$(dirname "$0")" && pwd)
# in every key: keys are 16 to 128 characters
tag=$(printf "%07d" "$$")

ensure_packages
if ! why=$(citus_installed); then
	citus_skip_line "$why"
	exit 0
fi
if ! [ -f "$PG_BINDIR/../lib/idem.so" ] && ! [ -f "$($PG_CONFIG --pkglibdir)/idem.so" ]; then
	build_install
fi
CITUS_WAIT_TIMEOUT=1s citus_cluster_start
log "Citus cluster: coordinator :$COORD_PORT, workers :$WORKER1_PORT :$WORKER2_PORT"
# a command that fails stops the script (set -e): say so, as a failed check
finished=0
at_exit '[ "$finished" = 1 ] || echo "not ok - the Citus stage stopped before its end"' 

c() { cq "$COORD_PORT" "$@"; }
# The functions idem_distribute() delegates: those that take an owner first
# (idem_consume: a consumer).
delegated="idem_begin idem_consume idem_create_order idem_finish idem_finish_stored idem_run idem_submit"
# The SQLSTATE of a statement run through the coordinator, or "ok".
sqlstate() {
	local out
	out=$(c -v VERBOSITY=sqlstate -c "$1" 2>&1 >/dev/null || true)
	out=$(echo "$out" | sed -n 's/^ERROR:  *//p')
	echo "${out:-ok}"
}
# The port of the worker holding owner $1's shard of idem_internal.idempotency_record.
node_of() {
	c -c "SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid)
	      WHERE p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', $1)"
}
# Rows of table $1 matching $2 on each worker, as "port:count port:count",
# counted shard by shard where the shards are (run_command_on_placements).
rows_by_node() {
	local pred=${2//\'/\'\'}
	pred=${pred//%/%%}
	c -c "SELECT string_agg(nodeport || ':' || n, ' ' ORDER BY groupid) FROM (
	        SELECT w.groupid, w.nodeport, coalesce(sum(p.result::bigint), 0) AS n
	          FROM pg_dist_node w
	          LEFT JOIN run_command_on_placements('$1', 'SELECT count(*) FROM %s WHERE $pred') p
	            ON p.nodeport = w.nodeport
	         WHERE w.groupid <> 0 GROUP BY w.groupid, w.nodeport) s"
}

# A generic operation: a ledger distributed with idem's tables; the handler
# writes the owner's entry (the request carries the owner: a handler sees
# only the request).
c <<'SQL' >/dev/null
CREATE TABLE ledger (owner_id bigint NOT NULL, id bigserial, amount numeric NOT NULL,
                     PRIMARY KEY (owner_id, id));
SELECT create_distributed_table('ledger', 'owner_id', colocate_with => 'idem_internal.idempotency_record');
CREATE FUNCTION ledger_handler(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
DECLARE e bigint;
BEGIN
    IF (request->>'amount')::numeric <= 0 THEN
        RETURN ROW(422, json_build_object('error', 'amount must be positive'), NULL, NULL)::idem_result;
    END IF;
    INSERT INTO public.ledger (owner_id, amount)
    VALUES ((request->>'owner')::bigint, (request->>'amount')::numeric) RETURNING id INTO e;
    RETURN ROW(201, json_build_object('entry', e), '{"Location": "/ledger"}', e)::idem_result;
END $$;
CREATE TABLE load_log (round_key text, order_id bigint, replayed boolean);
SQL

w1=$WORKER1_PORT
w2=$WORKER2_PORT
# owners on each worker
owner_w1=$(c -c "SELECT o FROM generate_series(1, 100) o WHERE (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', o)) = $w1 LIMIT 1")
owner_w2=$(c -c "SELECT o FROM generate_series(1, 100) o WHERE (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', o)) = $w2 LIMIT 1")

check "idem_distribute: idempotency_record, purchase_order, idem_history, idem_task_attempt, idem_operator_audit co-located by owner_id, idem_inbox by consumer, idem_policy a reference table (all in idem_internal)" \
	"idem_internal.idem_history:owner_id idem_internal.idem_inbox:consumer idem_internal.idem_operator_audit:owner_id idem_internal.idem_policy:n idem_internal.idem_task_attempt:owner_id idem_internal.idempotency_record:owner_id idem_internal.purchase_order:owner_id t" \
	"$(c -c "SELECT string_agg(logicalrelid::text || ':' || coalesce(column_to_column_name(logicalrelid, partkey), partmethod::text), ' ' ORDER BY logicalrelid::text),
	               (SELECT count(DISTINCT colocationid) = 1 FROM pg_dist_partition
	                 WHERE logicalrelid IN ('idem_internal.idempotency_record'::regclass, 'idem_internal.purchase_order'::regclass, 'idem_internal.idem_history'::regclass,
	                                        'idem_internal.idem_task_attempt'::regclass, 'idem_internal.idem_operator_audit'::regclass,
	                                        'ledger'::regclass))
	          FROM pg_dist_partition WHERE logicalrelid::text NOT IN ('ledger')" | tr '|' ' ')"
check "idem_distribute: keys include owner_id; the scope constraint unchanged" \
	"idempotency_record_pkey:(owner_id, id) purchase_order_order_no_key:(owner_id, order_no) purchase_order_pkey:(owner_id, id) uk_idempotency_scope:(owner_id, operation, idempotency_key)" \
	"$(c -c "SELECT string_agg(conname || ':' || regexp_replace(pg_get_constraintdef(oid), '^[A-Z ]+ ', ''), ' ' ORDER BY conname)
	          FROM pg_constraint WHERE contype IN ('p', 'u')
	           AND conrelid IN ('idem_internal.idempotency_record'::regclass, 'idem_internal.purchase_order'::regclass)")"
check "idem_distribute: the functions that take an owner are delegated by it" \
	"$delegated" \
	"$(c -c "SELECT string_agg(p.proname, ' ' ORDER BY p.proname) FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid
	          WHERE d.classid = 'pg_proc'::regclass AND d.distribution_argument_index = 0 AND d.force_delegation")"
c -c "SELECT idem_distribute()" >/dev/null
check "idem_distribute: a second run changes nothing" \
	"$(echo "$delegated" | wc -w) 7" "$(c -c "SELECT (SELECT count(*) FROM pg_dist_object WHERE classid = 'pg_proc'::regclass AND distribution_argument_index = 0),
	                      (SELECT count(*) FROM pg_dist_partition WHERE logicalrelid::text <> 'ledger')" | tr '|' ' ')"
check "owners $owner_w1 and $owner_w2 have their shards on different workers" \
	"$w1 $w2" "$(node_of "$owner_w1") $(node_of "$owner_w2")"

# ---- the article's seven tests, through the coordinator ----
for o in "$owner_w1" "$owner_w2"; do
	key=$(printf 'citus-serial-%s-%06d' "$tag" "$o")
	first=$(c -c "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order($o, '$key', 5, 2)")
	second=$(c -c "SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order($o, '$key', 5, 2)")
	check "1. create_order (owner $o): twice in a row, one order" "1" \
		"$(c -c "SELECT count(*) FROM idem_internal.purchase_order o JOIN idem_internal.idempotency_record r ON r.owner_id = o.owner_id AND r.resource_id = o.id WHERE r.owner_id = $o AND r.idempotency_key = '$key'")"
	check "6. create_order (owner $o): the replay returns the first answer" "${first%|f}|t" "$second"
	check "3. create_order (owner $o): the key with another request is IK001" "IK001" \
		"$(sqlstate "SELECT * FROM idem_create_order($o, '$key', 5, 3)")"

	key=$(printf 'citus-generic-%s-%06d' "$tag" "$o")
	req="{\"owner\": $o, \"amount\": 10}"
	first=$(c -c "SELECT http_status, body, headers, resource_id, replayed FROM idem_run($o, 'PAY', '$key', '$req', 'ledger_handler(jsonb)')")
	second=$(c -c "SELECT http_status, body, headers, resource_id, replayed FROM idem_run($o, 'PAY', '$key', '$req', 'ledger_handler(jsonb)')")
	check "1. idem_run (owner $o): twice in a row, one ledger entry" "1" \
		"$(c -c "SELECT count(*) FROM ledger WHERE owner_id = $o")"
	check "6. idem_run (owner $o): the replay returns the same status, body and headers" "${first%|f}|t" "$second"
	check "3. idem_run (owner $o): the key with another request is IK001" "IK001" \
		"$(sqlstate "SELECT * FROM idem_run($o, 'PAY', '$key', '{\"owner\": $o, \"amount\": 11}', 'ledger_handler(jsonb)')")"
done

# 4. a first attempt that fails (rolled back on the worker, inside the
#    coordinator's transaction block): the retry executes
key="citus-rollback-$tag-000001"
c -c "BEGIN" -c "SELECT * FROM idem_create_order($owner_w1, '$key', 6, 1)" -c "ROLLBACK" >/dev/null
check "4. create_order: after a rolled-back first attempt the retry executes" "f" \
	"$(c -c "SELECT replayed FROM idem_create_order($owner_w1, '$key', 6, 1)")"
key="citus-rollback-$tag-000002"
c -c "BEGIN" -c "SELECT * FROM idem_run($owner_w2, 'PAY', '$key', '{\"owner\": $owner_w2, \"amount\": 3}', 'ledger_handler(jsonb)')" -c "ROLLBACK" >/dev/null
check "4. idem_run: after a rolled-back first attempt the retry executes, one entry" "f 1" \
	"$(c -c "SELECT replayed FROM idem_run($owner_w2, 'PAY', '$key', '{\"owner\": $owner_w2, \"amount\": 3}', 'ledger_handler(jsonb)')") $(c -c "SELECT count(*) FROM ledger WHERE owner_id = $owner_w2 AND amount = 3")"

# 5. no cache in front: the unique index on the shard is the arbiter; a
#    duplicate written around idem fails there
check "5. a duplicate record written around idem fails on the shard's unique index (23505)" "23505" \
	"$(sqlstate "INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	             VALUES ($owner_w1, 'CREATE_ORDER', 'citus-rollback-$tag-000001', repeat('0', 64), 'PROCESSING', now() + interval '1 day')")"

# 7. other owners, same key, same node and other node
key="citus-shared-key-$tag"
o3=$(c -c "SELECT o FROM generate_series($owner_w1 + 1, 200) o WHERE (SELECT n.nodeport FROM pg_dist_placement p JOIN pg_dist_node n USING (groupid) WHERE p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', o)) = $w1 LIMIT 1")
for o in "$owner_w1" "$owner_w2" "$o3"; do
	c -c "SELECT * FROM idem_create_order($o, '$key', 7, 1)" >/dev/null
	c -c "SELECT * FROM idem_run($o, 'PAY', '$key', '{\"owner\": $o, \"amount\": 7}', 'ledger_handler(jsonb)')" >/dev/null
done
check "7. three owners (two on one worker, one on the other), one key: three orders, three entries, all fresh" "3 3 3" \
	"$(c -c "SELECT count(DISTINCT resource_id) FILTER (WHERE operation = 'CREATE_ORDER'),
	               count(DISTINCT resource_id) FILTER (WHERE operation = 'PAY')
	          FROM idem_internal.idempotency_record WHERE idempotency_key = '$key'" | tr '|' ' ') $(c -c "SELECT count(*) FROM ledger WHERE amount = 7")"

# ---- 2. load: 20 clients x 30 rounds, one key per round ----
ROUNDS=${ROUNDS:-30}
CLIENTS=${CLIENTS:-20}
failed_runs=0
failed_txns=0
for round in $(seq 1 "$ROUNDS"); do
	key=$(printf 'citus-round-%06d-%s' "$round" "$tag")
	if ! out=$("$PG_BINDIR/pgbench" -n -M prepared -h 127.0.0.1 -p "$COORD_PORT" -U postgres \
			-c "$CLIENTS" -j 2 -t 1 -D key="$key" -D owner="$owner_w2" -f "$here/same_key.pgbench" idem 2>&1); then
		failed_runs=$((failed_runs + 1))
		echo "$out" | tail -5 >&2
	fi
	n=$(echo "$out" | sed -n 's/^number of failed transactions: \([0-9]*\).*/\1/p')
	failed_txns=$((failed_txns + ${n:-0}))
done
check "2. load: $ROUNDS rounds of $CLIENTS clients through the coordinator, no failed transaction" "0 0" \
	"$failed_runs $failed_txns"
check "2. load: exactly one order per round" "$ROUNDS" \
	"$(c -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = $owner_w2 AND idempotency_key LIKE 'citus-round-%-$tag'")"
check "2. load: every caller of a round got the same order, one executed and $((CLIENTS - 1)) replayed" "$ROUNDS" \
	"$(c -c "SELECT count(*) FROM (SELECT round_key FROM load_log GROUP BY round_key
	          HAVING count(*) = $CLIENTS AND count(DISTINCT order_id) = 1
	             AND count(*) FILTER (WHERE NOT replayed) = 1) s")"
check "2. load: each round's order exists once, the one its record points to" "$ROUNDS" \
	"$(c -c "SELECT count(*) FROM (SELECT DISTINCT l.round_key, l.order_id FROM load_log l) l
	          JOIN idem_internal.idempotency_record r ON r.owner_id = $owner_w2 AND r.idempotency_key = l.round_key AND r.resource_id = l.order_id
	          JOIN idem_internal.purchase_order o ON o.owner_id = $owner_w2 AND o.id = l.order_id")"
n_rec=$(c -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = $owner_w2")
n_ord=$(c -c "SELECT count(*) FROM idem_internal.purchase_order WHERE owner_id = $owner_w2")
check "2. load: owner $owner_w2's records are all on its worker (:$w2), none elsewhere" \
	"$w1:0 $w2:$n_rec" "$(rows_by_node idem_internal.idempotency_record "owner_id = $owner_w2")"
check "2. load: owner $owner_w2's orders are all on its worker, in the co-located shard" \
	"$w1:0 $w2:$n_ord" "$(rows_by_node idem_internal.purchase_order "owner_id = $owner_w2")"
check "2. load: the shell tables on the coordinator and the workers are empty" "0 0 0" \
	"$(for p in $COORD_PORT $w1 $w2; do cq "$p" -c "SELECT pg_relation_size('idem_internal.idempotency_record') + pg_relation_size('idem_internal.purchase_order')"; done | tr '\n' ' ' | sed 's/ $//')"

check "ids and order numbers are unique across the cluster, drawn from each worker's own range" "0 0 0 2" \
	"$(c -c "SELECT count(*) - count(DISTINCT id), count(*) - count(DISTINCT order_no) FROM idem_internal.purchase_order" | tr '|' ' ') $(c -c "SELECT count(*) - count(DISTINCT id) FROM idem_internal.idempotency_record") $(c -c "SELECT count(DISTINCT id >> 48) FROM idem_internal.purchase_order")"

# ---- calls Citus does not delegate: they run themselves again, delegated ----
key="citus-undelegated-$tag"
check "not delegated (owner from a column, one statement, two workers): each call runs on its owner's node" "false false" \
	"$(c -c "SELECT string_agg((idem_create_order(o, '$key', 9, 1)).replayed::text, ' ') FROM (VALUES ($owner_w1::bigint), ($owner_w2)) v(o)")"
check "not delegated: a repeat replays both" "true true" \
	"$(c -c "SELECT string_agg((idem_create_order(o, '$key', 9, 1)).replayed::text, ' ') FROM (VALUES ($owner_w1::bigint), ($owner_w2)) v(o)")"
check "not delegated (PERFORM in PL/pgSQL, in a transaction block): one order, on the owner's node" "$w1:1 $w2:0" \
	"$(c -c "BEGIN" -c "DO \$\$ BEGIN PERFORM idem_create_order($owner_w1, 'citus-plpgsql-$tag', 9, 2); PERFORM idem_create_order($owner_w1, 'citus-plpgsql-$tag', 9, 2); END \$\$" -c "COMMIT" >/dev/null; rows_by_node idem_internal.idempotency_record "idempotency_key = 'citus-plpgsql-$tag'")"
check "idem_begin ... idem_finish in one transaction block through the coordinator" "f t|202|{\"queued\": true}" \
	"$(c -c "BEGIN" -c "SELECT replayed FROM idem_begin($owner_w2, 'QUEUE', 'citus-two-step-$tag', '{}')" \
	      -c "SELECT idem_finish($owner_w2, 'QUEUE', 'citus-two-step-$tag', 202, '{\"queued\": true}')" -c "COMMIT" | sed -n 1p) $(c -c "SELECT replayed, http_status, body FROM idem_begin($owner_w2, 'QUEUE', 'citus-two-step-$tag', '{}')")"

# ---- IK002: an original held open on a worker ----
key="citus-held-$tag"
gate_close c
c -c "BEGIN" -c "SELECT order_id FROM idem_create_order($owner_w1, '$key', 8, 1)" -c "SELECT $(gate_lock)" -c "COMMIT" >/dev/null &
holder=$!
gate_waited c	# the original claimed its key and is held open
start=$(date +%s%N)
state=$(sqlstate "SELECT * FROM idem_create_order($owner_w1, '$key', 8, 1)")
waited=$((($(date +%s%N) - start) / 1000000))
check "IK002: a duplicate of an original held on worker :$w1 waits idem.wait_timeout (1 s there), then IK002" "IK002 yes" \
	"$state $([ "$waited" -ge 900 ] && echo yes || echo "no ($waited ms)")"
gate_open c
wait "$holder" || true
check "IK002: once the original commits, the retry replays it" "t" \
	"$(c -c "SELECT replayed FROM idem_create_order($owner_w1, '$key', 8, 1)")"

# ---- expiry and renewal ----
key="citus-expiry-$tag"
req="{\"owner\": $owner_w2, \"amount\": 4}"
c -c "SELECT * FROM idem_run($owner_w2, 'PAY', '$key', '$req', 'ledger_handler(jsonb)', ttl => '1 second')" >/dev/null
until_sql t c -c "SELECT bool_and(expires_at < now()) FROM idem_internal.idempotency_record WHERE owner_id = $owner_w2 AND idempotency_key = '$key'"
check "expiry: an expired key starts fresh (a second entry), in the same record, renewed" "f 2 1 t" \
	"$(c -c "SELECT replayed FROM idem_run($owner_w2, 'PAY', '$key', '$req', 'ledger_handler(jsonb)', ttl => '1 hour')") $(c -c "SELECT (SELECT count(*) FROM ledger WHERE owner_id = $owner_w2 AND amount = 4), count(*), bool_and(expires_at > now() + interval '50 minutes') FROM idem_internal.idempotency_record WHERE owner_id = $owner_w2 AND idempotency_key = '$key'" | tr '|' ' ')"

# ---- the inbox, by consumer ----
check "idem_consume through the coordinator: the first delivery consumes, the second does not" "t f" \
	"$(c -c "SELECT idem_consume('billing', 'msg-$tag')") $(c -c "SELECT idem_consume('billing', 'msg-$tag')")"
check "the inbox entry is in its consumer's shard only" "1 1" \
	"$(c -c "SELECT sum(result::int) FILTER (WHERE shardid = get_shard_id_for_distribution_column('idem_internal.idem_inbox', 'billing'::varchar)), sum(result::int)
	          FROM run_command_on_placements('idem_internal.idem_inbox', 'SELECT count(*) FROM %s WHERE message_id = ''msg-$tag''')" | tr '|' ' ')"

# ---- cleanup on every node ----
for o in $(seq 1 40); do
	echo "SELECT * FROM idem_run($o, 'PAY', 'citus-expire-$tag-$o', '{\"owner\": $o, \"amount\": 1}', 'ledger_handler(jsonb)', ttl => '1 second');"
done | c >/dev/null
until_sql t c -c "SELECT bool_and(expires_at < now()) FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'citus-expire-$tag-%'"
expired_by_node=$(rows_by_node idem_internal.idempotency_record "idempotency_key LIKE 'citus-expire-$tag-%' AND expires_at < now()")
check "cleanup: expired records on both workers" "yes" \
	"$(echo "$expired_by_node" | awk '{split($1, a, ":"); split($2, b, ":"); print (a[2] > 0 && b[2] > 0) ? "yes" : "no: " $0}')"
check "cleanup: idem_cleanup_expired() on the coordinator deletes every worker's" "40" \
	"$(c -c "SELECT idem_cleanup_expired()")"
check "cleanup: none is left on any node" "$w1:0 $w2:0" \
	"$(rows_by_node idem_internal.idempotency_record "idempotency_key LIKE 'citus-expire-$tag-%'")"
# the background worker of each node cleans that node's shards
for o in $(seq 1 40); do
	echo "SELECT * FROM idem_run($o, 'PAY', 'citus-bgw-$tag-$o', '{\"owner\": $o, \"amount\": 1}', 'ledger_handler(jsonb)', ttl => '1 second');"
done | c >/dev/null
for p in $COORD_PORT $w1 $w2; do
	cq "$p" -c "ALTER SYSTEM SET idem.cleanup_interval = 1" -c "SELECT pg_reload_conf()" >/dev/null
done
bgw="idempotency_key LIKE 'citus-bgw-$tag-%'"
until_sql "$w1:0 $w2:0" rows_by_node idem_internal.idempotency_record "$bgw" || true
left=$(rows_by_node idem_internal.idempotency_record "$bgw")
check "cleanup: the background worker of each worker node deletes its own shards' expired records" "$w1:0 $w2:0" "$left"
check "cleanup: no node's cleanup worker reported an error" "" \
	"$(for p in $COORD_PORT $w1 $w2; do cq "$p" -c "SELECT last_error FROM idem_cleanup_status() WHERE last_error IS NOT NULL"; done)"
for p in $COORD_PORT $w1 $w2; do
	cq "$p" -c "ALTER SYSTEM RESET idem.cleanup_interval" -c "SELECT pg_reload_conf()" >/dev/null
done

# ---- 1.11: the policies on every node, the audit trail with the records ----
check "policies: idem_internal.idem_policy's trigger is on each of its 3 placements" "3" \
	"$(c -c "SELECT sum(result::int) FROM run_command_on_placements('idem_internal.idem_policy',
	          'SELECT count(*) FROM pg_trigger WHERE tgrelid = ''%s''::regclass AND tgname LIKE ''idem_policy_changed%%''')")"
c -c "SELECT operation FROM idem_set_policy('AUDITED', ttl => '2 days', audit_ttl => '30 days', reuse_after_expiry => 'refuse')" >/dev/null
lifetimes() {	# the stored lifetimes of the records whose keys start with $1
	c -c "SELECT string_agg(DISTINCT (expires_at - created_at)::text, ' ') FROM idem_internal.idempotency_record WHERE idempotency_key LIKE '$1%'"
}
audited() {	# audited OWNER KEY: idem_run of operation AUDITED
	c -c "SELECT replayed FROM idem_run($1, 'AUDITED', '$2', '{\"owner\": $1, \"amount\": 2}', 'ledger_handler(jsonb)')"
}
for o in "$owner_w1" "$owner_w2"; do audited "$o" "citus-audit-$tag-a$o" >/dev/null; done
check "policies: a policy set on the coordinator applies on both workers (ttl 2 days)" "2 days" "$(lifetimes "citus-audit-$tag-a")"
c -c "SELECT operation FROM idem_set_policy('AUDITED', ttl => '3 days')" >/dev/null
for o in "$owner_w1" "$owner_w2"; do audited "$o" "citus-audit-$tag-b$o" >/dev/null; done
check "policies: changed on the coordinator, the workers' backends read it again (ttl 3 days)" "3 days" "$(lifetimes "citus-audit-$tag-b")"
c -c "UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE idempotency_key LIKE 'citus-audit-$tag-%'" >/dev/null
c -c "SELECT idem_cleanup_expired()" >/dev/null
check "audit: the cleanup kept the expired records' audit fields in idem_internal.idem_history, on each owner's node" "$w1:2 $w2:2" \
	"$(rows_by_node idem_internal.idem_history "idempotency_key LIKE 'citus-audit-$tag-%' AND audit_until > now() + interval '29 days'")"
check "audit: and deleted the records" "$w1:0 $w2:0" "$(rows_by_node idem_internal.idempotency_record "idempotency_key LIKE 'citus-audit-$tag-%'")"
check "audit: a retry of an archived key through the coordinator is IK007 (reuse_after_expiry 'refuse'), on either worker" "IK007 IK007" \
	"$(sqlstate "SELECT * FROM idem_run($owner_w1, 'AUDITED', 'citus-audit-$tag-a$owner_w1', '{\"owner\": $owner_w1, \"amount\": 2}', 'ledger_handler(jsonb)')") $(sqlstate "SELECT * FROM idem_run($owner_w2, 'AUDITED', 'citus-audit-$tag-a$owner_w2', '{\"owner\": $owner_w2, \"amount\": 2}', 'ledger_handler(jsonb)')")"
check "audit: idem_audit on the coordinator shows the 4 past executions" "4" \
	"$(c -c "SELECT count(*) FROM idem_audit WHERE idempotency_key LIKE 'citus-audit-$tag-%' AND NOT live")"
c -c "SELECT idem_forget_owner($owner_w1)" >/dev/null
check "audit: idem_forget_owner($owner_w1) through the coordinator erases that owner's history on its node" "$w1:0 $w2:2" \
	"$(rows_by_node idem_internal.idem_history "idempotency_key LIKE 'citus-audit-$tag-%'")"
c -c "SELECT idem_drop_policy('AUDITED')" >/dev/null

# ---- owner binding: a role bound by idem.allowed_owners (ALTER ROLE, which
#      Citus propagates) is bound on the worker the call is delegated to ----
c -c "CREATE ROLE regress_app_one LOGIN" \
  -c "ALTER ROLE regress_app_one SET idem.allowed_owners = '$owner_w1'" \
  -c "GRANT EXECUTE ON FUNCTION idem_create_order(bigint, text, bigint, integer) TO regress_app_one" >/dev/null
as_app() { "$PG_BINDIR/psql" -X -q -At -h 127.0.0.1 -p "$COORD_PORT" -U regress_app_one -d idem -v VERBOSITY=sqlstate "$@"; }
check "allowed_owners: a bound role creates its own owner's order through the coordinator" "f" \
	"$(as_app -c "SELECT replayed FROM idem_create_order($owner_w1, 'citus-bound-$tag-0001', 3, 1)")"
check "allowed_owners: another owner's call, delegated to the other worker, is 42501 there" "ERROR:  42501" \
	"$(as_app -c "SELECT replayed FROM idem_create_order($owner_w2, 'citus-bound-$tag-0002', 3, 1)" 2>&1)"

# ---- the outbox is each node's own: a message emitted by a delegated call
#      commits with it on the owner's node ----
c <<'SQL' >/dev/null
CREATE FUNCTION emit_handler(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
BEGIN
    PERFORM idem_outbox_emit('citus-orders', request, request->>'owner');
    RETURN ROW(202, '{"queued": true}', NULL, NULL)::idem_result;
END $$;
SQL
for _ in 1 2; do
	c -c "SELECT * FROM idem_run($owner_w1, 'EMIT', 'citus-emit-$tag-0001', '{\"owner\": \"$owner_w1\"}', 'emit_handler(jsonb)')" >/dev/null
done
check "outbox: a message emitted in a delegated idem_run is in its worker's outbox, once (the replay emits nothing)" "0 1 0" \
	"$(for p in $COORD_PORT $w1 $w2; do cq "$p" -c "SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'citus-orders'"; done | tr '\n' ' ' | sed 's/ $//')"
check "outbox: a relay connected to that worker fetches and acks it" "1 1" \
	"$(cq "$w1" -c "SELECT count(*) FROM idem_outbox_fetch('citus-orders')") $(cq "$w1" -c "SELECT idem_outbox_ack(array_agg(message_id)) FROM idem_internal.idem_outbox WHERE topic = 'citus-orders'")"

# ---- long flows: submitted through the coordinator, leased on the workers ----
for o in $(seq 1 20); do
	echo "SELECT replayed FROM idem_submit($o, 'SHIP', 'citus-task-$tag-$o', '{\"parcel\": $o}');"
done | c >/dev/null
check "tasks: 20 tasks submitted through the coordinator, each on its owner's node" "$(rows_by_node idem_internal.idempotency_record "owner_id BETWEEN 1 AND 20 AND operation = 'SHIP' AND idempotency_key LIKE 'citus-task-$tag-%'")" \
	"$(for p in $w1 $w2; do
		n=$(c -c "SELECT count(*) FROM generate_series(1, 20) o JOIN pg_dist_placement p ON p.shardid = get_shard_id_for_distribution_column('idem_internal.idempotency_record', o) JOIN pg_dist_node n USING (groupid) WHERE n.nodeport = $p")
		printf '%s:%s ' "$p" "$n"; done | sed 's/ $//')"
check "tasks: the coordinator, which holds no shard, refuses to lease (0A000)" "0A000" \
	"$(sqlstate "SELECT * FROM idem_lease('SHIP', 'w0')")"
leased=""
for p in $w1 $w2; do
	leased="$leased $p:$(cq "$p" -c "SELECT count(*) FROM (SELECT idem_complete(task_id, token, 200, json_build_object('shipped', request->'parcel'))
	                                  FROM idem_lease('SHIP', 'w-$p', batch => 100)) s")"
done
check "tasks: a worker on each node leases and completes that node's tasks, and only those" \
	"$(rows_by_node idem_internal.idempotency_record "operation = 'SHIP' AND idempotency_key LIKE 'citus-task-$tag-%'")" "${leased# }"
check "tasks: all 20 succeeded; a repeated submit through the coordinator replays the result" "20 t|SUCCEEDED|200" \
	"$(c -c "SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'SHIP' AND status = 'SUCCEEDED' AND idempotency_key LIKE 'citus-task-$tag-%'") $(c -c "SELECT replayed, status, http_status FROM idem_submit(1, 'SHIP', 'citus-task-$tag-1', '{\"parcel\": 1}')")"
c -c "SELECT replayed FROM idem_submit($owner_w1, 'SHIP', 'citus-task-$tag-stale', '{}')" >/dev/null
read -r task_id first_token <<<"$(cq "$w1" -F ' ' -c "SELECT task_id, token FROM idem_lease('SHIP', 'w-a', lease => '1 millisecond')")"
until_sql t cq "$w1" -c "SELECT task_lease_expires_at < now() FROM idem_internal.idempotency_record WHERE id = $task_id"
second_token=$(cq "$w1" -c "SELECT token FROM idem_lease('SHIP', 'w-b')" || true)
check "tasks: a lapsed lease is taken over on its worker; the first holder's token is IK004 there, the new one completes" \
	"yes IK004 ok" \
	"$([ "${second_token:-0}" -gt "${first_token:-0}" ] && echo yes || echo "no ($first_token, $second_token)") $(cq "$w1" -v VERBOSITY=sqlstate -c "SELECT idem_complete($task_id, $first_token, 200, '{}')" 2>&1 | sed -n 's/^ERROR:  *//p') $(cq "$w1" -c "SELECT idem_complete($task_id, $second_token, 200, '{}')" >/dev/null && echo ok)"
check "tasks: the attempts are kept in the owner's shard, and read through the coordinator" "lapsed,succeeded $w1:2 $w2:0" \
	"$(c -c "SELECT string_agg(outcome, ',' ORDER BY token) FROM idem_task_attempts WHERE task_id = $task_id") $(rows_by_node idem_internal.idem_task_attempt "task_id = $task_id")"
# an operator's action (1.16) on the task's node: audited in the owner's shard
c -c "SELECT replayed FROM idem_submit($owner_w1, 'SHIP', 'citus-op-$tag-1', '{}')" >/dev/null
check "tasks: an operator cancels a task on its node; the audit row is in the owner's shard, read through the coordinator" \
	"FAILED_FINAL $w1:1 $w2:0 cancel" \
	"$(cq "$w1" -c "SELECT idem_task_cancel(r.id, 'citus-op-$tag') FROM idem_internal.idempotency_record r WHERE r.idempotency_key = 'citus-op-$tag-1'") $(rows_by_node idem_internal.idem_operator_audit "reason = 'citus-op-$tag'") $(c -c "SELECT action FROM idem_operator_actions WHERE reason = 'citus-op-$tag'")"
# an uncertain outcome (1.16): marked on its node, leased only to reconcile, with its attempts
c -c "SELECT operation FROM idem_set_policy('PAYU', uncertain => 'reconcile')" >/dev/null
c -c "SELECT replayed FROM idem_submit($owner_w2, 'PAYU', 'citus-pay-$tag-1', '{\"amount\": 5}')" >/dev/null
check "tasks: an unknown outcome on a worker node is marked; a plain lease there gets nothing, a reconcile lease the task with its attempts" \
	"PROCESSING 0 unknown" \
	"$(cq "$w2" -c "SELECT idem_fail_unknown(task_id, token, '{\"provider\": \"timeout\"}') FROM idem_lease('PAYU', 'w-u')") $(cq "$w2" -c "SELECT count(*) FROM idem_lease('PAYU', 'w-v')") $(cq "$w2" -c "SELECT attempts->0->>'outcome' FROM idem_lease_reconcile('PAYU', 'w-r')")"

# ---- a worker node stopped (immediate) mid-load ----
restart_worker1() {
	as_pg_user "$PG_BINDIR/pg_ctl" -D "$CITUS_TMP/worker1" -m immediate -w -s stop
	as_pg_user "$PG_BINDIR/pg_ctl" -D "$CITUS_TMP/worker1" -l "$CITUS_TMP/worker1.log" -w -s start
}
/usr/bin/python3 "$here/crash_load.py" "$COORD_PORT" "$tag" >"$CITUS_TMP/crash_load.out" &
loader=$!
# mid-load: once the load has stored orders on both workers
until_sql t c -c "SELECT count(*) >= 100 FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'citus-crash-$tag-%'"
restart_worker1
wait "$loader" || true
cat "$CITUS_TMP/crash_load.out"
check "worker stop mid-load: the load ran to its end (its 6 checks printed)" 6 \
	"$(grep -c '^\(not \)\?ok - worker stop mid-load' "$CITUS_TMP/crash_load.out" || true)"

# ---- a cluster distributed at an earlier release, updated to the current
# version: ALTER EXTENSION idem UPDATE on the coordinator (Citus runs it on
# every node), then idem_distribute() again.  From 1.10 (1.11's columns,
# 1.12's outbox on each node, the move to idem_internal) and from 1.12 (the
# move, and the record's new columns added while the workers' shards are
# still in the extension's schema) ----
current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control")
# "same" when every shard of table $1 has the coordinator table's columns;
# otherwise the column lists of the shards that differ.
shard_columns() {
	local cols
	cols=$(c -c "SELECT string_agg(attname, ',' ORDER BY attname) FROM pg_attribute
	             WHERE attrelid = '$1'::regclass AND attnum > 0 AND NOT attisdropped")
	c -c "SELECT coalesce(string_agg(DISTINCT result, ' ') FILTER (WHERE result <> '$cols'), 'same')
	        FROM run_command_on_placements('$1',
	             'SELECT string_agg(attname, '','' ORDER BY attname) FROM pg_attribute
	               WHERE attrelid = ''%s''::regclass AND attnum > 0 AND NOT attisdropped')"
}
update_from() {	# update_from VERSION
	local from=$1 v=${1//./_} t
	citus_cluster_stop
	CITUS_WAIT_TIMEOUT=1s CITUS_IDEM_VERSION=$from citus_cluster_start
	c <<SQL >/dev/null
BEGIN;
SELECT replayed FROM idem_begin($owner_w1, 'PAY', 'citus-upgrade-$tag-$v-1', '{}');
SELECT idem_finish($owner_w1, 'PAY', 'citus-upgrade-$tag-$v-1', 201, '{"v": "$from"}', NULL, '{"X-A": "1"}');
COMMIT;
SQL
	check "update $from -> $current on Citus: ALTER EXTENSION idem UPDATE and idem_distribute() succeed" "ok" \
		"$(c -v ON_ERROR_STOP=1 -c "ALTER EXTENSION idem UPDATE" -c "SELECT idem_distribute()" 2>&1 >/dev/null | sed -n 's/^.*ERROR: *//p' | head -n 1 | grep . || echo ok)"
	check "update $from -> $current on Citus: every node is at the new version" "$current $current $current" \
		"$(c -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'") $(c -c "SELECT string_agg(result, ' ') FROM run_command_on_workers('SELECT extversion FROM pg_extension WHERE extname = ''idem''')")"
	for t in idempotency_record purchase_order idem_inbox idem_history idem_policy; do
		check "update $from -> $current on Citus: every shard of idem_internal.$t has the coordinator's columns" "same" \
			"$(shard_columns "idem_internal.$t")"
	done
	check "update $from -> $current on Citus: idem_distribute() again distributes idem_history, idem_operator_audit, idem_policy and idem_task_attempt and delegates the new signatures" \
		"idem_internal.idem_history:h idem_internal.idem_operator_audit:h idem_internal.idem_policy:n idem_internal.idem_task_attempt:h $delegated" \
		"$(c -c "SELECT string_agg(logicalrelid::text || ':' || partmethod::text, ' ' ORDER BY logicalrelid::text) FROM pg_dist_partition WHERE logicalrelid::text IN ('idem_internal.idem_history', 'idem_internal.idem_operator_audit', 'idem_internal.idem_policy', 'idem_internal.idem_task_attempt')") $(c -c "SELECT string_agg(p.proname, ' ' ORDER BY p.proname) FROM pg_dist_object d JOIN pg_proc p ON p.oid = d.objid WHERE d.classid = 'pg_proc'::regclass AND d.force_delegation")"
	check "update $from -> $current on Citus: the $from record replays, its headers in both forms" "t|201|{\"X-A\": \"1\"}|{\"X-A\": \"1\"}" \
		"$(c -c "SELECT replayed, http_status, headers, header_list FROM idem_begin($owner_w1, 'PAY', 'citus-upgrade-$tag-$v-1', '{}')")"
	c -c "SELECT operation FROM idem_set_policy('PAY', ttl => '5 days')" >/dev/null
	c <<SQL >/dev/null
BEGIN;
SELECT replayed FROM idem_begin($owner_w2, 'PAY', 'citus-upgrade-$tag-$v-2', '{"n": 2}');
SELECT idem_finish($owner_w2, 'PAY', 'citus-upgrade-$tag-$v-2', 201, '{}', header_list => '[["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"]]');
COMMIT;
SQL
	check "update $from -> $current on Citus: a policy applies on the workers, headers in json form are kept, the request's digest is stored" \
		"5 days|[[\"Set-Cookie\", \"a=1\"], [\"Set-Cookie\", \"b=2\"]]|16" \
		"$(c -c "SELECT expires_at - created_at, response_header_list, length(request_digest) FROM idem_internal.idempotency_record WHERE idempotency_key = 'citus-upgrade-$tag-$v-2'")"
}
update_from 1.10
update_from 1.12
# shellcheck disable=SC2034  # read by the at_exit handler above
finished=1
