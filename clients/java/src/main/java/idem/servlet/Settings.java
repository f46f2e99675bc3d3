package idem.servlet;

import java.io.IOException;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Duration;
import java.util.ArrayList;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import javax.sql.DataSource;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The filter's settings (clients/CONTRACT.md), built fluently:
 *
 * <pre>
 * Settings s = new Settings(dataSource, req -> ownerOf(req))
 *     .route("POST", "/api/orders", "CREATE_ORDER")
 *     .route("POST", "/api/accounts/{id}/debit", "DEBIT",
 *            (body, params) -> "{\"account\": " + params.get("id") + ", \"body\": " + body + "}")
 *     .conflictStatus(409);
 * </pre>
 */
public final class Settings {
    /** The owner a request acts for (its authenticated user), or null: 401. */
    @FunctionalInterface
    public interface OwnerResolver {
        Long ownerOf(HttpServletRequest request) throws Exception;
    }

    /**
     * What of a request is fingerprinted, as JSON text: by default the whole body. Given the body
     * (JSON text, or "null" when empty) and the path template's parameters; PostgreSQL parses it.
     */
    @FunctionalInterface
    public interface RequestSelector {
        String select(String bodyJson, Map<String, String> params);
    }

    /**
     * The selector of some top-level fields of the body (the others do not count): the body must
     * be a JSON object; a field it lacks counts as null. PostgreSQL picks them.
     */
    public record Fields(List<String> names) implements RequestSelector {
        @Override
        public String select(String bodyJson, Map<String, String> params) {
            return bodyJson;                     // the filter selects the fields in its transaction
        }
    }

    /** Fingerprint only these top-level fields of the body. */
    public static RequestSelector fields(String... names) {
        return new Fields(List.of(names));
    }

    /** The operation of a request: its name, or null when the request is not idempotent (it runs without idem). */
    @FunctionalInterface
    public interface OperationResolver {
        String operationOf(HttpServletRequest request);
    }

    /** A route the contract applies to. */
    public record Route(String method, Pattern path, List<String> names, OperationResolver operation,
                        RequestSelector request, boolean keyRequired) {
    }

    /** A matched route and its path parameters. */
    public record Match(Route route, Map<String, String> params) {
    }

    /**
     * Which requests go through idem, by other means than {@link #route}: a framework's own
     * handler mapping (the Spring Boot starter reads {@code @Idempotent}). Returns null for a
     * request that runs without idem.
     */
    @FunctionalInterface
    public interface RouteMatcher {
        Match match(HttpServletRequest request);
    }

    /**
     * The transaction a claim, the servlet's work and the stored answer share. By default a
     * connection of the DataSource with auto-commit off; the Spring Boot starter opens one on the
     * application's {@code PlatformTransactionManager}, which its services then join.
     */
    @FunctionalInterface
    public interface Transactions {
        Transaction begin(HttpServletRequest request) throws SQLException;
    }

    /** One transaction: its connection; flushed before the answer is stored; committed or rolled back once. */
    public interface Transaction {
        Connection connection();

        /** Write what the servlet's work holds back (an ORM's session) before the answer is stored. */
        default void flush() throws SQLException {
        }

        void commit() throws SQLException;

        void rollback() throws SQLException;
    }

    /**
     * Told of each answer of an idempotent route (metrics): the operation, the status sent,
     * whether it was a replay, the problem's slug (null when the handler answered), the time taken.
     */
    @FunctionalInterface
    public interface Observer {
        void answered(String operation, int status, boolean replayed, String problem, long nanos);
    }

    /**
     * The body of the filter's own answers, an RFC 9457 problem (application/problem+json) of these
     * members: a framework's own problem type written by its own serializer (the Spring Boot
     * starters: Spring's ProblemDetail through the application's message converters).
     */
    @FunctionalInterface
    public interface ProblemBody {
        byte[] write(int status, String type, String title, String detail) throws IOException;
    }

    final OwnerResolver owner;
    final List<Route> routes = new ArrayList<>();
    RouteMatcher matcher;   // null: the routes
    Transactions transactions;
    Observer observer = (operation, status, replayed, problem, nanos) -> { };
    ProblemBody problemBody;    // null: the filter's own JSON
    int conflictStatus = 409;
    long maxBodyBytes = 1024 * 1024;
    Duration ttl;
    int inFlightRetryAfter = 1;
    int readOnlyRetryAfter = 5;
    boolean replaySetCookie;
    String errorsUrl;       // null: no Link
    boolean serverPrepare = true;

    /** The routes' transactions on connections of dataSource (null with {@link #transactions}). */
    public Settings(DataSource dataSource, OwnerResolver owner) {
        this.owner = owner;
        this.transactions = request -> {
            Connection c = dataSource.getConnection();
            c.setAutoCommit(false);
            return new Transaction() {
                @Override public Connection connection() { return c; }
                @Override public void commit() throws SQLException { end(c, true); }
                @Override public void rollback() throws SQLException { end(c, false); }
            };
        };
    }

    private static void end(Connection c, boolean commit) throws SQLException {
        try (c) {
            if (commit) {
                c.commit();
            } else {
                c.rollback();
            }
            c.setAutoCommit(true);
        }
    }

    /** Match requests by this instead of the routes. */
    public Settings matcher(RouteMatcher m) {
        matcher = m;
        return this;
    }

    /** Run each idempotent request in transactions of this kind. */
    public Settings transactions(Transactions t) {
        transactions = t;
        return this;
    }

    /** Tell this of each answer. */
    public Settings observer(Observer o) {
        observer = o;
        return this;
    }

    /** Write the filter's own answers' bodies with this. */
    public Settings problemBody(ProblemBody b) {
        problemBody = b;
        return this;
    }

    public Settings route(String method, String template, String operation) {
        return route(method, template, operation, null, true);
    }

    public Settings route(String method, String template, String operation, RequestSelector request) {
        return route(method, template, operation, request, true);
    }

    /** A route by method and path template ("/api/accounts/{id}/debit": {id} is one segment). */
    public Settings route(String method, String template, String operation, RequestSelector request,
                          boolean keyRequired) {
        return route(method, template, req -> operation, request, keyRequired);
    }

    /** A route whose operation is a function of the request. */
    public Settings route(String method, String template, OperationResolver operation, RequestSelector request,
                          boolean keyRequired) {
        List<String> names = new ArrayList<>();
        StringBuilder re = new StringBuilder("^");
        Matcher m = Pattern.compile("\\{(\\w+)\\}").matcher(template);
        int last = 0;
        while (m.find()) {
            re.append(Pattern.quote(template.substring(last, m.start()))).append("([^/]+)");
            names.add(m.group(1));
            last = m.end();
        }
        re.append(Pattern.quote(template.substring(last))).append("$");
        routes.add(new Route(method.toUpperCase(), Pattern.compile(re.toString()), names, operation, request,
            keyRequired));
        return this;
    }

    /** 409 (the article) or 422 (the IETF draft) for a key reused with another request. */
    public Settings conflictStatus(int status) {
        if (status != 409 && status != 422) {
            throw new IllegalArgumentException("conflictStatus must be 409 or 422");
        }
        conflictStatus = status;
        return this;
    }

    public Settings maxBodyBytes(long bytes) {
        maxBodyBytes = bytes;
        return this;
    }

    public Settings ttl(Duration t) {
        ttl = t;
        return this;
    }

    public Settings retryAfter(int inFlightSeconds, int readOnlySeconds) {
        inFlightRetryAfter = inFlightSeconds;
        readOnlyRetryAfter = readOnlySeconds;
        return this;
    }

    public Settings replaySetCookie(boolean allow) {
        replaySetCookie = allow;
        return this;
    }

    /** An absolute http(s) URL of docs/http-errors.md's copy: the Link of an error points there; null: no Link. */
    public Settings errorsUrl(String url) {
        if (url != null && !url.matches("^https?://[^/\\s]+.*")) {
            throw new IllegalArgumentException("errorsUrl must be an absolute http(s) URL (or null: no Link)");
        }
        errorsUrl = url;
        return this;
    }

    /** false behind a transaction pooler (PgBouncer): idem's statements are never server-prepared. */
    public Settings serverPrepare(boolean prepare) {
        serverPrepare = prepare;
        return this;
    }

    Match match(HttpServletRequest request) {
        if (matcher != null) {
            return matcher.match(request);
        }
        return match(request.getMethod(), request.getRequestURI().substring(request.getContextPath().length()));
    }

    Match match(String method, String path) {
        for (Route r : routes) {
            Matcher m = r.path().matcher(path);
            if (r.method().equalsIgnoreCase(method) && m.matches()) {
                Map<String, String> params = new LinkedHashMap<>();
                for (int i = 0; i < r.names().size(); i++) {
                    params.put(r.names().get(i), m.group(i + 1));
                }
                return new Match(r, params);
            }
        }
        return null;
    }

    /** What the route's servlet gets, as the request attribute {@link IdempotencyFilter#CONTEXT}. */
    public static final class Context {
        public final Connection connection;
        public final long owner;
        public final String operation;
        public final String key;
        public final Map<String, String> params;
        Long resourceId;

        Context(Connection connection, long owner, String operation, String key, Map<String, String> params) {
            this.connection = connection;
            this.owner = owner;
            this.operation = operation;
            this.key = key;
            this.params = params;
        }

        /** The resource the request made, stored with the record. */
        public void resourceId(long id) {
            resourceId = id;
        }
    }
}
