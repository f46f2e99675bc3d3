#!/usr/bin/env bash
# The Java library (clients/java) as a user gets it: compiled with javac
# against Debian's pgjdbc and Tomcat's servlet API and packed with jar; its
# API tests (IdemTest) against a real server; the example on embedded
# Tomcat 10.1 with the jakarta.servlet Filter through the HTTP contract
# (test/clients/contract.py).  One "ok - ..." or "not ok - ..." line per check.
#
#   bash test/clients/java.sh          (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

ensure_client_packages default-jdk-headless libpostgresql-jdbc-java libtomcat10-embed-java \
	libjakarta-annotation-api-java python3-psycopg
start_clients_server

J=/usr/share/java
build=$IDEM_TMP/java
mkdir -p "$build/classes" "$build/test" "$build/example"
log "javac and jar: clients/java"
if ! javac -Xlint:all -Werror -d "$build/classes" -cp "$J/postgresql.jar:$J/tomcat10-embed-core.jar" \
	$(find "$CLIENTS/java/src" -name '*.java') >"$build/javac.log" 2>&1 ||
	! jar --create --file "$build/idem-pg-1.9.0.jar" -C "$build/classes" . ; then
	cat "$build/javac.log" >&2
	echo "not ok - java: the jar builds"
	exit 0
fi
echo "ok - java: the jar builds with -Xlint:all -Werror (idem-pg-1.9.0.jar)"
jarcp=$build/idem-pg-1.9.0.jar:$J/postgresql.jar
if javac -Xlint:all -Werror -d "$build/test" -cp "$jarcp" "$CLIENTS/java/test/IdemTest.java" >"$build/javac-test.log" 2>&1; then
	java -cp "$build/test:$jarcp" IdemTest || true
else
	cat "$build/javac-test.log" >&2
	echo "not ok - java api: IdemTest compiles"
fi

appcp=$jarcp:$J/tomcat10-embed-core.jar:$J/jakarta-annotation-api.jar
if javac -Xlint:all -Werror -d "$build/example" -cp "$appcp" "$EXAMPLES/java/OrderServer.java" >"$build/javac-ex.log" 2>&1; then
	contract_of java-tomcat 9000 java -cp "$build/example:$appcp" OrderServer
else
	cat "$build/javac-ex.log" >&2
	echo "not ok - java-tomcat: examples/java/OrderServer.java compiles against the jar"
fi
