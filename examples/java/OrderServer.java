import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;

import org.apache.catalina.Context;
import org.apache.catalina.startup.Tomcat;
import org.apache.tomcat.util.descriptor.web.FilterDef;
import org.apache.tomcat.util.descriptor.web.FilterMap;
import org.postgresql.ds.PGSimpleDataSource;

import idem.servlet.IdempotencyFilter;
import idem.servlet.Settings;
import idem.servlet.TomcatProblemValve;
import jakarta.servlet.http.Cookie;
import jakarta.servlet.http.HttpServlet;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;

/**
 * The article's HTTP API in embedded Tomcat 10.1, on idem's servlet filter.
 *
 *   POST /api/orders                 {"skuId": 1, "quantity": 2}
 *   POST /api/accounts/{id}/debit    {"amount": 100}
 *
 * Both need an Idempotency-Key and an X-Owner-Id header (a stand-in for real authentication).
 * Environment: PORT, PGHOST, PGPORT, PGDATABASE, PGUSER, IDEM_CONFLICT_STATUS (409 or 422),
 * IDEM_PG_OPTIONS, IDEM_SERVER_PREPARE=off (behind PgBouncer). JSON is read and written by
 * PostgreSQL: the example needs no JSON library.
 */
public final class OrderServer {
    /** Tomcat's HTTP parser's logger, held so that its level stays set (JUL keeps loggers weakly). */

    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }

    /** The order row of the request; null (after a 400) when the request is not a valid order. */
    static Long placeOrder(Connection c, long owner, String body, HttpServletResponse res)
        throws IOException, SQLException {
        try (PreparedStatement ps = c.prepareStatement(
            "WITH r AS (SELECT ?::jsonb AS j), ok AS (SELECT j FROM r WHERE jsonb_typeof(j->'skuId') = 'number'"
                + " AND jsonb_typeof(j->'quantity') = 'number' AND (j->>'quantity')::numeric BETWEEN 1 AND 100"
                + " AND (j->>'quantity')::numeric % 1 = 0 AND (j->>'skuId')::numeric % 1 = 0),"
                + " o AS (INSERT INTO shop_order (owner_id, sku_id, quantity)"
                + " SELECT ?, (j->>'skuId')::numeric::bigint, (j->>'quantity')::numeric::int FROM ok RETURNING *)"
                + " SELECT id, json_build_object('orderId', id, 'skuId', sku_id, 'quantity', quantity,"
                + " 'status', 'CREATED')::text FROM o")) {
            ps.setString(1, body);
            ps.setLong(2, owner);
            try (ResultSet rs = ps.executeQuery()) {
                if (!rs.next()) {
                    json(res, 400, "{\"error\": \"skuId must be an integer and quantity one from 1 to 100\"}");
                    return null;
                }
                res.setHeader("Location", "/api/orders/" + rs.getLong(1));
                json(res, 201, rs.getString(2));
                return rs.getLong(1);
            }
        }
    }

    /** POST /api/orders: the order row, in the claim's transaction. */
    static final class Orders extends HttpServlet {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
            Settings.Context idem = (Settings.Context) req.getAttribute(IdempotencyFilter.CONTEXT);
            String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            try {
                Long id = placeOrder(idem.connection, idem.owner, body, res);
                if (id != null) {
                    idem.resourceId(id);
                    res.addCookie(new Cookie("last_order", Long.toString(id)));   // not replayed
                }
            } catch (SQLException e) {
                throw new IOException(e);
            }
        }
    }

    /** POST /bare/orders (IDEM_BENCH=1): the same order without idem, test/bench/clients_bench.sh's baseline. */
    static final class Bare extends HttpServlet {
        private static final long serialVersionUID = 1L;
        private final transient javax.sql.DataSource ds;

        Bare(javax.sql.DataSource ds) {
            this.ds = ds;
        }

        @Override
        protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
            String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            try (Connection c = ds.getConnection()) {
                placeOrder(c, Long.parseLong(req.getHeader("X-Owner-Id")), body, res);
            } catch (SQLException e) {
                throw new IOException(e);
            }
        }
    }

    /** POST /api/accounts/{id}/debit: debit_account() of examples/schema.sql. */
    static final class Debits extends HttpServlet {
        private static final long serialVersionUID = 1L;

        @Override
        protected void doPost(HttpServletRequest req, HttpServletResponse res) throws IOException {
            Settings.Context idem = (Settings.Context) req.getAttribute(IdempotencyFilter.CONTEXT);
            String body = new String(req.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
            Connection c = idem.connection;
            try (PreparedStatement ps = c.prepareStatement("SELECT d.debit_id, json_build_object('debitId', d.debit_id,"
                + " 'balance', d.balance)::text FROM (SELECT ?::jsonb AS j) r, LATERAL debit_account(?, "
                + " CASE WHEN jsonb_typeof(j->'amount') = 'number' THEN (j->>'amount')::numeric END) d"
                + " WHERE jsonb_typeof(j->'amount') = 'number'")) {
                ps.setString(1, body);
                ps.setLong(2, Long.parseLong(idem.params.get("id")));
                try (ResultSet rs = ps.executeQuery()) {
                    if (!rs.next()) {
                        json(res, 400, "{\"error\": \"amount must be a number\"}");
                    } else if (rs.getObject(1) == null) {
                        json(res, 422, "{\"error\": \"insufficient funds\"}");
                    } else {
                        idem.resourceId(rs.getLong(1));
                        res.setHeader("Location", "/api/debits/" + rs.getLong(1));
                        json(res, 201, rs.getString(2));
                    }
                }
            } catch (SQLException e) {
                throw new IOException(e);
            }
        }
    }

    static void json(HttpServletResponse res, int status, String body) throws IOException {
        res.setStatus(status);
        res.setContentType("application/json");
        res.getOutputStream().write(body.getBytes(StandardCharsets.UTF_8));
    }

    public static void main(String[] args) throws Exception {
        PGSimpleDataSource ds = new PGSimpleDataSource();
        ds.setServerNames(new String[] {env("PGHOST", "127.0.0.1")});
        ds.setPortNumbers(new int[] {Integer.parseInt(env("PGPORT", "5432"))});
        ds.setDatabaseName(env("PGDATABASE", "postgres"));
        ds.setUser(env("PGUSER", System.getProperty("user.name")));
        ds.setOptions(env("IDEM_PG_OPTIONS", null));
        boolean prepare = !"off".equals(env("IDEM_SERVER_PREPARE", "on"));
        if (!prepare) {
            ds.setPrepareThreshold(0);              // the servlets' own statements too
        }
        Settings settings = new Settings(ds, req -> {
            String owner = req.getHeader("X-Owner-Id");
            return owner != null && owner.matches("\\d{1,18}") ? Long.valueOf(owner) : null;
        })
            .route("POST", "/api/orders", "CREATE_ORDER", Settings.fields("skuId", "quantity"))
            .route("POST", "/api/accounts/{id}/debit", "DEBIT",
                (body, params) -> "{\"account\": " + params.get("id") + ", \"body\": " + body + "}")
            .conflictStatus(Integer.parseInt(env("IDEM_CONFLICT_STATUS", "409")))
            .errorsUrl(System.getenv("IDEM_ERRORS_URL"))
            .serverPrepare(prepare);

        Tomcat tomcat = new Tomcat();
        // before anything asks for the host: it makes its base directory (./tomcat.8080 by default)
        tomcat.setBaseDir(System.getProperty("java.io.tmpdir") + "/idem-tomcat-" + env("PORT", "8080"));
        tomcat.setPort(Integer.parseInt(env("PORT", "8080")));
        // a request Tomcat's parser refuses (a control character in a header) is answered 400
        // problem+json, as the filter answers a bad request, not Tomcat's HTML report; its parser logs
        // warnings only (the line of a refused request quotes the header: keys are never logged)
        TomcatProblemValve.install(tomcat.getHost(), System.getenv("IDEM_ERRORS_URL"));
        tomcat.getConnector().setProperty("address", "127.0.0.1");
        Context ctx = tomcat.addContext("", null);
        Tomcat.addServlet(ctx, "orders", new Orders()).addMapping("/api/orders");
        Tomcat.addServlet(ctx, "debits", new Debits()).addMapping("/api/accounts/*");
        if (System.getenv("IDEM_BENCH") != null) {
            Tomcat.addServlet(ctx, "bare", new Bare(ds)).addMapping("/bare/orders");
        }
        FilterDef def = new FilterDef();
        def.setFilterName("idem");
        def.setFilter(new IdempotencyFilter(settings));
        ctx.addFilterDef(def);
        FilterMap map = new FilterMap();
        map.setFilterName("idem");
        map.addURLPattern("/api/*");
        ctx.addFilterMap(map);
        tomcat.start();
        tomcat.getServer().await();
    }
}
