package shop;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.util.UUID;

import org.springframework.beans.factory.annotation.Value;

/**
 * What the tests of the running application share: its port, and counts read by a superuser
 * connection of their own (the test command's PostgreSQL: spring.datasource.url,
 * idem.test.admin-user), never through the application's pool.
 */
abstract class ServiceTests {
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
}
