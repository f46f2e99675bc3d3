package idem.spring;

import java.io.ByteArrayOutputStream;
import java.io.IOException;
import java.io.OutputStream;
import java.net.URI;

import idem.servlet.Settings;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.http.HttpHeaders;
import org.springframework.http.HttpOutputMessage;
import org.springframework.http.HttpStatusCode;
import org.springframework.http.MediaType;
import org.springframework.http.ProblemDetail;
import org.springframework.http.converter.HttpMessageConverter;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerAdapter;

/**
 * The starter's own answers (a missing or malformed key, a key reused, in flight...) as Spring's
 * {@link ProblemDetail}, written by the application's message converters (its JSON mapper, as a
 * {@code ResponseEntity<ProblemDetail>} of a controller is): RFC 9457 with clients/CONTRACT.md's
 * type URIs, titles and statuses.
 */
final class SpringProblems implements Settings.ProblemBody {
    private final ObjectProvider<RequestMappingHandlerAdapter> adapters;

    SpringProblems(ObjectProvider<RequestMappingHandlerAdapter> adapters) {
        this.adapters = adapters;
    }

    @Override
    @SuppressWarnings("unchecked")
    public byte[] write(int status, String type, String title, String detail) throws IOException {
        RequestMappingHandlerAdapter adapter = adapters.getIfAvailable();
        if (adapter == null) {
            return null;
        }
        for (HttpMessageConverter<?> converter : adapter.getMessageConverters()) {
            if (converter.canWrite(ProblemDetail.class, MediaType.APPLICATION_PROBLEM_JSON)) {
                ProblemDetail problem = ProblemDetail.forStatusAndDetail(HttpStatusCode.valueOf(status), detail);
                problem.setType(URI.create(type));
                problem.setTitle(title);
                Buffer out = new Buffer();
                ((HttpMessageConverter<ProblemDetail>) converter).write(problem, MediaType.APPLICATION_PROBLEM_JSON, out);
                return out.body.toByteArray();
            }
        }
        return null;            // no JSON converter: the filter's own body
    }

    /** A message the converter writes into memory: the filter sends it with its own headers. */
    private static final class Buffer implements HttpOutputMessage {
        final ByteArrayOutputStream body = new ByteArrayOutputStream(256);
        final HttpHeaders headers = new HttpHeaders();

        @Override
        public OutputStream getBody() {
            return body;
        }

        @Override
        public HttpHeaders getHeaders() {
            return headers;
        }
    }
}
