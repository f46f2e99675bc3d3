package idem.servlet;

import java.io.IOException;
import java.nio.charset.StandardCharsets;

import org.apache.catalina.Container;
import org.apache.catalina.connector.Request;
import org.apache.catalina.connector.Response;
import org.apache.catalina.core.StandardHost;
import org.apache.catalina.valves.ErrorReportValve;

/**
 * Embedded Tomcat's error report for what never reached the application: a request its HTTP
 * parser refuses (a control character in a header, an Idempotency-Key among them) is answered
 * 400 problem+json, as the filter answers a bad request (clients/CONTRACT.md), not Tomcat's HTML
 * page; other errors keep Tomcat's report, without its version. {@link #install} puts it on a
 * host; the Spring Boot starters do that on the embedded Tomcat.
 */
public class TomcatProblemValve extends ErrorReportValve {
    /**
     * Tomcat's HTTP parser logs the first request it refuses with the header it refused, which may
     * be an idempotency key: keys are never logged (clients/CONTRACT.md), so it logs warnings
     * only. Held here: java.util.logging keeps only weak references to its loggers.
     */
    private static final java.util.logging.Logger PARSER_LOG =
        java.util.logging.Logger.getLogger("org.apache.coyote.http11.Http11Processor");

    private static volatile String errorsUrl;

    /** The errors URL of the Link header ({@link Settings#errorsUrl}); null: none. */
    public static void errorsUrl(String url) {
        errorsUrl = url;
    }

    /** Tomcat's HTTP parser logs warnings only (its refused header is never logged). */
    public static void quietParser() {
        PARSER_LOG.setLevel(java.util.logging.Level.WARNING);
    }

    /**
     * The valve as the host's error report, with the errors URL of its Link header (null: none),
     * and Tomcat's parser logging warnings only ({@link #quietParser()}).
     */
    public static void install(Container host, String errorsUrl) {
        errorsUrl(errorsUrl);
        quietParser();
        ((StandardHost) host).setErrorReportValveClass(TomcatProblemValve.class.getName());
    }

    public TomcatProblemValve() {
        setShowReport(false);
        setShowServerInfo(false);
    }

    @Override
    protected void report(Request request, Response response, Throwable throwable) {
        if (response.getStatus() != 400 || response.getContentWritten() > 0 || !response.setErrorReported()) {
            super.report(request, response, throwable);
            return;
        }
        try {
            byte[] body = ("{\"type\":\"urn:idem:error:invalid-request\",\"title\":\"Invalid request\",\"status\":400,"
                + "\"detail\":\"the request could not be parsed: a header or the request line is malformed\"}")
                .getBytes(StandardCharsets.UTF_8);
            response.setContentType("application/problem+json");
            response.setContentLength(body.length);
            String docs = errorsUrl;
            if (docs != null && !docs.isBlank()) {
                response.setHeader("Link", "<" + docs + "#invalid-request>; rel=\"describedby\"");
            }
            response.getOutputStream().write(body);
            response.finishResponse();
        } catch (IOException | IllegalStateException e) {
            // the connection is gone: nothing to answer
        }
    }
}
