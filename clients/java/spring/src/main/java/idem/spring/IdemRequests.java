package idem.spring;

import idem.servlet.IdempotencyFilter;
import idem.servlet.Settings;
import org.springframework.web.context.request.RequestAttributes;
import org.springframework.web.context.request.RequestContextHolder;

/** The current {@link Idempotent} request's claim, for its handler. */
public final class IdemRequests {
    private IdemRequests() {
    }

    /** The claim (owner, operation, key, path variables); IllegalStateException outside an idempotent request. */
    public static Settings.Context current() {
        RequestAttributes attributes = RequestContextHolder.getRequestAttributes();
        Object context = attributes == null ? null
            : attributes.getAttribute(IdempotencyFilter.CONTEXT, RequestAttributes.SCOPE_REQUEST);
        if (context == null) {
            throw new IllegalStateException("not in an idempotent request (an @Idempotent method with an "
                + "Idempotency-Key header)");
        }
        return (Settings.Context) context;
    }

    /** The owner the request acts for. */
    public static long owner() {
        return current().owner;
    }

    /** The resource the request made, stored with its record. */
    public static void resourceId(long id) {
        current().resourceId(id);
    }
}
