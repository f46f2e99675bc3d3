package idem.spring;

import java.sql.Connection;
import java.sql.SQLException;
import javax.sql.DataSource;

import idem.servlet.Settings;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.jdbc.datasource.DataSourceUtils;
import org.springframework.transaction.PlatformTransactionManager;
import org.springframework.transaction.TransactionDefinition;
import org.springframework.transaction.TransactionStatus;
import org.springframework.transaction.support.TransactionSynchronizationManager;
import org.springframework.util.ClassUtils;

/**
 * The request's transaction on the application's PlatformTransactionManager (propagation
 * REQUIRED: the handler's {@code @Transactional} services join it), and idem's calls on its
 * connection ({@code DataSourceUtils.getConnection}: with JPA, the EntityManager's own).
 * Before the answer is stored, a bound JPA EntityManager is flushed, so that a constraint it
 * would break fails the request instead of the commit after the answer was stored.
 */
final class SpringTransactions implements Settings.Transactions {
    private static final boolean JPA = ClassUtils.isPresent("org.springframework.orm.jpa.EntityManagerHolder",
        SpringTransactions.class.getClassLoader()) && ClassUtils.isPresent("jakarta.persistence.EntityManager",
        SpringTransactions.class.getClassLoader());

    private final BeanFactory beans;

    SpringTransactions(BeanFactory beans) {
        this.beans = beans;
    }

    @Override
    public Settings.Transaction begin(HttpServletRequest request) throws SQLException {
        Idempotent idempotent = (Idempotent) request.getAttribute(IdempotentRoutes.ANNOTATION);
        PlatformTransactionManager tm = idempotent == null || idempotent.transactionManager().isEmpty()
            ? beans.getBean(PlatformTransactionManager.class)
            : beans.getBean(idempotent.transactionManager(), PlatformTransactionManager.class);
        DataSource ds = idempotent == null || idempotent.dataSource().isEmpty()
            ? beans.getBean(DataSource.class)
            : beans.getBean(idempotent.dataSource(), DataSource.class);
        TransactionStatus status = tm.getTransaction(TransactionDefinition.withDefaults());
        Connection c;
        try {
            c = DataSourceUtils.getConnection(ds);
        } catch (RuntimeException e) {
            tm.rollback(status);
            throw wrap("idem: no connection in the request's transaction", e);
        }
        return new Settings.Transaction() {
            @Override
            public Connection connection() {
                return c;
            }

            @Override
            public void flush() throws SQLException {
                if (JPA) {
                    try {
                        Jpa.flushBound();
                    } catch (RuntimeException e) {
                        throw wrap("idem: the JPA flush before storing the answer failed", e);
                    }
                }
            }

            @Override
            public void commit() throws SQLException {
                DataSourceUtils.releaseConnection(c, ds);
                try {
                    tm.commit(status);
                } catch (RuntimeException e) {
                    throw wrap("idem: the request's transaction did not commit", e);
                }
            }

            @Override
            public void rollback() {
                DataSourceUtils.releaseConnection(c, ds);
                if (!status.isCompleted()) {
                    tm.rollback(status);
                }
            }
        };
    }

    /** An SQLException with the SQLSTATE of the first SQLException among the causes (40001 is retried). */
    static SQLException wrap(String message, Throwable e) {
        String state = null;
        for (Throwable t = e; t != null && state == null; t = t.getCause()) {
            if (t instanceof SQLException sql) {
                state = sql.getSQLState();
            }
        }
        return new SQLException(message + ": " + e.getMessage(), state, e);
    }

    /** Loaded only where JPA is. */
    private static final class Jpa {
        static void flushBound() {
            for (Object resource : TransactionSynchronizationManager.getResourceMap().values()) {
                if (resource instanceof org.springframework.orm.jpa.EntityManagerHolder holder) {
                    holder.getEntityManager().flush();
                }
            }
        }
    }
}
