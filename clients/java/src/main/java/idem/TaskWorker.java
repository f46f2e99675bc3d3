package idem;

import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.time.Duration;
import java.time.Instant;
import java.util.ArrayList;
import java.util.List;

/**
 * A long flow's worker: leases the due tasks of one operation; each {@link Task} carries its
 * fencing token for heartbeat, complete and fail (IK004, {@link IdemException.StaleToken},
 * once it was taken over: nothing changes).
 */
public final class TaskWorker {
    private final Idem idem;
    private final String operation;
    private final String worker;
    private final Duration lease;
    private final boolean bindSession;

    public TaskWorker(Idem idem, String operation, String worker, Duration lease, boolean bindSession) {
        this.idem = idem;
        this.operation = operation;
        this.worker = worker;
        this.lease = lease;
        this.bindSession = bindSession;
    }

    /** A leased task: what the submit stored, and this lease's token. */
    public record Task(Idem idem, long taskId, long owner, String key, String requestJson, String payloadJson,
                       int attempt, long token, Instant leaseExpiresAt) {
        public Instant heartbeat(Connection c, Duration extend) throws SQLException {
            try (PreparedStatement ps = idem.prepare(c, "SELECT @idem@.idem_heartbeat(?::pg_catalog.int8, ?::pg_catalog.int8, ?::pg_catalog.interval)")) {
                ps.setLong(1, taskId);
                ps.setLong(2, token);
                ps.setObject(3, Idem.interval(extend));
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    return rs.getTimestamp(1).toInstant();
                }
            } catch (SQLException e) {
                throw IdemException.of(e);
            }
        }

        /** Stores the result (2xx-4xx), in the transaction of the business write. */
        public void complete(Connection c, int httpStatus, String bodyJson, Long resourceId) throws SQLException {
            try (PreparedStatement ps = idem.prepare(c, "SELECT @idem@.idem_complete(?::pg_catalog.int8, ?::pg_catalog.int8, ?::pg_catalog.int4, ?::pg_catalog.json, ?::pg_catalog.int8)")) {
                ps.setLong(1, taskId);
                ps.setLong(2, token);
                ps.setInt(3, httpStatus);
                ps.setString(4, bodyJson);
                ps.setObject(5, resourceId);
                ps.executeQuery().close();
            } catch (SQLException e) {
                throw IdemException.of(e);
            }
        }

        /** A failed attempt: "FAILED_RETRYABLE" (due again after a backoff) or "FAILED_FINAL". */
        public String fail(Connection c, String errorJson, boolean retryable) throws SQLException {
            try (PreparedStatement ps = idem.prepare(c, "SELECT @idem@.idem_fail(?::pg_catalog.int8, ?::pg_catalog.int8, ?::pg_catalog.jsonb, ?::pg_catalog.bool)")) {
                ps.setLong(1, taskId);
                ps.setLong(2, token);
                ps.setString(3, errorJson);
                ps.setBoolean(4, retryable);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    return rs.getString(1);
                }
            } catch (SQLException e) {
                throw IdemException.of(e);
            }
        }

        /**
         * idem 1.16: the attempt's outcome is unknown (a provider's timeout): "PROCESSING" when the
         * operation reconciles (the task waits for {@link TaskWorker#leaseReconcile}), else as a
         * retryable {@link #fail}.
         */
        public String failUnknown(Connection c, String errorJson) throws SQLException {
            try (PreparedStatement ps = idem.prepare(c, "SELECT @idem@.idem_fail_unknown(?::pg_catalog.int8, ?::pg_catalog.int8, ?::pg_catalog.jsonb)")) {
                ps.setLong(1, taskId);
                ps.setLong(2, token);
                ps.setString(3, errorJson);
                try (ResultSet rs = ps.executeQuery()) {
                    rs.next();
                    return rs.getString(1);
                }
            } catch (SQLException e) {
                throw IdemException.of(e);
            }
        }
    }

    /**
     * idem 1.16: a task whose outcome is uncertain, leased to find it out: ask the provider, then
     * {@code task().complete}, {@code task().fail(..., false)}, {@link #notCharged} or
     * {@code task().failUnknown} again.  {@code attemptsJson}: its ended attempts, oldest first.
     */
    public record ReconcileTask(Task task, Instant uncertainSince, String attemptsJson) {
        /** The provider has no trace of the attempt: it had no effect, the task is due again. */
        public String notCharged(Connection c) throws SQLException {
            return task.fail(c, "{\"reconciled\": \"not charged\"}", true);
        }
    }

    /**
     * idem 1.16: up to {@code batch} tasks whose outcome is uncertain, each with a new token and its
     * attempts so far; {@link #lease} never returns them.
     */
    public List<ReconcileTask> leaseReconcile(Connection c, int batch) throws SQLException {
        try (PreparedStatement ps = idem.prepare(c, "SELECT task_id, owner, key, request::pg_catalog.text, "
            + "payload::pg_catalog.text, attempt, token, lease_expires_at, uncertain_since, attempts::pg_catalog.text "
            + "FROM @idem@.idem_lease_reconcile(?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.interval, ?::pg_catalog.int4, ?::pg_catalog.bool)")) {
            ps.setString(1, operation);
            ps.setString(2, worker);
            ps.setObject(3, Idem.interval(lease));
            ps.setInt(4, batch);
            ps.setBoolean(5, bindSession);
            List<ReconcileTask> tasks = new ArrayList<>();
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    tasks.add(new ReconcileTask(task(rs), rs.getTimestamp(9).toInstant(), rs.getString(10)));
                }
            }
            return tasks;
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    private Task task(ResultSet rs) throws SQLException {
        return new Task(idem, rs.getLong(1), rs.getLong(2), rs.getString(3), rs.getString(4),
            rs.getString(5), rs.getInt(6), rs.getLong(7), rs.getTimestamp(8).toInstant());
    }

    /** Up to {@code batch} due tasks, each with a new token. */
    public List<Task> lease(Connection c, int batch) throws SQLException {
        try (PreparedStatement ps = idem.prepare(c, "SELECT task_id, owner, key, request::pg_catalog.text, "
            + "payload::pg_catalog.text, attempt, token, lease_expires_at "
            + "FROM @idem@.idem_lease(?::pg_catalog.text, ?::pg_catalog.text, ?::pg_catalog.interval, ?::pg_catalog.int4, ?::pg_catalog.bool)")) {
            ps.setString(1, operation);
            ps.setString(2, worker);
            ps.setObject(3, Idem.interval(lease));
            ps.setInt(4, batch);
            ps.setBoolean(5, bindSession);
            List<Task> tasks = new ArrayList<>();
            try (ResultSet rs = ps.executeQuery()) {
                while (rs.next()) {
                    tasks.add(task(rs));
                }
            }
            return tasks;
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }
}
