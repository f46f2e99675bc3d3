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

build_java_client || exit 0
mkdir -p "$JAVA_BUILD/test"
if javac -Xlint:all -Werror -d "$JAVA_BUILD/test" -cp "$JAVA_JARCP" "$CLIENTS/java/test/IdemTest.java" \
	>"$JAVA_BUILD/javac-test.log" 2>&1; then
	java -cp "$JAVA_BUILD/test:$JAVA_JARCP" IdemTest || true
else
	cat "$JAVA_BUILD/javac-test.log" >&2
	echo "not ok - java api: IdemTest compiles"
fi
# Tomcat keeps its work directory under java.io.tmpdir: the run's, not /tmp
contract_of java-tomcat 9000 java -Djava.io.tmpdir="$TMPDIR" -cp "$JAVA_APPCP" OrderServer
