package idem;

import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.sql.Statement;
import java.time.Duration;
import java.time.Instant;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.ArrayList;
import java.util.UUID;

import org.junit.jupiter.api.Assertions;
import org.junit.jupiter.api.DynamicTest;
import org.junit.jupiter.api.TestFactory;

/**
 * The Java API against a real server (PGHOST, PGPORT, PGDATABASE; a superuser PGUSER; the
 * database of test/clients/java.sh), run by Maven's Surefire: the scenario runs once, and each
 * of its checks is a test of its own in the report.
 */
@SuppressWarnings("deprecation") // it tests the deprecated names LeaseLost and NotAllowed too
public final class IdemTest {
    private static final List<DynamicTest> CHECKS = new ArrayList<>();

    static void check(String what, boolean ok, Object detail) {
        CHECKS.add(DynamicTest.dynamicTest(what, () -> Assertions.assertTrue(ok, String.valueOf(detail))));
    }

    @TestFactory
    List<DynamicTest> api() throws Exception {
        CHECKS.clear();
        scenario();
        return List.copyOf(CHECKS);
    }

    static String key() {
        return "java-" + UUID.randomUUID().toString().replace("-", "");
    }

    static Connection connect(String user, String options) throws SQLException {
        Properties p = new Properties();
        p.setProperty("user", user);
        if (options != null) {
            p.setProperty("options", options);
        }
        return DriverManager.getConnection("jdbc:postgresql://" + System.getenv("PGHOST") + ":" + System.getenv("PGPORT")
            + "/" + System.getenv("PGDATABASE"), p);
    }

    interface Call {
        void run() throws SQLException;
    }

    static long count(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement(); ResultSet rs = st.executeQuery(sql)) {
            rs.next();
            return rs.getLong(1);
        }
    }

    static String stateOf(Connection c, Call call) throws SQLException {
        try {
            call.run();
            return "no error";
        } catch (IdemException e) {
            return e.getClass().getSimpleName() + " " + e.getSQLState();
        } catch (SQLException e) {
            return "not translated " + e.getSQLState();
        } finally {
            c.rollback();
        }
    }

    static void scenario() throws Exception {
        Idem idem = new Idem();
        String superuser = System.getenv("PGUSER");
        try (Connection c = connect(superuser, null)) {
            c.setAutoCommit(false);
            String k = key();
            Idem.Outcome first = idem.begin(c, 1, "DEBIT", k, "{\"account\": 7, \"amount\": 100}", null);
            idem.finish(c, 1, "DEBIT", k, 201, "{\"b\":1,  \"a\":2}", 9L, Map.of("location", "/debits/9"));
            c.commit();
            Idem.Outcome again = idem.begin(c, 1, "DEBIT", k, "{\"amount\": 100, \"account\": 7.0}", null);
            c.commit();
            check("begin claims, finish stores, a repeat in another spelling replays byte for byte",
                !first.replayed() && again.replayed() && again.httpStatus() == 201
                    && again.body().equals("{\"b\":1,  \"a\":2}") && again.resourceId() == 9L
                    && again.headers().equals(Map.of("location", "/debits/9")), again);
            check("expires_at: the claim's is the stored one, a day ahead",
                first.expiresAt().equals(again.expiresAt())
                    && Duration.between(Instant.now(), again.expiresAt()).toHours() == 23, again.expiresAt());

            check("IK001 is KeyReused", stateOf(c, () -> idem.begin(c, 1, "DEBIT", k, "{\"n\": 2}", null))
                .equals("KeyReused IK001"), "");
            // IK007: an expired key of an operation that refuses reuse (1.11)
            String ek = key();
            try (Statement st = c.createStatement()) {
                st.execute("SELECT public.idem_set_policy('EXPIRING'::pg_catalog.text, audit_ttl => '30 days'::pg_catalog.interval,"
                    + " reuse_after_expiry => 'refuse'::pg_catalog.text)");
                idem.begin(c, 1, "EXPIRING", ek, "{}", null);
                idem.finish(c, 1, "EXPIRING", ek, 201, "{}", null, null);
                st.execute("UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE idempotency_key = '" + ek + "'");
                c.commit();
            }
            check("IK007 is KeyExpired", stateOf(c, () -> idem.begin(c, 1, "EXPIRING", ek, "{}", null))
                .equals("KeyExpired IK007"), "");
            try (Statement st = c.createStatement()) {
                st.execute("SELECT public.idem_drop_policy('EXPIRING'::pg_catalog.text)");
                c.commit();
            }
            check("IK003 is NoClaim", stateOf(c, () -> idem.finish(c, 1, "DEBIT", key(), 200, "{}", null, null))
                .equals("NoClaim IK003"), "");
            check("22023 is InvalidRequest", stateOf(c, () -> idem.begin(c, 1, "DEBIT", "short", "{}", null))
                .equals("InvalidRequest 22023"), "");
            check("a bad JSON request is InvalidRequest 22P02",
                stateOf(c, () -> idem.begin(c, 1, "DEBIT", key(), "{not json", null)).equals("InvalidRequest 22P02"), "");
            try (Connection other = connect(superuser, "-c idem.wait_timeout=0")) {
                other.setAutoCommit(false);
                String held = key();
                idem.begin(c, 1, "DEBIT", held, "{}", null);
                check("IK002 is InFlight", stateOf(other, () -> idem.begin(other, 1, "DEBIT", held, "{}", null))
                    .equals("InFlight IK002"), "");
                c.rollback();
            }
            try (Connection ro = connect(superuser, "-c default_transaction_read_only=on")) {
                ro.setAutoCommit(false);
                String rk = key();
                check("25006 is ReadOnly", stateOf(ro, () -> {
                    idem.begin(ro, 1, "DEBIT", rk, "{}", null);
                    idem.finish(ro, 1, "DEBIT", rk, 201, "{}", null, null);
                }).equals("ReadOnly 25006"), "");
            }
            try (Connection app = connect("shop_app", null)) {
                app.setAutoCommit(false);
                check("42501 is Forbidden, a NotAllowed too (its deprecated name; an owner outside idem.allowed_owners)",
                    stateOf(app, () -> idem.begin(app, 5000000, "DEBIT", key(), "{}", null)).equals("Forbidden 42501")
                        && IdemException.NotAllowed.class.isAssignableFrom(IdemException.Forbidden.class), "");
                check("the deprecated classes stay the superclasses of what replaced them: Misuse of UnfinishedClaim "
                        + "(IK005) and KeyRunning (IK006), LeaseLost of StaleToken (IK004)",
                    IdemException.Misuse.class.isAssignableFrom(IdemException.UnfinishedClaim.class)
                        && IdemException.Misuse.class.isAssignableFrom(IdemException.KeyRunning.class)
                        && IdemException.LeaseLost.class.isAssignableFrom(IdemException.StaleToken.class), "");
            }

            // idem_run with the SQL handler of examples/schema.sql
            c.createStatement().execute("INSERT INTO account VALUES (9101, 100) ON CONFLICT (id) DO UPDATE SET balance = 100");
            c.commit();
            String rk = key();
            Idem.Outcome r1 = idem.run(c, 1, "DEBIT", rk, "{\"account\": 9101, \"amount\": 10}", "debit_handler(jsonb)", null);
            Idem.Outcome r2 = idem.run(c, 1, "DEBIT", rk, "{\"account\": 9101, \"amount\": 10}", "debit_handler(jsonb)", null);
            c.commit();
            check("run executes once and replays", !r1.replayed() && r2.replayed() && r1.body().equals(r2.body())
                && r1.expiresAt().equals(r2.expiresAt()), r2);

            // a long flow: submit, lease, fail, takeover, a stale complete is LeaseLost
            c.setAutoCommit(true);
            String op = "SHIP_" + UUID.randomUUID().toString().substring(0, 8);
            String tk = key();
            Idem.Submission s = idem.submit(c, 1, op, tk, "{\"order\": 7}", "{\"priority\": \"high\"}", null);
            TaskWorker.Task t1 = new TaskWorker(idem, op, "w1", Duration.ofSeconds(30), false).lease(c, 10).get(0);
            String failed = t1.fail(c, "{\"carrier\": \"timeout\"}", true);
            c.createStatement().execute("UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 second' WHERE id = "
                + t1.taskId());
            List<TaskWorker.Task> again2 = new TaskWorker(idem, op, "w2", Duration.ofSeconds(30), false).lease(c, 1);
            TaskWorker.Task t2 = again2.get(0);
            String stale;
            try {
                t1.complete(c, 201, "{\"tracking\": \"stale\"}", null);
                stale = "completed";
            } catch (IdemException.LeaseLost e) {
                stale = "LeaseLost";
            }
            t2.heartbeat(c, null);
            t2.complete(c, 201, "{\"tracking\": \"JD0123\"}", 7L);
            Idem.Submission done = idem.submit(c, 1, op, tk, "{\"order\": 7}", null, null);
            check("submit, lease, fail, takeover with a greater token; the stale complete is LeaseLost; the state replays",
                s.status().equals("PROCESSING") && failed.equals("FAILED_RETRYABLE") && t2.token() > t1.token()
                    && stale.equals("LeaseLost") && done.replayed() && done.status().equals("SUCCEEDED")
                    && done.body().equals("{\"tracking\": \"JD0123\"}"), done);

            // an uncertain outcome: never leased plainly again, reconciled with its attempts
            String pay = "PAY_" + UUID.randomUUID().toString().substring(0, 8);
            c.createStatement().execute("SELECT public.idem_set_policy('" + pay + "', uncertain => 'reconcile')");
            String pk = key();
            idem.submit(c, 1, pay, pk, "{\"amount\": 500}", null, null);
            TaskWorker payWorker = new TaskWorker(idem, pay, "w1", Duration.ofSeconds(30), false);
            TaskWorker.Task p1 = payWorker.lease(c, 1).get(0);
            String marked = p1.failUnknown(c, "{\"provider\": \"timeout\"}");
            int plainAgain = payWorker.lease(c, 10).size();
            Idem.Submission pending = idem.submit(c, 1, pay, pk, "{\"amount\": 500}", null, null);
            List<TaskWorker.ReconcileTask> rec = payWorker.leaseReconcile(c, 1);
            String notCharged = rec.get(0).notCharged(c);
            c.createStatement().execute("SELECT public.idem_drop_policy('" + pay + "')");
            check("an unknown outcome is marked, leased only to reconcile with its attempts, then not charged",
                marked.equals("PROCESSING") && plainAgain == 0 && pending.httpStatus() == 202 && pending.reconciling()
                    && rec.size() == 1 && rec.get(0).task().token() > p1.token()
                    && rec.get(0).attemptsJson().contains("\"outcome\": \"unknown\"")
                    && notCharged.equals("FAILED_RETRYABLE"), rec);

            // an operator: settles the uncertain task, cancels another (its holder fenced), IK008 after
            String ops = "OPS_" + UUID.randomUUID().toString().substring(0, 8);
            c.createStatement().execute("SELECT public.idem_set_policy('" + ops + "', uncertain => 'reconcile')");
            Operator operator = new Operator(idem);
            idem.submit(c, 1, ops, key(), "{\"amount\": 1}", null, null);
            TaskWorker.Task o1 = new TaskWorker(idem, ops, "w1", Duration.ofSeconds(30), false).lease(c, 1).get(0);
            o1.failUnknown(c, "{\"provider\": \"timeout\"}");
            String settled = operator.settleTask(c, o1.taskId(), true, "found at the provider", 201, "{\"charge\": \"ch_1\"}", null);
            String conflict;
            try {
                operator.cancelTask(c, o1.taskId(), "too late");
                conflict = "cancelled";
            } catch (IdemException.TaskStateConflict e) {
                conflict = "TaskStateConflict " + e.httpStatus();
            }
            c.createStatement().execute("SELECT public.idem_drop_policy('" + ops + "')");
            check("an operator settles an uncertain task; cancelling it then is TaskStateConflict (409)",
                settled.equals("SUCCEEDED") && conflict.equals("TaskStateConflict 409"), conflict);

            // outbox and inbox
            c.setAutoCommit(false);
            long id = idem.emit(c, "java-topic", "{\"order\": 1}", "order-1", Map.of("kind", "created"));
            c.commit();
            String consumer = "billing-" + UUID.randomUUID().toString().substring(0, 6);
            boolean once = idem.consume(c, consumer, "java-topic-" + id, null);
            c.commit();
            boolean twice = idem.consume(c, consumer, "java-topic-" + id, null);
            c.commit();
            check("emit, then consume true once and false for the redelivery", id > 0 && once && !twice, once + " " + twice);
            // an owner's entry (1.11): idem_forget_owner removes it
            long owner = 900000 + id % 1000;
            boolean owned = idem.consume(c, consumer, "java-topic-" + id + "-owned", null, owner);
            c.commit();
            long before = count(c, "SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = " + owner);
            try (Statement st = c.createStatement()) {
                st.execute("SELECT public.idem_forget_owner(" + owner + "::pg_catalog.int8)");
            }
            c.commit();
            long after = count(c, "SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = " + owner);
            c.commit();
            check("consume with an owner: idem_forget_owner removes its entry", owned && before == 1 && after == 0,
                owned + " " + before + " " + after);
        }

        // without server-side prepares (a transaction pooler): none made, where pgjdbc's default makes some
        long off = prepared(new Idem().withoutServerPrepare(), superuser);
        long on = prepared(idem, superuser);
        check("withoutServerPrepare() never prepares on the server; the default does after 5 uses",
            off == 0 && on > 0, off + " / " + on);
        setup(idem, superuser);
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement st = c.createStatement()) {
            st.execute(sql);
        }
    }

    /** A database not set up for idem: a role without its grants, an ambiguous overload, a wrong schema. */
    static void setup(Idem idem, String superuser) throws SQLException {
        try (Connection su = connect(superuser, null)) {
            String schema;
            try (ResultSet rs = su.createStatement().executeQuery(
                "SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idem'")) {
                rs.next();
                schema = rs.getString(1);
            }
            String role = "idem_java_" + UUID.randomUUID().toString().substring(0, 8);
            exec(su, "CREATE ROLE " + role + " LOGIN");
            try {
                Idem.AppGrants before;
                try (Connection r = connect(role, null)) {
                    before = idem.appGrants(r);
                }
                exec(su, "SELECT count(*) FROM public.idem_grant('" + role + "'::pg_catalog.regrole, 'app'::pg_catalog.text)");
                Idem.AppGrants after;
                try (Connection r = connect(role, null)) {
                    after = idem.appGrants(r);
                }
                check("appGrants: a role without idem's grants is told so, and with them not",
                    !before.granted() && before.role().equals(role) && after.granted(), before + " " + after);
            } finally {
                exec(su, "DROP OWNED BY " + role);
                exec(su, "DROP ROLE " + role);
            }
            exec(su, "CREATE FUNCTION " + schema + ".idem_begin(bigint, text, text, jsonb, interval DEFAULT NULL,"
                + " extra int DEFAULT 0) RETURNS boolean LANGUAGE sql AS 'SELECT false'");
            String ambiguous;
            su.setAutoCommit(false);
            try {
                idem.begin(su, 1, "DEBIT", key(), "{}", null);
                ambiguous = "no error";
            } catch (IdemException.Misconfigured e) {
                ambiguous = e.getMessage();
            } catch (SQLException e) {
                ambiguous = "not Misconfigured: " + e;
            } finally {
                su.rollback();
                su.setAutoCommit(true);
                exec(su, "DROP FUNCTION " + schema + ".idem_begin(bigint, text, text, jsonb, interval, int)");
            }
            check("an overload making idem_begin ambiguous is Misconfigured, naming the function",
                ambiguous.contains("idem_begin") && ambiguous.contains("not unique"), ambiguous);
            su.setAutoCommit(false);
            String wrong = stateOf(su, () -> idem.withSchema("no_such_schema").begin(su, 1, "DEBIT", key(), "{}", null));
            String right = stateOf(su, () -> idem.withSchema(schema).begin(su, 1, "DEBIT", key(), "{}", null));
            check("withSchema names idem's schema in every statement", wrong.equals("Misconfigured 3F000")
                && right.equals("no error"), wrong + " / " + right);
        }
    }

    static long prepared(Idem idem, String user) throws SQLException {
        try (Connection c = connect(user, null)) {
            c.setAutoCommit(false);
            for (int i = 0; i < 8; i++) {
                String k = key();
                idem.begin(c, 1, "DEBIT", k, "{}", null);
                idem.finish(c, 1, "DEBIT", k, 201, "{}", null, null);
                c.commit();
            }
            try (ResultSet rs = c.createStatement().executeQuery("SELECT count(*) FROM pg_prepared_statements WHERE statement ~ 'idem_'")) {
                rs.next();
                return rs.getLong(1);
            }
        }
    }
}
