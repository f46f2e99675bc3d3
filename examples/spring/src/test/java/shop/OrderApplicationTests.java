package shop;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.net.URI;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.util.ArrayList;
import java.util.HashSet;
import java.util.List;
import java.util.Set;
import java.util.concurrent.CountDownLatch;
import java.util.concurrent.ExecutorService;
import java.util.concurrent.Executors;
import java.util.concurrent.Future;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.params.ParameterizedTest;
import org.junit.jupiter.params.provider.ValueSource;
import org.junit.jupiter.api.Test;
import org.springframework.boot.test.context.SpringBootTest;

/**
 * The article's tests against the running application (a real port, a real PostgreSQL with idem:
 * the test command's), through JdbcTemplate (/api/orders), JPA (/api/jpa/orders) and Spring Data
 * JDBC (a test route); counts are read by a superuser connection of their own.
 */
@SpringBootTest(webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
    // Boot 3's tests export no metrics unless told (Boot 4's, without spring-boot-micrometer-metrics-test,
    // do): Prometheus's endpoint as in production
    "spring.test.observability.auto-configure=true"})
class OrderApplicationTests extends ServiceTests {
    @org.springframework.beans.factory.annotation.Value("${spring.datasource.username}")
    String appUser;
    private static final Pattern ORDER_ID = Pattern.compile("\"orderId\":(\\d+)");

    @ParameterizedTest(name = "test 1 ({0}): the same key and body twice, one order")
    @ValueSource(strings = {"/api/orders", "/api/jpa/orders", "/api/test/data-jdbc/orders"})
    void sameKeyTwice(String path) throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> first = post(path, k, owner, "{\"skuId\": 1001, \"quantity\": 2}");
        HttpResponse<byte[]> again = post(path, k, owner, "{\"quantity\": 2, \"skuId\": 1001}");
        assertEquals(201, first.statusCode(), text(first));
        assertEquals(201, again.statusCode(), text(again));
        assertEquals("false", first.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals(1, orders(owner));
    }

    @ParameterizedTest(name = "test 2 ({0}): 20 threads, one key, one body: one order, every caller the same order id")
    @ValueSource(strings = {"/api/orders", "/api/jpa/orders", "/api/test/data-jdbc/orders"})
    void twentyThreads(String path) throws Exception {
        long owner = owner();
        String k = key();
        ExecutorService pool = Executors.newFixedThreadPool(20);
        CountDownLatch start = new CountDownLatch(1);
        List<Future<String>> answers = new ArrayList<>();
        for (int i = 0; i < 20; i++) {
            answers.add(pool.submit(() -> {
                start.await();
                for (int attempt = 0; attempt < 100; attempt++) {      // a 409 in-flight says: retry
                    HttpResponse<byte[]> r = post(path, k, owner, "{\"skuId\": 7, \"quantity\": 1}");
                    if (r.statusCode() == 201) {
                        Matcher m = ORDER_ID.matcher(text(r));
                        return m.find() ? m.group(1) : "no orderId in " + text(r);
                    }
                    if (r.statusCode() != 409 || !text(r).contains("in-flight")) {
                        return r.statusCode() + " " + text(r);
                    }
                    Thread.sleep(50);
                }
                return "still in flight";
            }));
        }
        start.countDown();
        Set<String> ids = new HashSet<>();
        for (Future<String> f : answers) {
            ids.add(f.get());
        }
        pool.shutdown();
        assertEquals(1, ids.size(), ids.toString());
        assertTrue(ids.iterator().next().matches("\\d+"), ids.toString());
        assertEquals(1, orders(owner));
    }

    @ParameterizedTest(name = "{0} on an @Idempotent route: the same key twice, one order, the second replayed")
    @ValueSource(strings = {"PUT", "PATCH"})
    void putAndPatch(String method) throws Exception {
        long owner = owner();
        String k = key();
        List<HttpResponse<byte[]>> answers = new ArrayList<>();
        for (int i = 0; i < 2; i++) {
            answers.add(HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + "/api/test/carts/9/order"))
                .header("Content-Type", "application/json").header("X-Owner-Id", Long.toString(owner))
                .header("Idempotency-Key", k)
                .method(method, HttpRequest.BodyPublishers.ofString("{\"skuId\": 3, \"quantity\": 1}")).build(),
                HttpResponse.BodyHandlers.ofByteArray()));
        }
        assertEquals(200, answers.get(0).statusCode(), text(answers.get(0)));
        assertEquals("false", answers.get(0).headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals("true", answers.get(1).headers().firstValue("Idempotent-Replayed").orElse(null));
        assertArrayEquals(answers.get(0).body(), answers.get(1).body());
        assertEquals(1, orders(owner));
    }

    @Test
    @DisplayName("test 3: the same key with another body is 409 key-reused, nothing more written")
    void keyReused() throws Exception {
        long owner = owner();
        String k = key();
        post("/api/orders", k, owner, "{\"skuId\": 1, \"quantity\": 1}");
        HttpResponse<byte[]> other = post("/api/orders", k, owner, "{\"skuId\": 1, \"quantity\": 3}");
        assertEquals(409, other.statusCode());
        assertTrue(other.headers().firstValue("Content-Type").orElse("").startsWith("application/problem+json"));
        assertTrue(text(other).contains("key-reused"), text(other));
        assertEquals(1, orders(owner));
    }

    @Test
    @DisplayName("test 4: a handler that throws after writing leaves no order and no record; the retry executes")
    void failedThenRetried() throws Exception {
        long owner = owner();
        String k = key();
        TestEndpoints.FAIL_NEXT.set(true);
        HttpResponse<byte[]> failed = post("/api/test/flaky", k, owner, "{\"skuId\": 5, \"quantity\": 1}");
        assertEquals(500, failed.statusCode(), text(failed));
        assertEquals(0, orders(owner));
        assertEquals(0, records(owner, k));
        HttpResponse<byte[]> retried = post("/api/test/flaky", k, owner, "{\"skuId\": 5, \"quantity\": 1}");
        assertEquals(200, retried.statusCode(), text(retried));
        assertEquals("false", retried.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals(1, orders(owner));
        assertEquals(1, records(owner, k));
    }

    @Test
    @DisplayName("test 6: a replay has the first answer's status, body bytes and stored headers")
    void replayBytes() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> first = post("/api/orders", k, owner, "{\"skuId\": 1001, \"quantity\": 2}");
        HttpResponse<byte[]> again = post("/api/orders", k, owner, "{\"skuId\": 1001, \"quantity\": 2}");
        assertEquals(first.statusCode(), again.statusCode());
        assertArrayEquals(first.body(), again.body());
        assertEquals(first.headers().firstValue("Location"), again.headers().firstValue("Location"));
        assertNotNull(again.headers().firstValue("Idempotency-Expires").orElse(null));
    }

    @Test
    @DisplayName("test 7: two owners with one key are two orders")
    void ownersApart() throws Exception {
        long a = owner();
        long b = a + 1;
        String k = key();
        assertEquals(201, post("/api/orders", k, a, "{\"skuId\": 3, \"quantity\": 1}").statusCode());
        assertEquals(201, post("/api/orders", k, b, "{\"skuId\": 3, \"quantity\": 1}").statusCode());
        assertEquals(1, orders(a));
        assertEquals(1, orders(b));
    }

    @Test
    @DisplayName("an exception a @ControllerAdvice answers 422 for: sent, nothing stored, the retry executes")
    void advisedException() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> r = post("/api/test/advised", k, owner, "{\"skuId\": 9, \"quantity\": 1}");
        assertEquals(422, r.statusCode(), text(r));
        assertEquals(0, orders(owner));
        assertEquals(0, records(owner, k));
        assertEquals(422, post("/api/test/advised", k, owner, "{\"skuId\": 9, \"quantity\": 1}").statusCode());
        assertEquals(0, records(owner, k));
    }

    @Test
    @DisplayName("a returned 4xx ResponseEntity is stored and replayed")
    void returned4xx() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> first = post("/api/test/refused", k, owner, "{\"skuId\": 9, \"quantity\": 1}");
        HttpResponse<byte[]> again = post("/api/test/refused", k, owner, "{\"skuId\": 9, \"quantity\": 1}");
        assertEquals(409, first.statusCode());
        assertEquals(409, again.statusCode());
        assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(null));
        assertEquals(1, orders(owner));
        assertEquals(1, records(owner, k));
    }

    @Test
    @DisplayName("a Spring Data JDBC write rolls back with the request: no order, no record, the retry executes")
    void dataJdbcRollsBack() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> failed = post("/api/test/data-jdbc/orders", k, owner, "{\"skuId\": 4, \"quantity\": 99}");
        assertEquals(500, failed.statusCode(), text(failed));
        assertEquals(0, orders(owner));
        assertEquals(0, records(owner, k));
        HttpResponse<byte[]> other = post("/api/test/data-jdbc/orders", k, owner, "{\"skuId\": 4, \"quantity\": 98}");
        assertEquals(201, other.statusCode(), text(other));
        assertEquals(1, orders(owner));
    }

    @Test
    @DisplayName("a JPA constraint violation at the flush before the answer is stored: 500, nothing stored")
    void jpaFlush() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> r = post("/api/test/flush", k, owner, "{\"skuId\": 4, \"quantity\": 1}");
        assertEquals(500, r.statusCode(), text(r));
        assertEquals(0, orders(owner));
        assertEquals(0, records(owner, k));
    }

    @Test
    @DisplayName("a REQUIRES_NEW write commits apart: it stays when the request fails (documented)")
    void requiresNew() throws Exception {
        long owner = owner();
        String k = key();
        HttpResponse<byte[]> r = post("/api/test/requires-new", k, owner, "{\"skuId\": 4, \"quantity\": 1}");
        assertEquals(500, r.statusCode(), text(r));
        assertEquals(1, orders(owner));             // the audit row, not the order
        assertEquals(0, records(owner, k));
    }

    @Test
    @DisplayName("no Idempotency-Key: 400 problem+json key-missing; a malformed one: key-malformed")
    void keyMissing() throws Exception {
        HttpResponse<byte[]> r = post("/api/orders", null, owner(), "{\"skuId\": 1, \"quantity\": 1}");
        assertEquals(400, r.statusCode());
        assertTrue(text(r).contains("key-missing"), text(r));
        HttpResponse<byte[]> bad = post("/api/orders", "short", owner(), "{\"skuId\": 1, \"quantity\": 1}");
        assertEquals(400, bad.statusCode());
        assertTrue(text(bad).contains("key-malformed"), text(bad));
    }

    @Test
    @DisplayName("the fingerprint is of the raw body's fields: 1.0 and 1e0 are the same request, unknown fields do not count")
    void fingerprint() throws Exception {
        long owner = owner();
        String k = key();
        assertEquals(201, post("/api/orders", k, owner, "{\"skuId\": 1e0, \"quantity\": 1.0, \"note\": \"a\"}").statusCode());
        HttpResponse<byte[]> r = post("/api/orders", k, owner, "{\"quantity\": 1, \"skuId\": 1}");
        assertEquals("true", r.headers().firstValue("Idempotent-Replayed").orElse(null), text(r));
        assertEquals(count("SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = ?::pg_catalog.int8"
            + " AND idempotency_key = ?::pg_catalog.text AND request_hash = public.idem_request_hash('{\"skuId\": 1, \"quantity\": 1}'::pg_catalog.jsonb)", owner, k), 1);
    }

    @Test
    @DisplayName("Actuator: idem's meters at /actuator/prometheus, its health UP with the installed version")
    void actuator() throws Exception {
        post("/api/orders", key(), owner(), "{\"skuId\": 2, \"quantity\": 1}");
        // the meter is recorded once the answer is sent: wait for it (a generous cap)
        HttpResponse<String> prom = null;
        for (int i = 0; i < 300; i++) {
            prom = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
                + "/actuator/prometheus")).build(), HttpResponse.BodyHandlers.ofString());
            if (prom.body().contains("idem_requests_seconds_count{operation=\"CREATE_ORDER\",outcome=\"executed\",status=\"2xx\"}")) {
                break;
            }
            Thread.sleep(100);
        }
        String names = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
            + "/actuator/metrics")).build(), HttpResponse.BodyHandlers.ofString()).body();
        assertTrue(prom.body().contains("idem_requests_seconds_count{operation=\"CREATE_ORDER\",outcome=\"executed\",status=\"2xx\"}"),
            prom.body().lines().filter(l -> l.startsWith("idem")).toList() + " of " + names);
        // details to an authenticated caller only (show-details=when-authorized; TestSecurity's users)
        HttpResponse<String> health = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
            + "/actuator/health")).header("Authorization", "Basic " + java.util.Base64.getEncoder()
            .encodeToString("alice:alice-secret".getBytes(java.nio.charset.StandardCharsets.UTF_8))).build(),
            HttpResponse.BodyHandlers.ofString());
        HttpResponse<String> anonymous = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
            + "/actuator/health")).build(), HttpResponse.BodyHandlers.ofString());
        // idem's component, its members in either order (Boot 3 writes status first, Boot 4 details)
        Matcher idem = Pattern.compile("\"idem\":(\\{(?:[^{}]|\\{[^{}]*\\})*\\})").matcher(health.body());
        assertTrue(idem.find() && idem.group(1).contains("\"status\":\"UP\"")
            && idem.group(1).contains("\"version\":\""), health.body());
        assertTrue(anonymous.body().contains("\"idem\"") && !anonymous.body().contains("\"version\""), anonymous.body());
        // idem.in_flight_waits is registered at start-up, for each @Idempotent operation
        String waits = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
            + "/actuator/metrics/idem.in_flight_waits")).build(), HttpResponse.BodyHandlers.ofString()).body();
        assertTrue(waits.contains("\"CREATE_ORDER\""), waits);
    }

    @Test
    @DisplayName("a role without idem's grants: 500 internal, and Actuator's idem health DOWN naming idem_grant")
    void missingGrants() throws Exception {
        String grant = "SELECT count(*) FROM public.idem_%s('" + appUser + "'::pg_catalog.regrole, 'app'::pg_catalog.text)";
        count(String.format(grant, "revoke"));
        try {
            HttpResponse<byte[]> r = post("/api/orders", key(), owner(), "{\"skuId\": 1, \"quantity\": 1}");
            assertEquals(500, r.statusCode(), text(r));
            assertTrue(text(r).contains("urn:idem:error:internal"), text(r));
            HttpResponse<String> health = HTTP.send(HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port
                + "/actuator/health")).header("Authorization", "Basic " + java.util.Base64.getEncoder()
                .encodeToString("alice:alice-secret".getBytes(java.nio.charset.StandardCharsets.UTF_8))).build(),
                HttpResponse.BodyHandlers.ofString());
            Matcher idem = Pattern.compile("\"idem\":(\\{(?:[^{}]|\\{[^{}]*\\})*\\})").matcher(health.body());
            assertTrue(idem.find() && idem.group(1).contains("\"status\":\"DOWN\"")
                && idem.group(1).contains("idem_grant('" + appUser + "', 'app')"), health.body());
        } finally {
            count(String.format(grant, "grant"));
        }
    }
}
