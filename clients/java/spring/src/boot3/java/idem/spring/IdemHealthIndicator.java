package idem.spring;

import javax.sql.DataSource;

import org.springframework.boot.actuate.health.AbstractHealthIndicator;
import org.springframework.boot.actuate.health.Health;

/**
 * UP with idem's installed version when the extension is in the database; DOWN when it is not
 * or the database does not answer. One catalog lookup (cheap enough for a probe). Boot 3 and
 * Boot 4 name Actuator's health API in other packages: src/boot3/java and src/boot4/java hold
 * this class in each line's names.
 */
public class IdemHealthIndicator extends AbstractHealthIndicator {
    private final DataSource dataSource;

    public IdemHealthIndicator(DataSource dataSource) {
        super("idem health check failed");
        this.dataSource = dataSource;
    }

    @Override
    protected void doHealthCheck(Health.Builder builder) throws Exception {
        String version = ExtensionVersion.of(dataSource);
        if (version != null) {
            builder.up().withDetail("version", version);
        } else {
            builder.down().withDetail("error", "the extension idem is not installed in this database");
        }
    }
}
