// The Java library (its jar) against the SQL edition: the wait for an
// in-flight original ends in 55P03 from the claim, which the library raises
// as InFlight (IK002); an application's own lock timeout stays 55P03.
// Prints "ok - ..." / "not ok - ..." lines.
//
//   java -cp IDEM_PG_JAR:PGJDBC_JAR Libraries.java JDBC_URL
import idem.Idem;
import idem.IdemException;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.SQLException;
import java.sql.Statement;

public class Libraries {
    static void check(String name, boolean ok, Object got) {
        System.out.println((ok ? "ok - " : "not ok - ") + name + (ok ? "" : " (got " + got + ")"));
    }

    static void exec(Connection c, String sql) throws SQLException {
        try (Statement s = c.createStatement()) {
            s.execute(sql);
        }
    }

    public static void main(String[] args) throws Exception {
        Idem idem = new Idem().withSchema("idem");
        String key = "java-key-00000000001";
        try (Connection first = DriverManager.getConnection(args[0]);
             Connection second = DriverManager.getConnection(args[0])) {
            first.setAutoCommit(false);
            second.setAutoCommit(false);
            Idem.Outcome out = idem.begin(first, 7, "PAY", key, "{\"amount\": 10}", null);
            check("java: the SQL edition claims a key through Idem.begin", !out.replayed(), out);
            exec(second, "SET LOCAL idem_sql.wait_timeout = 0");
            Object got = null;
            try {
                idem.begin(second, 7, "PAY", key, "{\"amount\": 10}", null);
            } catch (SQLException e) {
                got = e;
            }
            second.rollback();
            check("java: a duplicate of a claim in flight raises InFlight with SQLSTATE IK002 (55P03 from idem_sql_claim)",
                got instanceof IdemException.InFlight f && "IK002".equals(f.getSQLState()), got);
            idem.finish(first, 7, "PAY", key, 201, "{\"paid\": 10}", null, null);
            first.commit();
            out = idem.begin(second, 7, "PAY", key, "{\"amount\": 10}", null);
            second.commit();
            check("java: after the original's commit the duplicate replays it",
                out.replayed() && Integer.valueOf(201).equals(out.httpStatus()), out);

            exec(first, "CREATE TABLE IF NOT EXISTS public.lib_row_java (id int PRIMARY KEY)");
            exec(first, "INSERT INTO public.lib_row_java VALUES (1) ON CONFLICT DO NOTHING");
            first.commit();
            exec(first, "SELECT * FROM public.lib_row_java FOR UPDATE");
            got = null;
            try {
                exec(second, "SET LOCAL lock_timeout = '10ms'");
                exec(second, "UPDATE public.lib_row_java SET id = 1");
            } catch (SQLException e) {
                got = IdemException.of(e);
            }
            second.rollback();
            first.rollback();
            check("java: an application's own lock timeout stays 55P03, not InFlight",
                !(got instanceof IdemException.InFlight) && got instanceof SQLException s && "55P03".equals(s.getSQLState()), got);
        }
    }
}
