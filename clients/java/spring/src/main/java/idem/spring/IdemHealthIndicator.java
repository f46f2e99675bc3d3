package idem.spring;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import javax.sql.DataSource;

import org.springframework.boot.actuate.health.AbstractHealthIndicator;
import org.springframework.boot.actuate.health.Health;

/**
 * UP with idem's installed version when the extension is in the database; DOWN when it is not
 * or the database does not answer. One catalog lookup (cheap enough for a probe).
 */
public class IdemHealthIndicator extends AbstractHealthIndicator {
    private final DataSource dataSource;

    public IdemHealthIndicator(DataSource dataSource) {
        super("idem health check failed");
        this.dataSource = dataSource;
    }

    @Override
    protected void doHealthCheck(Health.Builder builder) throws Exception {
        try (Connection c = dataSource.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idem'");
             ResultSet rs = ps.executeQuery()) {
            if (rs.next()) {
                builder.up().withDetail("version", rs.getString(1));
            } else {
                builder.down().withDetail("error", "the extension idem is not installed in this database");
            }
        }
    }
}
