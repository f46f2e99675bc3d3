package idem.spring;

import idem.servlet.IdempotencyFilter;
import jakarta.servlet.http.HttpServletRequest;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.core.Ordered;
import org.springframework.web.servlet.HandlerExceptionResolver;
import org.springframework.web.servlet.ModelAndView;

/**
 * First of the exception resolvers: marks the request of an {@link Idempotent} handler that
 * threw, then lets the application's resolvers ({@code @ControllerAdvice}) answer. The filter
 * rolls the transaction back and stores nothing, whatever status that answer has.
 */
final class FailureMarker implements HandlerExceptionResolver, Ordered {
    @Override
    public ModelAndView resolveException(HttpServletRequest request, HttpServletResponse response, Object handler,
                                         Exception ex) {
        if (request.getAttribute(IdempotentRoutes.ANNOTATION) != null) {
            request.setAttribute(IdempotencyFilter.FAILED, ex);
        }
        return null;
    }

    @Override
    public int getOrder() {
        return Ordered.HIGHEST_PRECEDENCE;
    }
}
