#!/usr/bin/env bash
# An updated installation is a fresh one.  For each released version of
# idem (every version an update script starts from, read from the scripts'
# names), a database is created at that version and brought to the current
# one with ALTER EXTENSION idem UPDATE; then:
#
#   - every member of the extension, from pg_depend (test/upgrade/members.sql:
#     function definitions, views, columns in order, reloptions, comments,
#     privileges, indexes, constraints, triggers, sequence parameters, types,
#     extconfig), equals a fresh install's of the current version;
#   - the whole pg_regress suite passes on the database updated from the
#     oldest version and on the one updated from the previous release (the
#     comparison above proves the others have the same objects).
#
# And the comparison is shown to catch a bad full install script: copies of
# the current script with one thing wrong each (a function body, a column,
# a reloption, a comment, a sequence parameter, an extconfig entry),
# installed in turn in place of the real one in the run's private copy of
# PostgreSQL, each differ from the update.
#
# Uses the server of PGHOST/PGPORT/PGUSER (test/run_all.sh's); prints
# "ok - ..." / "not ok - ..." lines.
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
PG_CONFIG=${PG_CONFIG:-pg_config}
PG_BINDIR=$("$PG_CONFIG" --bindir)
PG_REGRESS=$(dirname "$("$PG_CONFIG" --pgxs)")/../test/regress/pg_regress
TESTS=$(sed -n 's/^REGRESS = //p' "$IDEM_ROOT/Makefile")
OUT=$(mktemp -d -t idem-upgrade-suite.XXXXXX)
trap 'rm -rf "$OUT"' EXIT
EXTDIR=$("$PG_CONFIG" --sharedir)/extension
here=$(cd "$(dirname "$0")" && pwd)
psql_() { "$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 "$@"; }

# the released versions, oldest first, and the current one
versions=$(ls "$EXTDIR"/idem--*--*.sql | sed -E 's|.*/idem--([0-9.]+)--[0-9.]+\.sql$|\1|' | sort -uV)
current=$(sed -n "s/^default_version = '\(.*\)'/\1/p" "$IDEM_ROOT/idem.control")
oldest=$(echo "$versions" | head -n 1)
previous=$(echo "$versions" | tail -n 1)

members() {	# members DB: the member facts of idem in DB
	"$PG_BINDIR/psql" -X -At -v ON_ERROR_STOP=1 -d "$1" -f "$here/members.sql"
}
new_db() {	# new_db DB [VERSION]: DB with pgcrypto and idem (at VERSION, updated)
	"$PG_BINDIR/dropdb" --if-exists "$1" 2>/dev/null
	"$PG_BINDIR/createdb" --template=template0 "$1"
	if [ -n "${2:-}" ]; then
		psql_ -d "$1" -c "CREATE EXTENSION pgcrypto" -c "CREATE EXTENSION idem VERSION '$2'" \
			-c "ALTER EXTENSION idem UPDATE" >/dev/null
	else
		psql_ -d "$1" -c "CREATE EXTENSION pgcrypto" -c "CREATE EXTENSION idem" >/dev/null
	fi
}

new_db idem_fresh
members idem_fresh >"$OUT/fresh.members"
echo "# a fresh install of $current has $(grep -c '' "$OUT/fresh.members") member facts" \
	"($(grep -c '^function .*(' "$OUT/fresh.members" | awk '{print $1 / 2}') functions)"

for version in $versions; do
	db=idem_from_${version/./_}
	new_db "$db" "$version"
	updated=$("$PG_BINDIR/psql" -X -At -d "$db" -c "SELECT extversion FROM pg_extension WHERE extname = 'idem'")
	members "$db" >"$OUT/$version.members"
	if [ "$updated" = "$current" ] && diff -u "$OUT/fresh.members" "$OUT/$version.members" >"$OUT/$version.diff"; then
		echo "ok - created at $version and updated to $current: every member equals a fresh install's"
	else
		echo "not ok - created at $version and updated to $updated: its members differ from a fresh install of $current"
		head -n 60 "$OUT/$version.diff"
	fi
	if [ "$version" = "$oldest" ] || [ "$version" = "$previous" ]; then
		mkdir -p "$OUT/$version"
		# shellcheck disable=SC2086
		if "$PG_REGRESS" --bindir="$PG_BINDIR" --inputdir="$IDEM_ROOT" --outputdir="$OUT/$version" \
			--use-existing --dbname="$db" $TESTS >"$OUT/$version/log" 2>&1; then
			echo "ok - the pg_regress suite passes on a database created at $version and updated to $updated"
		else
			echo "not ok - the pg_regress suite on a database created at $version and updated to $updated"
			grep -E '\.\.\. ' "$OUT/$version/log" || cat "$OUT/$version/log"
			head -n 80 "$OUT/$version/regression.diffs" 2>/dev/null || true
		fi
	fi
	"$PG_BINDIR/dropdb" "$db"
done

# a wrong full install script is caught: each sed expression spoils one
# thing of the current script; installed in place of the real one (in the
# run's private copy of PostgreSQL only), its members must differ
script=$EXTDIR/idem--$current.sql
if [ -w "$script" ] && [ -n "${IDEM_PG_ORIGIN:-}" ]; then
	cp "$script" "$OUT/real.sql"
	restore() { cp "$OUT/real.sql" "$script"; }
	trap 'restore; rm -rf "$OUT"' EXIT
	while IFS='|' read -r what expr; do
		sed -E "$expr" "$OUT/real.sql" >"$script"
		if cmp -s "$script" "$OUT/real.sql"; then
			echo "not ok - a spoiled full script ($what): the change did not apply to idem--$current.sql"
			continue
		fi
		if new_db idem_spoiled 2>"$OUT/spoiled.err" && members idem_spoiled >"$OUT/spoiled.members" &&
			cmp -s "$OUT/fresh.members" "$OUT/spoiled.members"; then
			echo "not ok - a full script with $what passes the comparison"
		else
			echo "ok - a full script with $what fails the comparison ($(diff "$OUT/fresh.members" "$OUT/spoiled.members" 2>/dev/null | grep -c '^[<>]' || true) facts differ)"
		fi
		"$PG_BINDIR/dropdb" --if-exists idem_spoiled 2>/dev/null
	done <<-'EXPRS'
	a statement of a function body changed|0,/SELECT pg_catalog.count\(\*\)/s//SELECT pg_catalog.count(*) + 0/
	a column of idem_history dropped|/^    archived_at +timestamptz NOT NULL,$/d
	the outbox's fillfactor changed|/^CREATE TABLE idem_internal.idem_outbox \(/,/^\) WITH/s/fillfactor = 50/fillfactor = 60/
	a table's comment changed|s/^    'idem: one claim per /    'idem: a claim per /
	a sequence's parameters changed|s/^(CREATE SEQUENCE idem_internal.idem_outbox_message_id_seq);/\1 CACHE 2;/
	an extconfig entry dropped|s/^SELECT pg_catalog.pg_extension_config_dump\('idem_internal.purchase_order', ''\);//
	EXPRS
	restore
else
	echo "skip - the spoiled full scripts: $script is not in a private copy of PostgreSQL this run may change"
fi
