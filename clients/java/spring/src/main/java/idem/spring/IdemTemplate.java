package idem.spring;

import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.Map;
import javax.sql.DataSource;

import idem.Idem;
import idem.IdemException;
import org.springframework.dao.DataAccessException;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.support.TransactionSynchronizationManager;

/**
 * idem's API for services, in the caller's Spring-managed transaction (it must be in one: a
 * {@code @Transactional} method, or a TransactionTemplate): the calls run on
 * {@code DataSourceUtils.getConnection}, so the record and the business writes commit or roll
 * back together. idem's errors arrive as {@link IdemFailure}, unchecked, so that
 * {@code @Transactional} rolls back on them (its default rolls back on unchecked exceptions only).
 */
public class IdemTemplate {
    private final DataSource dataSource;
    private final Idem idem;

    public IdemTemplate(DataSource dataSource, Idem idem) {
        this.dataSource = dataSource;
        this.idem = idem;
    }

    /** idem's error (its SQLSTATE's class: {@code getCause()} is the {@link IdemException}). */
    public static class IdemFailure extends DataAccessException {
        private static final long serialVersionUID = 1L;

        public IdemFailure(SQLException cause) {
            super(cause.getMessage(), cause);
        }

        public String sqlState() {
            return ((SQLException) getCause()).getSQLState();
        }
    }

    @FunctionalInterface
    private interface Call<T> {
        T on(Connection c) throws SQLException;
    }

    private <T> T call(Call<T> call) {
        if (!TransactionSynchronizationManager.isActualTransactionActive()) {
            throw new IllegalStateException("IdemTemplate runs in the caller's transaction: call it from a "
                + "@Transactional method or a TransactionTemplate");
        }
        Connection c = DataSourceUtils.getConnection(dataSource);
        try {
            return call.on(c);
        } catch (SQLException e) {
            throw new IdemFailure(e instanceof IdemException ? e : IdemException.of(e));
        } finally {
            DataSourceUtils.releaseConnection(c, dataSource);
        }
    }

    public Idem.Outcome begin(long owner, String operation, String key, String requestJson, Duration ttl) {
        return call(c -> idem.begin(c, owner, operation, key, requestJson, ttl));
    }

    public void finish(long owner, String operation, String key, int httpStatus, String bodyJson, Long resourceId,
                       Map<String, String> headers) {
        call(c -> {
            idem.finish(c, owner, operation, key, httpStatus, bodyJson, resourceId, headers);
            return null;
        });
    }

    public Idem.Outcome run(long owner, String operation, String key, String requestJson, String handler,
                            Duration ttl) {
        return call(c -> idem.run(c, owner, operation, key, requestJson, handler, ttl));
    }

    public Idem.Submission submit(long owner, String operation, String key, String requestJson, String payloadJson,
                                  Duration ttl) {
        return call(c -> idem.submit(c, owner, operation, key, requestJson, payloadJson, ttl));
    }

    public long emit(String topic, String payloadJson, String msgKey, Map<String, String> headers) {
        return call(c -> idem.emit(c, topic, payloadJson, msgKey, headers));
    }

    public boolean consume(String consumer, String messageId, Duration ttl, Long owner) {
        return call(c -> idem.consume(c, consumer, messageId, ttl, owner));
    }
}
