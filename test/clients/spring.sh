#!/usr/bin/env bash
# Spring Boot (issue 39): idem's starters as a user installs them (`mvn
# install` of clients/java, then of clients/java/spring: the Spring Boot 3.5
# and 4.1 starters), and examples/spring, the article's order service, on
# each line under @SpringBootTest (a random port, the stage's PostgreSQL with
# idem; its service role shop_app): the article's tests through JdbcTemplate
# and JPA, 20 threads on one key, failures that must store nothing, the
# ProblemDetail answers, Actuator's meters and health.  One line per Surefire
# test case, the starters' own context tests (ApplicationContextRunner, no
# server: each condition, a bean of the application's replacing the
# default, the start-up failure's analysis, the meters' tags) first.  Then each line's jar as a service: the HTTP contract
# (test/clients/contract.py, as for every other stack), the double click in
# headless Chromium (Boot 3.5), and a smoke of the Boot 4.1 jar on the
# newest JDK under /usr/lib/jvm (Temurin) when it is newer than the default.
# Last, the fingerprints every client stage stored are compared.
#
#   bash test/clients/spring.sh        (after the build: test/run_all.sh runs it)
source "$(dirname "$0")/common.sh"

ensure_client_packages default-jdk-headless maven python3-psycopg chromium nodejs npm
every_stage_ran=${IDEM_PG_ORIGIN:+--all}	# under test/run_all.sh: the other client stages ran before
start_clients_server
# the IdemTemplate tests consume messages as the service's role does in an
# application that both answers requests and consumes: the consumer's grant too
"$PG_BINDIR/psql" -X -q -v ON_ERROR_STOP=1 -c "SELECT count(*) FROM public.idem_grant('shop_app'::pg_catalog.regrole, 'consumer'::pg_catalog.text)" >/dev/null
SPRING_BUILD=$IDEM_TMP/spring
mkdir -p "$SPRING_BUILD"
APP=$IDEM_ROOT/examples/spring

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

# boot_line NAME PROFILE...: examples/spring's tests on one Spring Boot line,
# then its jar in $SPRING_BUILD (spring-boot-3.5.jar, ...)
boot_line() {
	local name=$1
	shift
	log "mvn test: examples/spring on $name against the stage's server"
	(cd "$APP" && mvn -B -ntp "$@" -Dmaven.test.failure.ignore=true clean test \
		-Dspring.datasource.url="jdbc:postgresql://127.0.0.1:$PGPORT/$PGDATABASE" \
		-Dspring.datasource.username="$SERVICE_USER" -Didem.test.admin-user="$PGUSER") >"$SPRING_BUILD/test-$name.log" 2>&1 ||
		{ tail -n 80 "$SPRING_BUILD/test-$name.log" >&2; echo "not ok - spring: mvn test runs examples/spring's tests on $name"; }
	surefire_lines "$name" "$APP/target/surefire-reports"
	mvn_step "mvn package makes examples/spring's jar on $name" "$APP" -q "$@" -DskipTests package || return 1
	cp "$APP/target/spring-orders-$(lib_version).jar" "$SPRING_BUILD/${name// /-}.jar"
}

java_major() { "$1" -XshowSettings:properties -version 2>&1 | sed -n 's/^ *java.specification.version = //p'; }

# the newest JDK under /usr/lib/jvm (Debian's place for JDKs) whose major is
# above the default java's: its java, or nothing
newer_java() {
	local best='' best_major j major
	best_major=$(java_major java)
	for j in /usr/lib/jvm/*/bin/java; do
		[ -x "$j" ] || continue
		major=$(java_major "$j")
		if [[ $major =~ ^[0-9]+$ ]] && [ "$major" -gt "${best_major:-0}" ]; then
			best=$j
			best_major=$major
		fi
	done
	echo "$best"
}

mvn_step "mvn install builds idem-pg" "$CLIENTS/java" -q -DskipTests install || exit 0
mvn_step "mvn install builds idem-spring-boot-starter (Spring Boot 3.5.7) and idem-spring-boot4-starter (4.1.2), -Xlint:all -Werror" \
	"$CLIENTS/java/spring" -q -Dmaven.test.failure.ignore=true install || exit 0
# the starters' context tests (ApplicationContextRunner: the conditions, no server), on each line
surefire_lines "starter boot 3.5" "$CLIENTS/java/spring/boot3/target/surefire-reports"
surefire_lines "starter boot 4.1" "$CLIENTS/java/spring/boot4/target/surefire-reports"
# the classes each Boot line has in its own names differ in those names only
boot_packages() {
	sed -e 's/org\.springframework\.boot\.actuate\.health/HEALTH/g; s/org\.springframework\.boot\.health\.contributor/HEALTH/g' \
		-e 's/org\.springframework\.boot\.web\.embedded\.tomcat/TOMCAT/g; s/org\.springframework\.boot\.tomcat\.servlet/TOMCAT/g' "$1"
}
drift=''
for f in "$CLIENTS"/java/spring/src/boot3/java/idem/spring/*.java; do
	other=$CLIENTS/java/spring/src/boot4/java/idem/spring/$(basename "$f")
	cmp -s <(boot_packages "$f") <(boot_packages "$other") || drift+=" $(basename "$f")"
done
check "spring: src/boot3/java and src/boot4/java differ in Spring Boot's package names only" "" "$drift"
export IDEM_SERVICE_WAIT=600		# a Spring Boot start on a busy machine: up to a minute
if boot_line "spring boot 3.5"; then
	contract_of spring-boot 9500 java -Djava.io.tmpdir="$TMPDIR" -jar "$SPRING_BUILD/spring-boot-3.5.jar"
	browser_double_click "spring browser" spring-page java -Djava.io.tmpdir="$TMPDIR" -jar "$SPRING_BUILD/spring-boot-3.5.jar"
fi
if boot_line "spring boot 4.1" -Pboot4; then
	contract_of spring-boot4 9600 java -Djava.io.tmpdir="$TMPDIR" -jar "$SPRING_BUILD/spring-boot-4.1.jar"
	newer=$(newer_java)
	if [ -z "$newer" ]; then
		echo "skip - spring: no JDK newer than the default's under /usr/lib/jvm for the smoke test"
	else
		major=$(java_major "$newer")
		port=$(free_port)
		if start_service "spring-jdk$major" "$port" -- "$newer" -Djava.io.tmpdir="$TMPDIR" -jar "$SPRING_BUILD/spring-boot-4.1.jar"; then
			IDEM_RUN=$(new_run) contract "spring-boot4-java$major" "http://127.0.0.1:$port" 9700 --quick
		else
			echo "not ok - spring-boot4-java$major: the service starts"
		fi
		stop_services
	fi
fi
/usr/bin/python3 "$CLIENTS_TEST/fingerprints.py" "$IDEM_FINGERPRINTS" ${every_stage_ran:+"$every_stage_ran"} \
	python-flask python-fastapi python-django node-express node-http java-tomcat spring-boot spring-boot4 || true
