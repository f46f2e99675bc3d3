package idem.spring;

import javax.sql.DataSource;

import org.springframework.boot.health.contributor.AbstractHealthIndicator;
import org.springframework.boot.health.contributor.Health;

/**
 * UP with idem's installed version when the extension is in the database and the DataSource's
 * role has idem's grants; DOWN, saying which, when it has not, or the database does not answer.
 * One catalog lookup (cheap enough for a probe). Boot 3 and Boot 4 name Actuator's health API in
 * other packages: src/boot3/java and src/boot4/java hold this class in each line's names.
 */
public class IdemHealthIndicator extends AbstractHealthIndicator {
    private final DataSource dataSource;

    public IdemHealthIndicator(DataSource dataSource) {
        super("idem health check failed");
        this.dataSource = dataSource;
    }

    @Override
    protected void doHealthCheck(Health.Builder builder) throws Exception {
        ExtensionVersion.Status status = ExtensionVersion.of(dataSource);
        if (status.problem() == null) {
            builder.up().withDetail("version", status.version());
        } else {
            builder.down().withDetail("error", status.problem());
        }
    }
}
