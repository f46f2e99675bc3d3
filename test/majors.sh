#!/usr/bin/env bash
# idem on one more PostgreSQL major, for test/run_all.sh:
#
#   bash test/majors.sh /path/to/pg_config
#
# Checks that the installation can build an extension (server headers, PGXS)
# and run the suites (pgcrypto, pg_isolation_regress, the TAP modules); if
# not, prints one "skip - ..." line saying what is missing.  Otherwise copies
# the source tree (the default major's build stays as it is), and there runs
# test/run_all.sh with PG_CONFIG set to it and IDEM_MAJOR set: idem built with
# -Werror and installed into that major's own tree, a server of that major,
# and one line per stage (regress, isolation, tap, dump, upgrade_suite,
# citus, pg_upgrade from the default major).
set -euo pipefail
IDEM_ROOT=$(cd "$(dirname "$0")/.." && pwd)
source "$IDEM_ROOT/test/lib.sh"
default_pg_config=$PG_CONFIG
other=$1

version=$("$other" --version | awk '{print $2}')
label="PostgreSQL $version ($other)"
pgxs=$("$other" --pgxs)
pgxs_dir=$(dirname "$pgxs")/../..
missing=()
[ -f "$("$other" --includedir-server)/postgres.h" ] || missing+=("server headers ($("$other" --includedir-server)/postgres.h; Debian: postgresql-server-dev-${version%%.*})")
[ -f "$pgxs" ] || missing+=("PGXS ($pgxs)")
[ -x "$("$other" --bindir)/postgres" ] || missing+=("the server ($("$other" --bindir)/postgres)")
[ -f "$("$other" --sharedir)/extension/pgcrypto.control" ] || missing+=("pgcrypto (contrib)")
[ -x "$pgxs_dir/src/test/isolation/pg_isolation_regress" ] || missing+=("pg_isolation_regress")
[ -f "$pgxs_dir/src/test/perl/PostgreSQL/Test/Cluster.pm" ] || missing+=("the TAP modules (configure --enable-tap-tests)")
if [ ${#missing[@]} -gt 0 ]; then
	echo "skip - $label: lacks $(printf '%s; ' "${missing[@]}" | sed 's/; $//'), so idem is not tested on it"
	exit 0
fi

work=$(mktemp -d -t idem-major.XXXXXX)
at_exit '[ -n "${IDEM_KEEP_TMP:-}" ] || rm -rf "$work"' 
copy_source_tree "$work"
chmod 755 "$work"
# its own private copy of that major's tree (IDEM_PG_ORIGIN names the
# default major's)
env -u IDEM_PG_ORIGIN PG_CONFIG="$other" IDEM_MAJOR="PostgreSQL $version" IDEM_UPGRADE_FROM="$default_pg_config" \
	bash "$work/test/run_all.sh" 2>"$work/stderr.log" || {
	echo "not ok - $label: the run stopped before its end"
	tail -n 40 "$work/stderr.log" | sed 's/^/# /'
}
