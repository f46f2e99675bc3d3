package idem;

import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.concurrent.ConcurrentHashMap;

import org.postgresql.PGStatement;

/**
 * idem from Java: the SQL API of the idem extension on a JDBC {@link Connection}, in the
 * caller's transaction. No method commits or rolls back: the caller's transaction decides,
 * so the business writes and idem's record commit together. JSON goes in and out as text
 * (the request, bodies, payloads); PostgreSQL parses it.
 *
 * <pre>
 * Idem idem = new Idem();                        // new Idem().withoutServerPrepare() behind PgBouncer
 * conn.setAutoCommit(false);
 * Idem.Outcome o = idem.begin(conn, 42, "DEBIT", key, "{\"account\": 7, \"amount\": 100}", null);
 * if (!o.replayed()) {
 *     ... the work, on conn ...
 *     idem.finish(conn, 42, "DEBIT", key, 201, "{\"debited\": 100}", null, Map.of());
 * }
 * conn.commit();
 * </pre>
 *
 * Errors are {@link IdemException}s, one subclass per SQLSTATE.
 */
public final class Idem {
    private final boolean serverPrepare;
    /** idem's schema as an SQL identifier, when configured; else looked up per database. */
    private final String schema;
    private final Map<String, String> found;

    public Idem() {
        this(true, null, new ConcurrentHashMap<>());
    }

    private Idem(boolean serverPrepare, String schema, Map<String, String> found) {
        this.serverPrepare = serverPrepare;
        this.schema = schema;
        this.found = found;
    }

    /** The same API that never prepares statements on the server (prepareThreshold 0): behind a transaction pooler. */
    public Idem withoutServerPrepare() {
        return new Idem(false, schema, found);
    }

    /**
     * The same API with idem's schema named instead of looked up. Otherwise it is read from
     * pg_extension once per database URL (a pool's connections share it).
     */
    public Idem withSchema(String name) {
        return new Idem(serverPrepare, quote(name), found);
    }

    /** A name as an SQL identifier. */
    static String quote(String name) {
        return "\"" + name.replace("\"", "\"\"") + "\"";
    }

    private static final String LOOKUP = "SELECT n.nspname FROM pg_catalog.pg_extension e"
        + " JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace"
        + " WHERE e.extname OPERATOR(pg_catalog.=) 'idem'";

    /**
     * idem's schema on this connection's database. Every statement names it ({@code @idem@}) and
     * casts every argument to the type of idem's parameter, so that no function of the same name
     * elsewhere on the search_path, nor an overload in idem's own schema that a varchar would
     * match better, runs in idem's place (docs/security.md).
     */
    String schema(Connection c) throws SQLException {
        if (schema != null) {
            return schema;
        }
        String url = c.getMetaData().getURL();
        String s = found.get(url);
        if (s == null) {
            try (PreparedStatement ps = c.prepareStatement(LOOKUP); ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    throw new SQLException("idem is not installed in this database (CREATE EXTENSION idem)", "42883");
                }
                s = quote(rs.getString(1));
            }
            found.put(url, s);
        }
        return s;
    }

    public boolean serverPrepare() {
        return serverPrepare;
    }

    /** What idem_begin and idem_run answer; {@code body} is the stored JSON text, byte for byte. */
    public record Outcome(boolean replayed, Integer httpStatus, String body, Map<String, String> headers,
                          Long resourceId, Instant expiresAt) {
    }

    /** What idem_submit answers: a long flow's state. */
    public record Submission(boolean replayed, String status, Integer httpStatus, String body,
                             Map<String, String> headers, Long resourceId, Long taskId) {
        /**
         * idem 1.16: the task's outcome is being reconciled; {@code body} is then a problem
         * ({@code application/problem+json}) of type urn:idem:task:reconciling, to answer with its 202.
         */
        public boolean reconciling() {
            return body != null && body.contains("\"urn:idem:task:reconciling\"");
        }
    }

    private static final String OUTCOME = "replayed, http_status, body::pg_catalog.text, "
        + "ARRAY(SELECT pg_catalog.unnest(ARRAY[k, v]) FROM pg_catalog.jsonb_each_text(headers) AS h(k, v)), "
        + "resource_id, extract(epoch FROM expires_at)::pg_catalog.float8";

    PreparedStatement prepare(Connection c, String sql) throws SQLException {
        PreparedStatement ps = c.prepareStatement(sql.contains("@idem@") ? sql.replace("@idem@", schema(c)) : sql);
        if (!serverPrepare) {
            ps.unwrap(PGStatement.class).setPrepareThreshold(0);
        }
        return ps;
    }

    static Object interval(Duration d) {
        return d == null ? null : (d.toMillis() / 1000.0) + " seconds";
    }

    static Array headerArray(Connection c, Map<String, String> headers) throws SQLException {
        if (headers == null) {
            return null;
        }
        List<String> flat = new ArrayList<>();
        headers.forEach((k, v) -> {
            flat.add(k);
            flat.add(v);
        });
        return c.createArrayOf("text", flat.toArray());
    }

    static Map<String, String> headerMap(Array a) throws SQLException {
        if (a == null) {
            return null;
        }
        String[] flat = (String[]) a.getArray();
        Map<String, String> m = new LinkedHashMap<>();
        for (int i = 0; i + 1 < flat.length; i += 2) {
            m.put(flat[i], flat[i + 1]);
        }
        return m;
    }

    static Long longOrNull(ResultSet rs, int col) throws SQLException {
        long v = rs.getLong(col);
        return rs.wasNull() ? null : v;
    }

    static Integer intOrNull(ResultSet rs, int col) throws SQLException {
        int v = rs.getInt(col);
        return rs.wasNull() ? null : v;
    }

    private static Outcome outcome(ResultSet rs) throws SQLException {
        rs.next();
        double epoch = rs.getDouble(6);
        Instant expires = rs.wasNull() ? null
            : Instant.ofEpochSecond((long) Math.floor(epoch), Math.round((epoch - Math.floor(epoch)) * 1e6) * 1000);
        Map<String, String> headers = headerMap(rs.getArray(4));     // empty: no headers stored
        return new Outcome(rs.getBoolean(1), intOrNull(rs, 2), rs.getString(3), headers, longOrNull(rs, 5), expires);
    }

    /** Whether the session's role may call what idem_grant(role, 'app') gives, and the role. */
    public record AppGrants(boolean granted, String role) {
    }

    /**
     * Asks, after a 42501 (which also means an owner outside idem.allowed_owners), whether the
     * session's role may call idem_begin and idem_finish.
     */
    public AppGrants appGrants(Connection c) throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT coalesce(pg_catalog.has_function_privilege("
            + "pg_catalog.to_regprocedure('@idem@.idem_begin(bigint, text, text, jsonb, interval)'), 'EXECUTE')"
            + " AND pg_catalog.has_function_privilege(pg_catalog.to_regprocedure("
            + "'@idem@.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'), 'EXECUTE'), false),"
            + " current_user::pg_catalog.text");
             ResultSet rs = ps.executeQuery()) {
            rs.next();
            return new AppGrants(rs.getBoolean(1), rs.getString(2));
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_begin: claims the key for this transaction (replayed false), or replays. */
    public Outcome begin(Connection c, long owner, String operation, String key, String requestJson, Duration ttl)
        throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT " + OUTCOME
            + " FROM @idem@.idem_begin(?::pg_catalog.int8, ?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.jsonb, ?::pg_catalog.interval)")) {
            ps.setLong(1, owner);
            ps.setString(2, operation);
            ps.setString(3, key);
            ps.setString(4, requestJson);
            ps.setObject(5, interval(ttl));
            try (ResultSet rs = ps.executeQuery()) {
                return outcome(rs);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_finish: stores this transaction's claim's answer (2xx-4xx); bodyJson may be null. */
    public void finish(Connection c, long owner, String operation, String key, int httpStatus, String bodyJson,
                       Long resourceId, Map<String, String> headers) throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT @idem@.idem_finish(?::pg_catalog.int8, ?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.int4, ?::pg_catalog.json, ?::pg_catalog.int8, "
            + "pg_catalog.jsonb_object(?::pg_catalog.text[]))")) {
            ps.setLong(1, owner);
            ps.setString(2, operation);
            ps.setString(3, key);
            ps.setInt(4, httpStatus);
            ps.setString(5, bodyJson);
            ps.setObject(6, resourceId);
            ps.setArray(7, headerArray(c, headers));
            ps.executeQuery().close();
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_run: calls the SQL handler (a regprocedure, e.g. "debit_handler(jsonb)") once per key, or replays. */
    public Outcome run(Connection c, long owner, String operation, String key, String requestJson, String handler,
                       Duration ttl) throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT " + OUTCOME
            + " FROM @idem@.idem_run(?::pg_catalog.int8, ?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.jsonb, ?::pg_catalog.regprocedure, ?::pg_catalog.interval)")) {
            ps.setLong(1, owner);
            ps.setString(2, operation);
            ps.setString(3, key);
            ps.setString(4, requestJson);
            ps.setString(5, handler);
            ps.setObject(6, interval(ttl));
            try (ResultSet rs = ps.executeQuery()) {
                return outcome(rs);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_submit: starts a long flow (a task for the workers), or tells its state. */
    public Submission submit(Connection c, long owner, String operation, String key, String requestJson,
                             String payloadJson, Duration ttl) throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT replayed, status, http_status, body::pg_catalog.text, "
            + "ARRAY(SELECT pg_catalog.unnest(ARRAY[k, v]) FROM pg_catalog.jsonb_each_text(headers) AS h(k, v)), "
            + "resource_id, task_id FROM @idem@.idem_submit(?::pg_catalog.int8, ?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.jsonb, ?::pg_catalog.jsonb, ?::pg_catalog.interval)")) {
            ps.setLong(1, owner);
            ps.setString(2, operation);
            ps.setString(3, key);
            ps.setString(4, requestJson);
            ps.setString(5, payloadJson);
            ps.setObject(6, interval(ttl));
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return new Submission(rs.getBoolean(1), rs.getString(2), intOrNull(rs, 3), rs.getString(4),
                    headerMap(rs.getArray(5)), longOrNull(rs, 6), longOrNull(rs, 7));
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_consume: true the first time the consumer sees the message (apply the effect now). */
    public boolean consume(Connection c, String consumer, String messageId, Duration ttl) throws SQLException {
        return consume(c, consumer, messageId, ttl, null);
    }

    /**
     * idem_consume with the message's owner (idem 1.11), kept with the inbox entry for
     * idem_forget_owner; null: none.
     */
    public boolean consume(Connection c, String consumer, String messageId, Duration ttl, Long owner)
        throws SQLException {
        String sql = owner == null ? "SELECT @idem@.idem_consume(?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.interval)"
            : "SELECT @idem@.idem_consume(?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.interval, ?::pg_catalog.int8)";
        try (PreparedStatement ps = prepare(c, sql)) {
            ps.setString(1, consumer);
            ps.setString(2, messageId);
            ps.setObject(3, interval(ttl));
            if (owner != null) {
                ps.setLong(4, owner);
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getBoolean(1);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** idem_outbox_emit: a message published once this transaction commits; its id. */
    public long emit(Connection c, String topic, String payloadJson, String msgKey, Map<String, String> headers)
        throws SQLException {
        try (PreparedStatement ps = prepare(c, "SELECT @idem@.idem_outbox_emit(?::pg_catalog.text, ?::pg_catalog.jsonb, ?::pg_catalog.text, "
            + "pg_catalog.jsonb_object(?::pg_catalog.text[]))")) {
            ps.setString(1, topic);
            ps.setString(2, payloadJson);
            ps.setString(3, msgKey);
            ps.setArray(4, headerArray(c, headers));
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getLong(1);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    /** One whole transaction, done by {@link #retrySerializable}. */
    @FunctionalInterface
    public interface Transaction<T> {
        T run() throws SQLException;
    }

    /**
     * Runs {@code tx} (which opens, does and commits one transaction) again when it fails with
     * 40001, up to {@code attempts} times, with a random backoff up to 10 ms * 2^n in between.
     */
    public static <T> T retrySerializable(Transaction<T> tx, int attempts) throws SQLException {
        for (int i = 0; ; i++) {
            try {
                return tx.run();
            } catch (SQLException e) {
                if (!"40001".equals(e.getSQLState()) || i == attempts - 1) {
                    throw IdemException.of(e);
                }
                try {
                    Thread.sleep((long) (Math.random() * Math.min(1000, 10L << i)));
                } catch (InterruptedException ie) {
                    Thread.currentThread().interrupt();
                    throw e;
                }
            }
        }
    }
}
