#!/usr/bin/env bash
# The Debian package: dpkg-buildpackage -us -uc -b builds postgresql-15-idem
# with Debian's pg_buildext tooling from a copy of the repository, apt-get
# installs it, and the pg_regress suite passes (make installcheck) against a
# fresh server started from the installed files.  The one stage that
# changes the machine outside the run's directory (a package installs
# system-wide): it first saves the idem files the machine's PostgreSQL 15
# has, if any, and afterwards removes the package and puts those back, so
# the machine is left as it was.  As root (apt-get, dpkg).  Prints
# "ok - ..." / "not ok - ..." lines.
source "$(dirname "$0")/../lib.sh"

if ! debian_pg; then
	echo "skip - package: the Debian package is built for Debian's PostgreSQL 15; the server under test is $("$PG_CONFIG" --version) from $PG_CONFIG"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "not ok - the package check needs root (apt-get, dpkg)"
	exit 0
fi
# the package's Build-Depends, by package (pg_buildext alone comes with postgresql-common)
need=()
for pkg in debhelper postgresql-server-dev-all; do
	dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q 'install ok installed' || need+=("$pkg")
done
if [ ${#need[@]} -gt 0 ]; then
	log "installing ${need[*]}"
	apt-get update -qq
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
fi

work=$(mktemp -d -t idem-package.XXXXXX)
chmod 755 "$work"
mkdir "$work/src"
SYS_CONFIG=${IDEM_PG_ORIGIN:-$PG_CONFIG}
SYS_BIN=$("$SYS_CONFIG" --bindir)
sys_files() { ls -d "$("$SYS_CONFIG" --pkglibdir)"/idem.so "$("$SYS_CONFIG" --pkglibdir)"/bitcode/idem* \
	"$("$SYS_CONFIG" --sharedir)"/extension/idem.control "$("$SYS_CONFIG" --sharedir)"/extension/idem--*.sql 2>/dev/null || true; }
log "package: installs postgresql-15-idem system-wide (into $(dirname "$SYS_BIN")), then restores the $(sys_files | wc -l) idem files that were there"
# what is there, by content
sys_fingerprint() { { sys_files | xargs -r -I{} find {} -type f 2>/dev/null | sort | xargs -r md5sum 2>/dev/null || true; } | md5sum; }
before=$(sys_fingerprint)
sys_files | tar -cPf "$work/saved.tar" -T - 2>/dev/null || true
preinstalled=$(dpkg-query -W -f='${Status} ${Version}' postgresql-15-idem 2>/dev/null | sed -n 's/^install ok installed //p' || true)
copy_source_tree "$work/src"

if (cd "$work/src" && dpkg-buildpackage -us -uc -b) >"$work/build.log" 2>&1; then
	echo "ok - dpkg-buildpackage -us -uc -b builds postgresql-15-idem"
else
	echo "not ok - dpkg-buildpackage -us -uc -b builds postgresql-15-idem"
	tail -30 "$work/build.log"
	exit 0
fi
deb=$(ls "$work"/postgresql-15-idem_*_*.deb | head -1)
version=$(dpkg-deb -f "$deb" Version)

if DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$deb" >"$work/install.log" 2>&1 &&
	dpkg-query -W -f='${Status}' postgresql-15-idem | grep -q 'install ok installed'; then
	echo "ok - apt-get installs postgresql-15-idem $version"
else
	echo "not ok - apt-get installs postgresql-15-idem"
	tail -20 "$work/install.log"
fi
files=$(dpkg -L postgresql-15-idem)
check "the package holds the library, the control file and every install script" "yes" \
	"$(for f in /usr/lib/postgresql/15/lib/idem.so /usr/share/postgresql/15/extension/idem.control \
		$(cd "$IDEM_ROOT/extension" && { ls idem--*.sql; echo "idem--$(sed -n "s/^default_version = '\(.*\)'/\1/p" ../idem.control).sql"; } |
			sort -u | sed 's|^|/usr/share/postgresql/15/extension/|'); do
		grep -qx "$f" <<<"$files" || { echo "no: $f"; exit; }; done; echo yes)"

# a fresh server started from the installed files: the suite passes
data=$work/data
port=$(free_port)
chown -R postgres: "$work"
as_pg_user "$SYS_BIN/initdb" -D "$data" -U postgres --auth=trust --no-sync >/dev/null 2>&1
{
	echo "listen_addresses = ''"
	echo "unix_socket_directories = '$work'"
	echo "port = $port"
	echo "shared_preload_libraries = 'idem'"
	echo "idem.cleanup_interval = 0"
	echo "fsync = off"
} >>"$data/postgresql.conf"
as_pg_user "$SYS_BIN/pg_ctl" -D "$data" -l "$work/server.log" -w -s start
if as_pg_user env PGHOST="$work" PGPORT="$port" PGUSER=postgres \
		make -C "$work/src" -s installcheck ISOLATION= TAP_TESTS= >"$work/installcheck.log" 2>&1; then
	echo "ok - make installcheck passes against a server running the installed package ($(grep -cE '\.\.\. ok' "$work/installcheck.log") tests)"
else
	echo "not ok - make installcheck against the installed package"
	grep -E '\.\.\. ' "$work/installcheck.log"
	head -60 "$work/src/regression.diffs" 2>/dev/null
fi
as_pg_user "$SYS_BIN/pg_ctl" -D "$data" -m fast -w -s stop

# leave the machine as it was: the package removed (unless it was
# installed before), the idem files that were there put back
if [ -z "$preinstalled" ]; then
	DEBIAN_FRONTEND=noninteractive apt-get remove -y -qq postgresql-15-idem >/dev/null 2>&1
fi
sys_files | xargs -r rm -rf
[ ! -s "$work/saved.tar" ] || tar -xPf "$work/saved.tar"
check "the machine's PostgreSQL has the idem files it had before the package, byte for byte (package ${preinstalled:-not installed before})" \
	"$before" "$(sys_fingerprint)"
rm -rf "$work"
