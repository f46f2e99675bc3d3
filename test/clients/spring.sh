#!/usr/bin/env bash
# Spring Boot (issue 39): idem-spring-boot-starter as a user installs it
# (`mvn install` of clients/java, then of clients/java/spring, on Spring
# Boot 3.5.7), and examples/spring, the article's order service on it, under
# @SpringBootTest (a random port, the stage's PostgreSQL with idem; its
# service role shop_app): the article's tests through JdbcTemplate and JPA,
# 20 threads on one key, failures that must store nothing, the ProblemDetail
# answers, Actuator's meters and health.  One line per Surefire test case.
# Then the application's jar (spring-boot-maven-plugin) as a service: the
# HTTP contract (test/clients/contract.py, as for every other stack) and the
# double click in headless Chromium.
#
#   bash test/clients/spring.sh        (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

ensure_client_packages default-jdk-headless maven python3-psycopg chromium nodejs npm
start_clients_server
SPRING_BUILD=$IDEM_TMP/spring
mkdir -p "$SPRING_BUILD"

mvn_step() {	# mvn_step WHAT DIR ARGS...: one line; the log's tail on failure
	local what=$1 dir=$2
	shift 2
	if (cd "$dir" && mvn -B -ntp "$@") >>"$SPRING_BUILD/mvn.log" 2>&1; then
		echo "ok - spring: $what"
	else
		tail -n 80 "$SPRING_BUILD/mvn.log" >&2
		echo "not ok - spring: $what"
		return 1
	fi
}

mvn_step "mvn install builds idem-pg" "$CLIENTS/java" -q -DskipTests install || exit 0
mvn_step "mvn install builds idem-spring-boot-starter (Spring Boot 3.5.7, -Xlint:all -Werror)" \
	"$CLIENTS/java/spring" -q install || exit 0
log "mvn test: examples/spring against the stage's server"
(cd "$IDEM_ROOT/examples/spring" && mvn -B -ntp -Dmaven.test.failure.ignore=true test \
	-Dspring.datasource.url="jdbc:postgresql://127.0.0.1:$PGPORT/$PGDATABASE" \
	-Dspring.datasource.username="$SERVICE_USER" -Didem.test.admin-user="$PGUSER") >"$SPRING_BUILD/test.log" 2>&1 ||
	{ tail -n 80 "$SPRING_BUILD/test.log" >&2; echo "not ok - spring: mvn test runs examples/spring's tests"; }
surefire_lines "spring boot 3.5" "$IDEM_ROOT/examples/spring/target/surefire-reports"

mvn_step "mvn package makes examples/spring's jar" "$IDEM_ROOT/examples/spring" -q -DskipTests package || exit 0
jar=$IDEM_ROOT/examples/spring/target/spring-orders-1.13.0.jar
export IDEM_SERVICE_WAIT=600		# a Spring Boot start on a busy machine: up to a minute
contract_of spring-boot 9500 java -Djava.io.tmpdir="$TMPDIR" -jar "$jar"
browser_double_click "spring browser" spring-page java -Djava.io.tmpdir="$TMPDIR" -jar "$jar"
stop_services
