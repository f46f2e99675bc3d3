#!/usr/bin/env bash
# The Java library (clients/java) as a user gets it: `mvn install` (Maven
# Central's pgjdbc, JUnit and servlet API), its JUnit tests (IdemTest)
# against a real server, one line per Surefire test case; the example on
# Debian's embedded Tomcat 10.1 with the jakarta.servlet Filter, against the
# installed jar, through the HTTP contract (test/clients/contract.py).  One
# "ok - ..." or "not ok - ..." line per check.
#
#   bash test/clients/java.sh          (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

ensure_client_packages default-jdk-headless maven libtomcat10-embed-java \
	libjakarta-annotation-api-java python3-psycopg
start_clients_server

build_java_client || exit 0
# Tomcat keeps its work directory under java.io.tmpdir: the run's, not /tmp
contract_of java-tomcat 9000 java -Djava.io.tmpdir="$TMPDIR" -cp "$JAVA_APPCP" OrderServer
check "java-tomcat: the service leaves no Tomcat base directory where it was started" "" \
	"$(ls -d tomcat.* 2>/dev/null | tr '\n' ' ')"
