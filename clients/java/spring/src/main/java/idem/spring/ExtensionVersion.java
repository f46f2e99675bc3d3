package idem.spring;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import javax.sql.DataSource;

/** The health indicators' one catalog lookup (never idem_health(), which counts whole tables). */
final class ExtensionVersion {
    private ExtensionVersion() {
    }

    /** idem's installed version in the database, or null when the extension is not installed. */
    static String of(DataSource dataSource) throws SQLException {
        try (Connection c = dataSource.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT extversion FROM pg_catalog.pg_extension WHERE extname = 'idem'");
             ResultSet rs = ps.executeQuery()) {
            return rs.next() ? rs.getString(1) : null;
        }
    }
}
