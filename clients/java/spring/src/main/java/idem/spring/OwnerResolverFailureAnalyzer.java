package idem.spring;

import org.springframework.boot.diagnostics.AbstractFailureAnalyzer;
import org.springframework.boot.diagnostics.FailureAnalysis;

/** What to do when the application defines no {@link IdemOwnerResolver}: Spring Boot prints it at start-up. */
public class OwnerResolverFailureAnalyzer
    extends AbstractFailureAnalyzer<IdemAutoConfiguration.NoOwnerResolverException> {
    @Override
    protected FailureAnalysis analyze(Throwable rootFailure, IdemAutoConfiguration.NoOwnerResolverException cause) {
        return new FailureAnalysis(
            "idem's @Idempotent routes need the owner (tenant) of each request, and the application defines no "
                + "bean of type idem.spring.IdemOwnerResolver.",
            "Define a bean of type idem.spring.IdemOwnerResolver that reads the owner from the request's "
                + "authentication (with Spring Security: IdemOwnerResolver.fromPrincipal(...)), never from a header "
                + "the client chooses (clients/CONTRACT.md). Or set idem.enabled=false to run without idem.",
            cause);
    }
}
