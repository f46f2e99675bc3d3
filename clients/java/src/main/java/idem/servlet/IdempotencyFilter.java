package idem.servlet;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.InputStream;
import java.nio.charset.StandardCharsets;
import java.sql.Connection;
import java.sql.SQLException;
import java.time.Instant;
import java.time.ZoneOffset;
import java.time.format.DateTimeFormatter;
import java.util.ArrayList;
import java.util.Collections;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Locale;
import java.util.Map;
import java.util.Set;
import java.util.logging.Level;
import java.util.logging.Logger;
import java.util.regex.Matcher;
import java.util.regex.Pattern;

import idem.Idem;
import idem.IdemException;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;

/**
 * The HTTP contract (clients/CONTRACT.md) as a {@code jakarta.servlet.Filter}: Tomcat 10.1,
 * Jetty 11+, Spring Boot 3. The routes of {@link Settings} go through idem; the servlet gets
 * the claim's connection (its transaction) as the request attribute {@link #CONTEXT}, and its
 * answer is held until the transaction committed.
 */
public final class IdempotencyFilter implements Filter {
    /** The request attribute holding the {@link Settings.Context} of the claim. */
    public static final String CONTEXT = "idem.context";
    /**
     * A request attribute a framework sets when the handler threw, even if the framework then
     * answered for it (a Spring {@code @ControllerAdvice}'s 4xx): the transaction rolls back,
     * nothing is stored, and that answer is sent as it is.
     */
    public static final String FAILED = "idem.failed";
    private static final String OPERATION = "idem.operation";

    private static final Logger LOG = Logger.getLogger("idem");
    private static final Pattern KEY = Pattern.compile("^[A-Za-z0-9_-]{16,128}$");
    private static final Pattern SF_STRING = Pattern.compile("^\"((?:[\\x20\\x21\\x23-\\x5b\\x5d-\\x7e]|\\\\[\"\\\\])*)\"$");
    private static final Set<String> NOT_STORED = Set.of("connection", "keep-alive", "proxy-authenticate",
        "proxy-authorization", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "date",
        "content-length", "server", "idempotent-replayed", "idempotency-expires");
    private static final DateTimeFormatter HTTP_DATE =
        DateTimeFormatter.ofPattern("EEE, dd MMM yyyy HH:mm:ss 'GMT'", Locale.US).withZone(ZoneOffset.UTC);
    private static final Map<String, String> TITLES = Map.ofEntries(
        Map.entry("key-missing", "Idempotency-Key header required"),
        Map.entry("key-malformed", "Malformed Idempotency-Key header"),
        Map.entry("key-reused", "Idempotency key reused with a different request"),
        Map.entry("key-expired", "Idempotency key expired"),
        Map.entry("in-flight", "A request with this idempotency key is in progress"),
        Map.entry("read-only", "The service is read-only for now"),
        Map.entry("forbidden", "Not allowed"),
        Map.entry("no-owner", "No authenticated owner"),
        Map.entry("body-too-large", "Request body too large"),
        Map.entry("body-not-json", "Request body is not valid JSON"),
        Map.entry("invalid-request", "Invalid request"),
        Map.entry("retry", "The request raced another; retry it"),
        Map.entry("internal", "The request could not be completed"));

    private final Settings settings;
    private final Idem idem;

    public IdempotencyFilter(Settings settings) {
        this.settings = settings;
        this.idem = settings.serverPrepare ? new Idem() : new Idem().withoutServerPrepare();
    }

    /** An answer of the filter itself: RFC 9457 problem+json. */
    static final class Problem extends Exception {
        private static final long serialVersionUID = 1L;
        final int status;
        final String slug;
        final Map<String, String> headers = new LinkedHashMap<>();

        Problem(int status, String slug, String detail) {
            super(detail);
            this.status = status;
            this.slug = slug;
        }

        Problem with(String name, String value) {
            headers.put(name, value);
            return this;
        }
    }

    /** What is sent: status, headers (lower-case names, each with its values), body. */
    record Answer(int status, Map<String, List<String>> headers, byte[] body) {
    }

    @Override
    public void doFilter(ServletRequest req, ServletResponse res, FilterChain chain) throws IOException, ServletException {
        HttpServletRequest request = (HttpServletRequest) req;
        HttpServletResponse response = (HttpServletResponse) res;
        Settings.Match match = settings.match(request);
        String operation = match == null ? null : match.route().operation().operationOf(request);
        if (operation == null) {
            chain.doFilter(req, res);
            return;
        }
        long started = System.nanoTime();
        request.setAttribute(OPERATION, operation);
        Answer answer;
        String problem = null;          // the slug of the filter's own answer
        try {
            String key = parseKey(Collections.list(request.getHeaders("Idempotency-Key")));
            if (key == null) {
                if (match.route().keyRequired()) {
                    throw new Problem(400, "key-missing", "this request needs an Idempotency-Key header");
                }
                chain.doFilter(req, res);
                return;
            }
            answer = handle(request, response, chain, match, key);
        } catch (Problem p) {
            answer = problem(p);
            problem = p.slug;
        }
        send(response, answer);
        settings.observer.answered(operation, answer.status(),
            answer.headers().getOrDefault("idempotent-replayed", List.of("false")).get(0).equals("true"),
            problem, System.nanoTime() - started);
    }

    /** The handler threw (see {@link #FAILED}): its answer is sent, nothing stored. */
    private static final class Discarded extends Exception {
        private static final long serialVersionUID = 1L;
        final transient Answer answer;

        Discarded(Answer answer) {
            super(null, null, false, false);
            this.answer = answer;
        }
    }

    private Answer handle(HttpServletRequest request, HttpServletResponse response, FilterChain chain,
                          Settings.Match match, String key) throws Problem {
        if (request.getContentLengthLong() > settings.maxBodyBytes) {
            throw new Problem(413, "body-too-large", "the request body is over " + settings.maxBodyBytes + " bytes");
        }
        byte[] raw = readBody(request);
        Long owner;
        try {
            owner = settings.owner.ownerOf(request);
        } catch (Exception e) {
            owner = null;
        }
        if (owner == null) {
            throw new Problem(401, "no-owner", "the request has no authenticated owner");
        }
        String body = raw.length == 0 ? "null" : utf8(raw);
        String fingerprinted = match.route().request() == null ? body
            : match.route().request().select(body, match.params());
        try {
            Settings.Transaction tx = settings.transactions.begin(request);
            Answer a;
            try {
                a = execute(tx, request, response, chain, match, key, owner, fingerprinted, raw);
            } catch (Discarded d) {
                tx.rollback();
                return d.answer;
            } catch (Problem | RuntimeException | SQLException | IOException | ServletException e) {
                tx.rollback();
                throw e;
            }
            tx.commit();
            return a;
        } catch (IdemException.Forbidden e) {
            SQLException why = e;
            try {
                why = notGranted(request).orElse(e);
            } catch (SQLException asking) {
                e.addSuppressed(asking);
            }
            throw problemOf(why, true);
        } catch (SQLException e) {
            throw problemOf(e, true);
        } catch (IOException | ServletException | RuntimeException e) {
            // of the handler's own errors, a read-only server and a serialization failure have answers of their own
            for (Throwable t = e; t != null; t = t.getCause()) {
                if (t instanceof SQLException sql && ("25006".equals(sql.getSQLState())
                    || "40001".equals(sql.getSQLState()))) {
                    throw problemOf(IdemException.of(sql), false);
                }
            }
            LOG.log(Level.SEVERE, "idem: the handler of operation " + request.getAttribute(OPERATION) + " failed", e);
            throw new Problem(500, "internal", "the request could not be completed");
        }
    }

    private static final java.util.concurrent.atomic.AtomicBoolean MISSING_GRANT_LOGGED =
        new java.util.concurrent.atomic.AtomicBoolean();

    /**
     * After a 42501: the role lacks idem's grants (the server's setup: a 500, logged once per
     * process), or not (the owner binding's 403 stands).
     */
    private java.util.Optional<SQLException> notGranted(HttpServletRequest request) throws SQLException {
        Settings.Transaction tx = settings.transactions.begin(request);
        Idem.AppGrants g;
        try {
            g = idem.appGrants(tx.connection());
        } finally {
            tx.rollback();
        }
        if (g.granted()) {
            return java.util.Optional.empty();
        }
        String message = "role " + g.role() + " may not call idem's functions: a superuser runs SELECT idem_grant('"
            + g.role() + "', 'app')";
        if (MISSING_GRANT_LOGGED.compareAndSet(false, true)) {
            LOG.severe("idem: " + message);
        }
        return java.util.Optional.of(new IdemException.Misconfigured(message, "42501", null));
    }

    private Answer execute(Settings.Transaction tx, HttpServletRequest request, HttpServletResponse response,
                           FilterChain chain, Settings.Match match, String key, long owner, String fingerprinted,
                           byte[] raw) throws Problem, Discarded, SQLException, IOException, ServletException {
        Connection c = tx.connection();
        String operation = (String) request.getAttribute(OPERATION);
        Idem.Outcome o;
        try {
            if (match.route().request() instanceof Settings.Fields f) {
                fingerprinted = selectFields(c, fingerprinted, f.names());
            }
            o = idem.begin(c, owner, operation, key, fingerprinted, settings.ttl);
        } catch (IdemException.InvalidRequest e) {
            if ("22P02".equals(e.getSQLState())) {
                throw new Problem(400, "body-not-json", "the request body must be JSON");
            }
            throw e;
        }
        if (o.replayed()) {
            Map<String, List<String>> h = replayedHeaders(o.headers());
            return finished(o.expiresAt(), true, o.httpStatus(), h,
                o.body() == null ? new byte[0] : o.body().getBytes(StandardCharsets.UTF_8));
        }
        Settings.Context ctx = new Settings.Context(c, owner, operation, key, match.params());
        request.setAttribute(CONTEXT, ctx);
        Capture.Response captured = new Capture.Response(response);
        chain.doFilter(new Capture.Request(request, raw), captured);
        int status = captured.status;
        byte[] out = captured.bytes();
        if (request.getAttribute(FAILED) != null) {
            throw new Discarded(finished(null, false, status, captured.headers, out));
        }
        if (status < 200 || status > 499) {
            Problem p = new Problem(status >= 500 && status <= 599 ? status : 500, "internal",
                "the request could not be completed; nothing was done: retry it");
            if (captured.headers.containsKey("retry-after")) {
                p.with("retry-after", captured.headers.get("retry-after").get(0));
            }
            throw p;
        }
        tx.flush();
        try {
            idem.finish(c, owner, operation, key, status, out.length == 0 ? null : new String(out, StandardCharsets.UTF_8),
                ctx.resourceId, stored(captured.headers));
        } catch (IdemException.InvalidRequest e) {
            LOG.severe("idem: the handler of operation " + operation + " answered a body that is not JSON: not stored");
            throw new Problem(500, "internal", "the request could not be completed");
        }
        Instant expires = o.expiresAt();
        if (status >= 400) {                       // a 4xx expires after the failure ttl: read what was stored
            expires = idem.begin(c, owner, operation, key, fingerprinted, settings.ttl).expiresAt();
        }
        return finished(expires, false, status, captured.headers, out);
    }

    /** The fields of a JSON object, picked by PostgreSQL (22P02 for a body that is not JSON). */
    private String selectFields(Connection c, String body, List<String> names) throws SQLException, Problem {
        try (java.sql.PreparedStatement ps = idem.serverPrepare() ? c.prepareStatement(FIELDS)
            : prepareOnce(c, FIELDS)) {
            ps.setArray(1, c.createArrayOf("text", names.toArray()));
            ps.setString(2, body);
            try (java.sql.ResultSet rs = ps.executeQuery()) {
                rs.next();
                if (!rs.getBoolean(1)) {
                    throw new Problem(400, "invalid-request", "the body must be a JSON object");
                }
                return rs.getString(2);
            }
        } catch (SQLException e) {
            throw IdemException.of(e);
        }
    }

    private static final String FIELDS = "SELECT pg_catalog.jsonb_typeof(j) OPERATOR(pg_catalog.=) 'object', "
        + "(SELECT pg_catalog.jsonb_object_agg(f, j OPERATOR(pg_catalog.->) f)"
        + " FROM pg_catalog.unnest(?::pg_catalog.text[]) AS f)::pg_catalog.text FROM (SELECT ?::pg_catalog.jsonb AS j) r";

    private static java.sql.PreparedStatement prepareOnce(Connection c, String sql) throws SQLException {
        java.sql.PreparedStatement ps = c.prepareStatement(sql);
        ps.unwrap(org.postgresql.PGStatement.class).setPrepareThreshold(0);
        return ps;
    }

    /** The headers kept with the record: one string per name (Set-Cookie lines by a newline, if allowed). */
    private Map<String, String> stored(Map<String, List<String>> headers) {
        Set<String> named = new java.util.HashSet<>();
        for (String v : headers.getOrDefault("connection", List.of())) {
            for (String n : v.split(",")) {
                named.add(n.trim().toLowerCase());
            }
        }
        Map<String, String> kept = new LinkedHashMap<>();
        headers.forEach((n, values) -> {
            if (NOT_STORED.contains(n) || named.contains(n) || (n.equals("set-cookie") && !settings.replaySetCookie)) {
                return;
            }
            // Set-Cookie lines joined by the unit separator, a control character no
            // cookie may hold, never a newline: idem 1.13 refuses a CR or LF in a
            // stored header (a replay would split the response); a replay splits
            // on it, and on the newline 1.12 used
            kept.put(n, String.join(n.equals("set-cookie") ? "\u001f" : ", ", values));
        });
        return kept;
    }

    private static Answer finished(Instant expires, boolean replayed, int status, Map<String, List<String>> headers,
                                   byte[] body) {
        Map<String, List<String>> h = new LinkedHashMap<>(headers);
        h.put("idempotent-replayed", List.of(replayed ? "true" : "false"));
        if (expires != null) {
            h.put("idempotency-expires", List.of(HTTP_DATE.format(expires)));
        }
        return new Answer(status, h, body);
    }

    static String parseKey(List<String> values) throws Problem {
        if (values.isEmpty()) {
            return null;
        }
        if (values.size() > 1 || values.get(0).contains(",")) {
            throw new Problem(400, "key-malformed", "send one Idempotency-Key header");
        }
        String v = values.get(0).strip();
        if (v.startsWith("\"")) {
            Matcher m = SF_STRING.matcher(v);
            if (!m.matches()) {
                throw new Problem(400, "key-malformed", "the Idempotency-Key is not a valid structured-field string");
            }
            v = m.group(1).replaceAll("\\\\([\"\\\\])", "$1");
        }
        if (!KEY.matcher(v).matches()) {
            throw new Problem(400, "key-malformed",
                "an idempotency key is 16 to 128 characters of A-Z, a-z, 0-9, '_' and '-'");
        }
        return v;
    }

    /**
     * The body as text: UTF-8 without a byte order mark, strictly decoded (400 invalid-request otherwise,
     * as every stack answers: a replacement character would make another request of it).
     */
    static String utf8(byte[] raw) throws Problem {
        if (raw.length >= 3 && (raw[0] & 0xff) == 0xef && (raw[1] & 0xff) == 0xbb && (raw[2] & 0xff) == 0xbf) {
            throw new Problem(400, "invalid-request", "the request body must not start with a byte order mark");
        }
        try {
            return StandardCharsets.UTF_8.newDecoder()
                .onMalformedInput(java.nio.charset.CodingErrorAction.REPORT)
                .onUnmappableCharacter(java.nio.charset.CodingErrorAction.REPORT)
                .decode(java.nio.ByteBuffer.wrap(raw)).toString();
        } catch (java.nio.charset.CharacterCodingException e) {
            throw new Problem(400, "invalid-request", "the request body is not valid UTF-8");
        }
    }

    private byte[] readBody(HttpServletRequest request) throws Problem {
        try (InputStream in = request.getInputStream()) {
            ByteArrayOutputStream out = new ByteArrayOutputStream();
            byte[] buf = new byte[8192];
            int n;
            while ((n = in.read(buf)) > 0) {
                out.write(buf, 0, n);
                if (out.size() > settings.maxBodyBytes) {
                    throw new Problem(413, "body-too-large", "the request body is over " + settings.maxBodyBytes + " bytes");
                }
            }
            return out.toByteArray();
        } catch (IOException e) {
            throw new Problem(400, "invalid-request", "the request body could not be read");
        }
    }

    private Problem problemOf(SQLException e, boolean log) {
        if (e instanceof IdemException.KeyReused x) {
            return new Problem(settings.conflictStatus, x.problemType(),
                "this idempotency key was used with a different request; send a new key for a new request");
        }
        if (e instanceof IdemException.KeyExpired x) {
            return new Problem(x.httpStatus(), x.problemType(),
                "this idempotency key expired and its request is not executed again; send a new key for a new request");
        }
        if (e instanceof IdemException.InFlight x) {
            return new Problem(x.httpStatus(), x.problemType(), "the first request with this key is still being processed; retry later")
                .with("retry-after", Integer.toString(settings.inFlightRetryAfter));
        }
        if (e instanceof IdemException.ReadOnly x) {
            return new Problem(x.httpStatus(), x.problemType(), "the service cannot take writes now; retry later")
                .with("retry-after", Integer.toString(settings.readOnlyRetryAfter));
        }
        if (e instanceof IdemException.Forbidden x) {
            return new Problem(x.httpStatus(), x.problemType(), "this request is not allowed for this owner or operation");
        }
        if (e instanceof IdemException.InvalidRequest x) {
            return new Problem(x.httpStatus(), x.problemType(), invalidDetail(e));
        }
        if (e instanceof IdemException.SerializationFailure x) {
            return new Problem(x.httpStatus(), x.problemType(), "the request raced another one; retry it").with("retry-after", "0");
        }
        if (e instanceof IdemException.Misconfigured) {
            if (!"42501".equals(e.getSQLState())) {     // a missing grant is logged once per process
                LOG.severe("idem: the database is not set up for idem: " + e.getSQLState() + " " + e.getMessage());
            }
            return new Problem(500, "internal", "the request could not be completed");
        }
        if (log) {
            LOG.severe("idem: request failed: " + e.getSQLState() + " " + e.getMessage());
        }
        return new Problem(500, "internal", "the request could not be completed");
    }

    /**
     * What a client is told of a refused request: idem's own words for 22023 (a key its policy refuses...),
     * never PostgreSQL's own error text (a parser's message names its internals).
     */
    static String invalidDetail(SQLException e) {
        return switch (String.valueOf(e.getSQLState())) {
            case "22023" -> e.getMessage();
            case "22003" -> "a number in the request body is outside the range of canonical JSON (an IEEE 754 double);"
                + " send it as a string";
            case "22P05" -> "the request body must not contain \\u0000";
            case "22P02" -> "the request body must be JSON";
            default -> "the request is not valid";
        };
    }

    private Answer problem(Problem p) {
        String type = "urn:idem:error:" + p.slug;
        byte[] body = null;
        if (settings.problemBody != null) {
            try {
                body = settings.problemBody.write(p.status, type, TITLES.get(p.slug), p.getMessage());
            } catch (IOException | RuntimeException e) {
                LOG.warning("idem: the problem body could not be written (" + e + "); idem's own is sent");
            }
        }
        if (body == null) {
            body = ("{\"type\":" + jsonString(type) + ",\"title\":" + jsonString(TITLES.get(p.slug))
                + ",\"status\":" + p.status + ",\"detail\":" + jsonString(p.getMessage()) + "}")
                .getBytes(StandardCharsets.UTF_8);
        }
        Map<String, List<String>> h = new LinkedHashMap<>();
        h.put("content-type", List.of("application/problem+json"));
        h.put("idempotent-replayed", List.of("false"));     // on every answer (the article's flag): none replayed
        if (settings.errorsUrl != null) {        // a Link only to documentation the application names
            h.put("link", List.of("<" + settings.errorsUrl + "#" + p.slug + ">; rel=\"describedby\""));
        }
        p.headers.forEach((n, v) -> h.put(n, List.of(v)));
        if (p.status == 413) {
            h.put("connection", List.of("close"));
        }
        return new Answer(p.status, h, body);
    }

    /** A JSON string of s (the escapes JSON requires). */
    public static String jsonString(String s) {
        StringBuilder b = new StringBuilder("\"");
        for (char ch : s.toCharArray()) {
            switch (ch) {
                case '"' -> b.append("\\\"");
                case '\\' -> b.append("\\\\");
                case '\n' -> b.append("\\n");
                default -> {
                    if (ch < 0x20) {
                        b.append(String.format("\\u%04x", (int) ch));
                    } else {
                        b.append(ch);
                    }
                }
            }
        }
        return b.append('"').toString();
    }

    private static final java.util.regex.Pattern TOKEN = java.util.regex.Pattern.compile("[!#$%&'*+.^_`|~0-9A-Za-z-]+");
    private static final java.util.regex.Pattern UNSENDABLE = java.util.regex.Pattern.compile("[\\x00-\\x08\\x0a-\\x1f\\x7f]");

    /**
     * The stored headers as sent: Set-Cookie lines split again; a name that is not an RFC 9110
     * token, or a value with a control character but a tab (a record written before idem 1.14
     * checked names), is never replayed.
     */
    static Map<String, List<String>> replayedHeaders(Map<String, String> stored) {
        Map<String, List<String>> h = new LinkedHashMap<>();
        stored.forEach((n, v) -> {
            if (!TOKEN.matcher(n).matches()) {
                return;
            }
            List<String> values = new ArrayList<>();
            for (String line : n.equals("set-cookie") ? v.split("[\n\u001f]") : new String[] {v}) {
                if (!UNSENDABLE.matcher(line).find()) {
                    values.add(line);
                }
            }
            if (!values.isEmpty()) {
                h.put(n, values);
            }
        });
        return h;
    }

    private static void send(HttpServletResponse response, Answer a) throws IOException {
        response.reset();
        response.setStatus(a.status());
        for (Map.Entry<String, List<String>> e : a.headers().entrySet()) {
            if (e.getKey().equals("content-length")) {
                continue;
            }
            List<String> values = new ArrayList<>(e.getValue());
            for (String v : values) {
                response.addHeader(e.getKey(), v);
            }
        }
        response.setContentLength(a.body().length);
        response.getOutputStream().write(a.body());
    }
}
