#!/usr/bin/env bash
# One transaction of many idem calls on distinct keys, of each kind
# (idem_create_order, idem_begin + idem_finish, idem_run, idem_submit, keyed
# idem_outbox_emit, idem_consume), commits with the default lock settings
# (max_connections 100, max_locks_per_transaction 64), while a second
# session makes calls of every kind meanwhile and gets no error.  Each
# transaction's time, the locks it holds before COMMIT and its backend's
# peak memory (VmHWM) are printed.
#
#   bash test/load/big_transaction.sh                         # 100,000 calls of each kind
#   IDEM_BIG_CALLS=1000000 bash test/load/big_transaction.sh  # the 1,000,000-call runs
#
# Prints "ok - ..." / "not ok - ..." lines.  Uses a throwaway server of its
# own (test/lib.sh), with the default lock settings.
source "$(dirname "$0")/../lib.sh"

CALLS=${IDEM_BIG_CALLS:-100000}
ensure_packages
if ! [ -f "$($PG_CONFIG --pkglibdir)/idem.so" ]; then
	build_install
fi
start_server "idem.cleanup_interval = 0" "max_locks_per_transaction = 64"
DB=postgres
sql() { "$PG_BINDIR/psql" -X -q -At -v ON_ERROR_STOP=1 -d "$DB" "$@"; }
sql -c "CREATE EXTENSION idem" -c "SHOW max_locks_per_transaction" -c "SHOW max_connections" |
	tr '\n' ' ' | sed 's/^/==> max_locks_per_transaction, max_connections: /' >&2
echo >&2
sql <<'SQL'
CREATE TABLE big_ledger (id bigserial PRIMARY KEY, n bigint NOT NULL);
CREATE FUNCTION big_handler(request jsonb) RETURNS idem_result LANGUAGE plpgsql AS $$
DECLARE e bigint;
BEGIN
    INSERT INTO public.big_ledger (n) VALUES ((request->>'n')::bigint) RETURNING id INTO e;
    RETURN ROW(201, '{}', NULL, e)::idem_result;
END $$;
SQL

# A key of 16+ characters for call g of kind $1.
key() { echo "'$1-' || lpad(g::text, 12, '0')"; }

declare -A work=(
	[create_order]="SELECT count(*) FROM generate_series(1, $CALLS) g,
	                LATERAL idem_create_order(1, $(key big-order), 5, 1) o WHERE NOT o.replayed"
	[begin_finish]="DO \$\$ BEGIN FOR g IN 1..$CALLS LOOP
	                  PERFORM idem_begin(1, 'BIG_PAIR', $(key big-pair), '{}');
	                  PERFORM idem_finish(1, 'BIG_PAIR', $(key big-pair), 200, '{}');
	                END LOOP; END \$\$"
	[run]="SELECT count(*) FROM generate_series(1, $CALLS) g,
	       LATERAL idem_run(1, 'BIG_RUN', $(key big-run), jsonb_build_object('n', g), 'big_handler(jsonb)') r
	       WHERE NOT r.replayed"
	[submit]="SELECT count(*) FROM generate_series(1, $CALLS) g,
	          LATERAL idem_submit(1, 'BIG_TASK', $(key big-task), '{}') s WHERE NOT s.replayed"
	[keyed_emit]="SELECT count(idem_outbox_emit('big', jsonb_build_object('n', g), 'key-' || g)) FROM generate_series(1, $CALLS) g"
	[consume]="SELECT count(*) FROM generate_series(1, $CALLS) g WHERE idem_consume('big-consumer', 'msg-' || g)"
)
declare -A rows=(
	[create_order]="SELECT count(*) FROM idem_internal.purchase_order o JOIN idem_internal.idempotency_record r ON r.resource_id = o.id
	                WHERE r.operation = 'CREATE_ORDER' AND r.idempotency_key LIKE 'big-order-%'"
	[begin_finish]="SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'BIG_PAIR'"
	[run]="SELECT count(*) FROM idem_internal.idempotency_record r JOIN big_ledger l ON l.id = r.resource_id WHERE r.operation = 'BIG_RUN'"
	[submit]="SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'BIG_TASK' AND status = 'PROCESSING'"
	[keyed_emit]="SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'big' AND ready"
	[consume]="SELECT count(*) FROM idem_internal.idem_inbox WHERE consumer = 'big-consumer'"
)

# The other session: calls of every kind on keys of its own, one transaction
# each, until the file $1 exists; prints its errors and then "calls N".
other_session() {
	local stop=$1 i=0 errors=0
	while [ ! -e "$stop" ]; do
		i=$((i + 1))
		local k
		k=$(printf 'other-%s-%012d' "$2" "$i")
		if ! sql >/dev/null 2>>"$IDEM_TMP/other-$2.err" <<SQL
SELECT replayed FROM idem_create_order(2, '$k', 5, 1);
BEGIN;
SELECT replayed FROM idem_begin(2, 'OTHER', '$k', '{}');
SELECT idem_finish(2, 'OTHER', '$k', 200, '{}');
COMMIT;
SELECT replayed FROM idem_run(2, 'OTHER_RUN', '$k', '{"n": 0}', 'big_handler(jsonb)');
SELECT replayed FROM idem_submit(2, 'OTHER_TASK', '$k', '{}');
SELECT idem_outbox_emit('other', '{}', '$k');
SELECT idem_consume('other-consumer', '$k');
SQL
		then
			errors=$((errors + 1))
		fi
	done
	echo "calls $((i * 7)) errors $errors"
}

for kind in create_order begin_finish run submit keyed_emit consume; do
	stop=$IDEM_TMP/stop-$kind
	other_session "$stop" "$kind" >"$IDEM_TMP/other-$kind.out" &
	other=$!
	start=$(date +%s%N)
	# the transaction's backend: its pid, then its peak memory before COMMIT
	out=$(sql 2>&1 <<SQL
BEGIN;
SELECT 'pid', pg_backend_pid();
${work[$kind]};
SELECT 'locks', count(*) FROM pg_locks WHERE pid = pg_backend_pid();
SELECT 'peak', substring(pg_read_file('/proc/self/status') FROM 'VmHWM:\s+(\d+ kB)');
COMMIT;
SQL
	) || true
	took=$((($(date +%s%N) - start) / 1000000))
	touch "$stop"
	wait "$other"
	if grep -q ERROR <<<"$out"; then
		echo "not ok - $kind: one transaction of $CALLS calls ($(echo "$out" | grep ERROR | head -1))"
		continue
	fi
	locks=$(echo "$out" | sed -n 's/^locks|//p')
	echo "==> $kind: $CALLS calls in one transaction, $took ms, $locks locks held before COMMIT, backend peak memory $(echo "$out" | sed -n 's/^peak|//p')" >&2
	check "$kind: one transaction of $CALLS calls on distinct keys commits with the default lock settings" \
		"$CALLS" "$(sql -c "${rows[$kind]}")"
	check "$kind: it holds a bounded number of locks, not one per call (at most 40)" \
		"yes" "$([ "${locks:-99999}" -le 40 ] && echo yes || echo "no: $locks")"
	read -r _ calls _ errors <"$IDEM_TMP/other-$kind.out"
	check "$kind: a concurrent session made $calls calls meanwhile, with no error" "0" "$errors"
	[ "$errors" = 0 ] || head -5 "$IDEM_TMP/other-$kind.err"
done

