package idem;

import java.sql.SQLException;

/**
 * An error of an idem call, by SQLSTATE (docs/reference.md). The driver's exception is the
 * cause; the transaction is aborted and must be rolled back.
 */
public class IdemException extends SQLException {
    private static final long serialVersionUID = 1L;

    public IdemException(String message, String sqlState, Throwable cause) {
        super(message, sqlState, cause);
    }

    /** IK001: the key was already used with a different request. */
    public static class KeyReused extends IdemException {
        private static final long serialVersionUID = 1L;
        KeyReused(String m, Throwable c) { super(m, "IK001", c); }
    }

    /** IK002: the original request is still being processed. */
    public static class InFlight extends IdemException {
        private static final long serialVersionUID = 1L;
        InFlight(String m, Throwable c) { super(m, "IK002", c); }
    }

    /** IK003: idem_finish without an unfinished claim in this transaction. */
    public static class NoClaim extends IdemException {
        private static final long serialVersionUID = 1L;
        NoClaim(String m, Throwable c) { super(m, "IK003", c); }
    }

    /** IK004: the task's lease is no longer this token's. */
    public static class LeaseLost extends IdemException {
        private static final long serialVersionUID = 1L;
        LeaseLost(String m, Throwable c) { super(m, "IK004", c); }
    }

    /** IK005 (a claim not finished at COMMIT) and IK006 (idem called for the key being run). */
    public static class Misuse extends IdemException {
        private static final long serialVersionUID = 1L;
        Misuse(String m, String state, Throwable c) { super(m, state, c); }
    }

    /** IK007: the key's record expired and its operation refuses to execute it again. */
    public static class KeyExpired extends IdemException {
        private static final long serialVersionUID = 1L;
        KeyExpired(String m, Throwable c) { super(m, "IK007", c); }
    }

    /** 22023, 22004, 22003, 22P02, 22P05: a bad argument (key, operation, ttl, JSON, a \\u0000...). */
    public static class InvalidRequest extends IdemException {
        private static final long serialVersionUID = 1L;
        InvalidRequest(String m, String state, Throwable c) { super(m, state, c); }
    }

    /** 25006: a write on a read-only server or transaction. */
    public static class ReadOnly extends IdemException {
        private static final long serialVersionUID = 1L;
        ReadOnly(String m, Throwable c) { super(m, "25006", c); }
    }

    /** 42501: no right to the function, the owner or the operation. */
    public static class NotAllowed extends IdemException {
        private static final long serialVersionUID = 1L;
        NotAllowed(String m, Throwable c) { super(m, "42501", c); }
    }

    /** 40001: retry the whole transaction ({@link Idem#retrySerializable}). */
    /**
     * 42725, 42883, 3F000: idem's function is ambiguous (an overload planted in idem's schema:
     * idem_health().shadowing_functions) or missing; from the servlet filter also a role without
     * idem's grants (42501). The server's setup, not the request: a 500.
     */
    public static class Misconfigured extends IdemException {
        private static final long serialVersionUID = 1L;
        public Misconfigured(String m, String state, Throwable c) { super(m, state, c); }
    }

    public static class SerializationFailure extends IdemException {
        private static final long serialVersionUID = 1L;
        SerializationFailure(String m, Throwable c) { super(m, "40001", c); }
    }

    /** The idem exception of a driver exception (an IdemException is returned as it is). */
    public static SQLException of(SQLException e) {
        if (e instanceof IdemException) {
            return e;
        }
        String state = e.getSQLState();
        String m = message(e);
        if (state == null) {
            return e;
        }
        switch (state) {
            case "IK001": return new KeyReused(m, e);
            case "IK002": return new InFlight(m, e);
            case "IK003": return new NoClaim(m, e);
            case "IK004": return new LeaseLost(m, e);
            case "IK005": case "IK006": return new Misuse(m, state, e);
            case "IK007": return new KeyExpired(m, e);
            case "22023": case "22004": case "22003": case "22P02": case "22P05": return new InvalidRequest(m, state, e);
            case "25006": return new ReadOnly(m, e);
            case "42501": return new NotAllowed(m, e);
            case "40001": return new SerializationFailure(m, e);
            case "42725": case "42883": case "3F000": return new Misconfigured(m, state, e);
            default: return new IdemException(m, state, e);
        }
    }

    private static String message(SQLException e) {
        if (e instanceof org.postgresql.util.PSQLException p && p.getServerErrorMessage() != null) {
            return p.getServerErrorMessage().getMessage();
        }
        return e.getMessage();
    }
}
