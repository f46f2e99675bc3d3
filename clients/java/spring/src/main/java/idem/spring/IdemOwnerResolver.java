package idem.spring;

import java.security.Principal;
import java.util.function.Function;

import jakarta.servlet.http.HttpServletRequest;

/**
 * The owner (tenant) a request acts for, from its authentication — never from what the client
 * says (clients/CONTRACT.md); null answers 401. The application must define this bean: start-up
 * fails without it.
 */
@FunctionalInterface
public interface IdemOwnerResolver {
    Long ownerOf(HttpServletRequest request) throws Exception;

    /**
     * The owner of the request's authenticated principal: with Spring Security,
     * {@code request.getUserPrincipal()} is the {@code Authentication}.
     */
    static IdemOwnerResolver fromPrincipal(Function<Principal, Long> owner) {
        return request -> {
            Principal p = request.getUserPrincipal();
            return p == null ? null : owner.apply(p);
        };
    }
}
