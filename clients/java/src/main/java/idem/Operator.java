package idem;

import java.sql.Array;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Types;

/**
 * An operator's actions (idem 1.16): on a task, cancel, retry now, resolve with an answer, settle an
 * uncertain outcome; on dead letters, redrive or discard. The role needs {@code idem_grant(role,
 * 'operator')}; each action is bound by its {@code idem.allowed_owners} and {@code
 * idem.allowed_operations} and written to {@code idem_operator_actions} with the reason, in the
 * caller's transaction. A task whose state the action does not take raises {@link
 * IdemException.TaskStateConflict} (IK008, HTTP 409); outside the role's owners or operations {@link
 * IdemException.Forbidden}; a missing reason or unknown task {@link IdemException.InvalidRequest}.
 */
public final class Operator {
    private final Idem idem;

    public Operator(Idem idem) {
        this.idem = idem;
    }

    /** Ends an unfinished task FAILED_FINAL (HTTP 500); its new status. */
    public String cancelTask(Connection c, long taskId, String reason) throws SQLException {
        return text(c, "SELECT @idem@.idem_task_cancel(?::pg_catalog.int8, ?::pg_catalog.text)", taskId, reason);
    }

    /** Makes a task waiting for its next attempt due now; its new status. */
    public String retryTask(Connection c, long taskId, String reason) throws SQLException {
        return text(c, "SELECT @idem@.idem_task_retry(?::pg_catalog.int8, ?::pg_catalog.text)", taskId, reason);
    }

    /** Ends an unfinished task with this answer, which the client's repeat gets; its new status. */
    public String resolveTask(Connection c, long taskId, int httpStatus, String bodyJson, String reason, Long resourceId)
        throws SQLException {
        return text(c, "SELECT @idem@.idem_task_resolve(?::pg_catalog.int8, ?::pg_catalog.int4, ?::pg_catalog.json,"
            + " ?::pg_catalog.text, ?::pg_catalog.int8)", taskId, httpStatus, bodyJson, reason, resourceId);
    }

    /** Settles a task whose outcome is uncertain: the provider's answer, or due again; its new status. */
    public String settleTask(Connection c, long taskId, boolean happened, String reason, Integer httpStatus,
                             String bodyJson, Long resourceId) throws SQLException {
        return text(c, "SELECT @idem@.idem_task_settle(?::pg_catalog.int8, ?::pg_catalog.bool, ?::pg_catalog.text,"
            + " ?::pg_catalog.int4, ?::pg_catalog.json, ?::pg_catalog.int8)",
            taskId, happened, reason, httpStatus, happened ? bodyJson : null, resourceId);
    }

    /** Delivers outbox dead letters again; how many. */
    public long redriveMessages(Connection c, long[] messageIds, String reason) throws SQLException {
        return Long.parseLong(text(c, "SELECT @idem@.idem_outbox_redrive(?::pg_catalog.int8[], ?::pg_catalog.text)",
            ids(c, messageIds), reason));
    }

    /** Gives outbox dead letters up for good; how many. */
    public long discardMessages(Connection c, long[] messageIds, String reason) throws SQLException {
        return Long.parseLong(text(c, "SELECT @idem@.idem_outbox_discard(?::pg_catalog.int8[], ?::pg_catalog.text)",
            ids(c, messageIds), reason));
    }

    private static Array ids(Connection c, long[] messageIds) throws SQLException {
        Long[] boxed = new Long[messageIds.length];
        for (int i = 0; i < messageIds.length; i++) {
            boxed[i] = messageIds[i];
        }
        return c.createArrayOf("int8", boxed);
    }

    private String text(Connection c, String sql, Object... args) throws SQLException {
        try (PreparedStatement ps = idem.prepare(c, sql)) {
            for (int i = 0; i < args.length; i++) {
                if (args[i] == null) {
                    ps.setNull(i + 1, Types.OTHER);
                } else {
                    ps.setObject(i + 1, args[i]);
                }
            }
            try (ResultSet rs = ps.executeQuery()) {
                rs.next();
                return rs.getString(1);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }
}
