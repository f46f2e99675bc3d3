// The article's HTTP API on idem, in Java: the JDK's HTTP server and pgjdbc
// (Debian: libpostgresql-jdbc-java), with a small connection pool.
//
//   POST /api/orders                Idempotency-Key, X-Owner-Id; {"skuId": 1, "quantity": 2}
//   POST /api/accounts/{id}/debit   Idempotency-Key, X-Owner-Id; {"amount": 100}
//
// X-Owner-Id stands in for real authentication: a real service takes the
// owner from its session or token, never from what the client says.
//
// Environment: PORT (8080), PGHOST (a host, or a socket directory), PGPORT,
// PGUSER, PGDATABASE, IDEM_PG_OPTIONS (e.g. "-c default_transaction_read_only=on"),
// IDEM_CONFLICT_STATUS (409, or 422 as the IETF draft has it), IDEM_POOL_SIZE (8).
import com.sun.net.httpserver.HttpExchange;
import com.sun.net.httpserver.HttpServer;
import java.io.IOException;
import java.io.OutputStream;
import java.net.InetSocketAddress;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.DriverManager;
import java.sql.PreparedStatement;
import java.sql.ResultSet;
import java.sql.SQLException;
import java.util.LinkedHashMap;
import java.util.Map;
import java.util.Properties;
import java.util.concurrent.ArrayBlockingQueue;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.Executors;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

public final class IdemServer {
    private static final Pattern DEBIT = Pattern.compile("^/api/accounts/(\\d{1,18})/debit$");
    private static final Pattern OWNER = Pattern.compile("^-?\\d{1,18}$");
    private static final Pattern INT_FIELD = Pattern.compile("\"%s\"\\s*:\\s*(-?\\d{1,18})(?=\\s*[,}])");
    private static final Pattern NUM_FIELD = Pattern.compile("\"amount\"\\s*:\\s*(-?\\d+(\\.\\d+)?([eE][-+]?\\d+)?)(?=\\s*[,}])");
    private static final int CONFLICT_STATUS = Integer.parseInt(env("IDEM_CONFLICT_STATUS", "409"));

    /** An answer other than the operation's own. */
    static final class ApiError extends Exception {
        final int status;
        final Map<String, String> headers = new LinkedHashMap<>();

        ApiError(int status, String message) {
            super(message);
            this.status = status;
        }

        ApiError header(String name, String value) {
            headers.put(name, value);
            return this;
        }
    }

    /** What an endpoint answers. */
    record Answer(int status, String body, Map<String, String> headers, boolean replayed) {}

    /** A fixed set of connections, each lent to one request at a time. */
    static final class Pool {
        private final BlockingQueue<Connection> idle;
        private final String url;
        private final Properties props;

        Pool(int size) throws SQLException {
            String host = env("PGHOST", "localhost");
            props = new Properties();
            props.setProperty("user", env("PGUSER", System.getProperty("user.name")));
            if (System.getenv("PGPASSWORD") != null) props.setProperty("password", System.getenv("PGPASSWORD"));
            if (System.getenv("IDEM_PG_OPTIONS") != null) props.setProperty("options", System.getenv("IDEM_PG_OPTIONS"));
            String db = env("PGDATABASE", props.getProperty("user"));
            String port = env("PGPORT", "5432");
            if (host.startsWith("/")) {
                // a Unix socket directory: pgjdbc reaches it through junixsocket, which
                // Debian does not ship; the examples' test gives a TCP host instead
                throw new SQLException("PGHOST must be a TCP host for the Java example");
            }
            url = "jdbc:postgresql://" + host + ":" + port + "/" + db;
            idle = new ArrayBlockingQueue<>(size);
            for (int i = 0; i < size; i++) idle.add(open());
        }

        private Connection open() throws SQLException {
            Connection c = DriverManager.getConnection(url, props);
            c.setAutoCommit(false);
            return c;
        }

        Connection take() throws InterruptedException { return idle.take(); }

        void give(Connection c) {
            try {
                if (c.isClosed()) c = open();
            } catch (SQLException e) {
                System.err.println("reconnect failed: " + e.getMessage());
                return;
            }
            idle.add(c);
        }
    }

    private static Pool pool;

    static String env(String name, String dflt) {
        String v = System.getenv(name);
        return v == null || v.isEmpty() ? dflt : v;
    }

    static String json(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            if (ch == '"' || ch == '\\') b.append('\\').append(ch);
            else if (ch < 0x20) b.append(String.format("\\u%04x", (int) ch));
            else b.append(ch);
        }
        return b.append('"').toString();
    }

    static String errorBody(String message) {
        return "{\"error\": " + json(message) + "}";
    }

    /** The HTTP answer to a database error (never its text beyond the message). */
    static ApiError errorOf(SQLException e) {
        String state = e.getSQLState() == null ? "" : e.getSQLState();
        switch (state) {
            case "IK001": return new ApiError(CONFLICT_STATUS, "idempotency key reused with a different request");
            case "IK002": return new ApiError(409, "a request with this idempotency key is in progress").header("Retry-After", "1");
            case "22023": case "22004": case "22003": {
                String msg = e instanceof org.postgresql.util.PSQLException p && p.getServerErrorMessage() != null
                        ? p.getServerErrorMessage().getMessage() : "invalid request";
                return new ApiError(400, msg);
            }
            case "42501": return new ApiError(403, "not allowed");
            case "25006": return new ApiError(503, "the service is read-only for now").header("Retry-After", "5");
            default:
                System.err.println("database error " + state + ": " + e.getMessage());
                return new ApiError(500, "internal error");
        }
    }

    interface Statement { Answer run(PreparedStatement ps) throws SQLException; }

    /** One statement in a transaction of its own, per request. */
    static Answer call(String sql, Object[] params, Statement reader) throws ApiError, InterruptedException {
        Connection c = pool.take();
        try (PreparedStatement ps = c.prepareStatement(sql)) {
            for (int i = 0; i < params.length; i++) ps.setObject(i + 1, params[i]);
            Answer a = reader.run(ps);
            c.commit();
            return a;
        } catch (SQLException e) {
            try { c.rollback(); } catch (SQLException ignored) { }
            throw errorOf(e);
        } finally {
            pool.give(c);
        }
    }

    static long intField(String body, String name) throws ApiError {
        Matcher m = Pattern.compile(String.format(INT_FIELD.pattern(), name)).matcher(body);
        if (!m.find()) throw new ApiError(400, "skuId and quantity must be integers");
        return Long.parseLong(m.group(1));
    }

    static Answer createOrder(long owner, String key, String body) throws ApiError, InterruptedException {
        long sku = intField(body, "skuId");
        long qty = intField(body, "quantity");
        if (qty > Integer.MAX_VALUE || qty < Integer.MIN_VALUE) throw new ApiError(400, "quantity is out of range");
        return call("SELECT order_id, order_no, status, http_status, replayed FROM idem_create_order(?, ?, ?, ?)",
                new Object[] {owner, key, sku, (int) qty}, ps -> {
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        long id = rs.getLong(1);
                        // the stored response's columns, always in this order: the same bytes on a replay
                        String out = "{\"orderId\": " + id + ", \"orderNo\": " + json(rs.getString(2))
                                + ", \"status\": " + json(rs.getString(3)) + "}";
                        return new Answer(rs.getInt(4), out, Map.of("Location", "/api/orders/" + id), rs.getBoolean(5));
                    }
                });
    }

    static Answer debit(long owner, String key, long account, String body) throws ApiError, InterruptedException {
        Matcher m = NUM_FIELD.matcher(body);
        if (!m.find()) throw new ApiError(400, "amount must be a number");
        String request = "{\"account\": " + account + ", \"amount\": " + m.group(1) + "}";
        return call("SELECT replayed, http_status, body::text, headers::text FROM idem_run(?, 'DEBIT', ?, ?::jsonb, 'debit_handler(jsonb)')",
                new Object[] {owner, key, request}, ps -> {
                    try (ResultSet rs = ps.executeQuery()) {
                        rs.next();
                        Map<String, String> headers = new LinkedHashMap<>();
                        String h = rs.getString(4);
                        if (h != null) {
                            // a JSON object of strings, as idem checked it
                            Matcher hm = Pattern.compile("\"((?:[^\"\\\\]|\\\\.)*)\"\\s*:\\s*\"((?:[^\"\\\\]|\\\\.)*)\"").matcher(h);
                            while (hm.find()) headers.put(hm.group(1), hm.group(2));
                        }
                        return new Answer(rs.getInt(2), rs.getString(3), headers, rs.getBoolean(1));
                    }
                });
    }

    static void send(HttpExchange ex, int status, String body, Map<String, String> headers, boolean replayed) throws IOException {
        byte[] data = body.getBytes(StandardCharsets.UTF_8);
        ex.getResponseHeaders().set("Content-Type", "application/json");
        headers.forEach((k, v) -> ex.getResponseHeaders().set(k, v));
        if (replayed) ex.getResponseHeaders().set("Idempotent-Replayed", "true");
        ex.sendResponseHeaders(status, data.length);
        try (OutputStream os = ex.getResponseBody()) {
            os.write(data);
        }
    }

    static Answer handle(HttpExchange ex) throws ApiError, IOException, InterruptedException {
        String path = ex.getRequestURI().getPath();
        Matcher debit = DEBIT.matcher(path);
        if (!"POST".equals(ex.getRequestMethod()) || (!path.equals("/api/orders") && !debit.matches()))
            throw new ApiError(404, "not found");
        String key = ex.getRequestHeaders().getFirst("Idempotency-Key");
        if (key == null || key.isEmpty()) throw new ApiError(400, "the Idempotency-Key header is required");
        String ownerText = ex.getRequestHeaders().getFirst("X-Owner-Id");
        if (ownerText == null || !OWNER.matcher(ownerText).matches())
            throw new ApiError(400, "the X-Owner-Id header must be an integer");
        String body = new String(ex.getRequestBody().readAllBytes(), StandardCharsets.UTF_8).trim();
        if (!body.startsWith("{") || !body.endsWith("}")) throw new ApiError(400, "the body must be a JSON object");
        long owner = Long.parseLong(ownerText);
        return debit.matches() ? debit(owner, key, Long.parseLong(debit.group(1)), body) : createOrder(owner, key, body);
    }

    public static void main(String[] args) throws Exception {
        pool = new Pool(Integer.parseInt(env("IDEM_POOL_SIZE", "8")));
        int port = Integer.parseInt(env("PORT", "8080"));
        HttpServer server = HttpServer.create(new InetSocketAddress("127.0.0.1", port), 64);
        server.createContext("/", ex -> {
            try {
                Answer a = handle(ex);
                send(ex, a.status(), a.body(), a.headers(), a.replayed());
            } catch (ApiError e) {
                send(ex, e.status, errorBody(e.getMessage()), e.headers, false);
            } catch (Exception e) {
                System.err.println("request failed: " + e); // never a stack trace in a response
                send(ex, 500, errorBody("internal error"), Map.of(), false);
            }
        });
        server.setExecutor(Executors.newFixedThreadPool(32));
        server.start();
        System.out.println("listening on 127.0.0.1:" + port);
    }
}
