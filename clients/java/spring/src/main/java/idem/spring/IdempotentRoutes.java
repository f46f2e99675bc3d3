package idem.spring;

import java.util.Arrays;
import java.util.List;
import java.util.Map;

import idem.servlet.IdempotencyFilter;
import idem.servlet.Settings;
import jakarta.servlet.http.HttpServletRequest;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.HandlerExecutionChain;
import org.springframework.web.servlet.HandlerMapping;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;
import org.springframework.web.util.ServletRequestPathUtils;

/**
 * The idempotent routes are the handler methods annotated {@link Idempotent}: the request is
 * looked up in Spring MVC's own handler mapping (as Spring's HandlerMappingIntrospector does for
 * CORS and security), before the DispatcherServlet runs.
 */
final class IdempotentRoutes implements Settings.RouteMatcher {
    /** The request attribute holding the handler's {@link Idempotent}. */
    static final String ANNOTATION = "idem.spring.idempotent";

    private final RequestMappingHandlerMapping mapping;

    IdempotentRoutes(RequestMappingHandlerMapping mapping) {
        this.mapping = mapping;
    }

    @Override
    public Settings.Match match(HttpServletRequest request) {
        String method = request.getMethod();
        if (method.equals("GET") || method.equals("HEAD") || method.equals("OPTIONS") || method.equals("TRACE")) {
            return null;
        }
        HandlerExecutionChain chain;
        Object parsed = request.getAttribute(ServletRequestPathUtils.PATH_ATTRIBUTE);
        try {
            if (parsed == null) {
                ServletRequestPathUtils.parseAndCache(request);
            }
            chain = mapping.getHandler(request);
        } catch (Exception e) {
            return null;                        // Spring MVC answers for it (405, 415, ...)
        } finally {
            if (parsed == null) {
                ServletRequestPathUtils.clearParsedRequestPath(request);
            }
        }
        if (chain == null || !(chain.getHandler() instanceof HandlerMethod handler)) {
            return null;
        }
        Idempotent idempotent = handler.getMethodAnnotation(Idempotent.class);
        if (idempotent == null) {
            return null;
        }
        request.setAttribute(ANNOTATION, idempotent);
        @SuppressWarnings("unchecked")
        Map<String, String> variables = (Map<String, String>) request.getAttribute(
            HandlerMapping.URI_TEMPLATE_VARIABLES_ATTRIBUTE);
        Settings.Route route = new Settings.Route(method, null, List.of(), req -> idempotent.value(),
            selector(idempotent), idempotent.keyRequired());
        return new Settings.Match(route, variables == null ? Map.of() : variables);
    }

    /** What is fingerprinted: the raw body, its fields, or the path variables and the body. */
    static Settings.RequestSelector selector(Idempotent idempotent) {
        if (idempotent.fields().length > 0) {
            return Settings.fields(idempotent.fields());
        }
        List<String> names = Arrays.asList(idempotent.pathVariables());
        if (names.isEmpty()) {
            return null;
        }
        return (body, params) -> {
            StringBuilder json = new StringBuilder("{");
            for (String name : names) {
                json.append(quote(name)).append(':').append(quote(params.get(name))).append(',');
            }
            return json.append("\"body\":").append(body).append('}').toString();
        };
    }

    /** A JSON string (null for a variable the path lacks). */
    static String quote(String s) {
        return s == null ? "null" : IdempotencyFilter.jsonString(s);
    }
}
