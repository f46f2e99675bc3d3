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

    /**
     * idem's installed version (null: not installed), whether the DataSource's role may call
     * what idem_grant(role, 'app') gives, and that role.
     */
    record Status(String version, boolean granted, String role) {
        /** Why idem cannot serve this role, or null. */
        String problem() {
            if (version == null) {
                return "the extension idem is not installed in this database";
            }
            return granted ? null
                : "role " + role + " may not call idem's functions: a superuser runs SELECT idem_grant('" + role + "', 'app')";
        }
    }

    static Status of(DataSource dataSource) throws SQLException {
        try (Connection c = dataSource.getConnection();
             PreparedStatement ps = c.prepareStatement(
                 "SELECT e.extversion, coalesce(pg_catalog.has_function_privilege(pg_catalog.to_regprocedure("
                     + "pg_catalog.format('%I.idem_begin(bigint, text, text, jsonb, interval)', n.nspname)), 'EXECUTE')"
                     + " AND pg_catalog.has_function_privilege(pg_catalog.to_regprocedure(pg_catalog.format("
                     + "'%I.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)', n.nspname)), 'EXECUTE'),"
                     + " false), current_user::pg_catalog.text"
                     + " FROM pg_catalog.pg_extension e JOIN pg_catalog.pg_namespace n"
                     + " ON n.oid OPERATOR(pg_catalog.=) e.extnamespace WHERE e.extname OPERATOR(pg_catalog.=) 'idem'");
             ResultSet rs = ps.executeQuery()) {
            return rs.next() ? new Status(rs.getString(1), rs.getBoolean(2), rs.getString(3)) : new Status(null, false, null);
        }
    }
}
