package shop;

import java.net.URI;
import java.net.http.HttpClient;
import java.net.http.HttpRequest;
import java.net.http.HttpResponse;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.UUID;

import org.springframework.beans.factory.annotation.Value;

/**
 * What the tests of the running application share: its port, its requests, and counts read by a superuser
 * connection of their own (the test command's PostgreSQL: spring.datasource.url,
 * idem.test.admin-user), never through the application's pool.
 */
abstract class ServiceTests {
    static final HttpClient HTTP = HttpClient.newHttpClient();

    @Value("${local.server.port}")
    int port;
    @Value("${spring.datasource.url}")
    String url;
    @Value("${idem.test.admin-user:postgres}")
    String admin;

    static String key() {
        return "spring-" + UUID.randomUUID().toString().replace("-", "");
    }

    static long owner() {
        return 1000 + (long) (Math.random() * 900000);
    }

    long count(String sql, Object... args) throws Exception {
        try (Connection c = DriverManager.getConnection(url, admin, null);
             PreparedStatement ps = c.prepareStatement(sql)) {
            for (int i = 0; i < args.length; i++) {
                ps.setObject(i + 1, args[i]);
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }

    long orders(long owner) throws Exception {
        return count("SELECT count(*) FROM shop_order WHERE owner_id = ?", owner);
    }

    long records(long owner, String key) throws Exception {
        return count("SELECT count(*) FROM idem_internal.idempotency_record WHERE owner_id = ? AND idempotency_key = ?",
            owner, key);
    }

    /** A JSON POST as the owner (X-Owner-Id, the example's stand-in for authentication), with the key if any. */
    HttpResponse<byte[]> post(String path, String key, long owner, String body) throws Exception {
        HttpRequest.Builder r = HttpRequest.newBuilder(URI.create("http://127.0.0.1:" + port + path))
            .header("Content-Type", "application/json").header("X-Owner-Id", Long.toString(owner))
            .POST(HttpRequest.BodyPublishers.ofString(body));
        if (key != null) {
            r.header("Idempotency-Key", key);
        }
        return HTTP.send(r.build(), HttpResponse.BodyHandlers.ofByteArray());
    }

    static String text(HttpResponse<byte[]> r) {
        return new String(r.body(), StandardCharsets.UTF_8);
    }
}
