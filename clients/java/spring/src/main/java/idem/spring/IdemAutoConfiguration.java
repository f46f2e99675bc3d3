package idem.spring;

import java.io.IOException;
import java.lang.reflect.Method;
import java.util.List;
import java.util.concurrent.Callable;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.Future;
import javax.sql.DataSource;

import idem.Idem;
import idem.servlet.IdempotencyFilter;
import idem.servlet.Settings;
import jakarta.servlet.Filter;
import jakarta.servlet.FilterChain;
import jakarta.servlet.ServletException;
import jakarta.servlet.ServletRequest;
import jakarta.servlet.ServletResponse;
import org.springframework.beans.factory.BeanFactory;
import org.springframework.beans.factory.ObjectProvider;
import org.springframework.beans.factory.SmartInitializingSingleton;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.context.properties.EnableConfigurationProperties;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.core.Ordered;
import org.springframework.web.context.request.async.DeferredResult;
import org.springframework.web.context.request.async.WebAsyncTask;
import org.springframework.web.method.HandlerMethod;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerAdapter;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;
import org.springframework.web.servlet.mvc.method.annotation.ResponseBodyEmitter;
import org.springframework.web.servlet.mvc.method.annotation.StreamingResponseBody;

/**
 * idem for a Spring MVC application: the {@link Idempotent} handler methods go through idem's
 * servlet filter, in a transaction of the application's transaction manager; {@link IdemTemplate}
 * for services. Applies to a servlet web application with idem-pg and a {@link DataSource} bean,
 * unless {@code idem.enabled=false}; every bean gives way to one of the application's. Needs an
 * {@link IdemOwnerResolver} bean: start-up fails without one ({@link OwnerResolverFailureAnalyzer}
 * says what to define).
 */
@AutoConfiguration(afterName = {
    "org.springframework.boot.autoconfigure.jdbc.DataSourceAutoConfiguration",
    "org.springframework.boot.autoconfigure.jdbc.DataSourceTransactionManagerAutoConfiguration",
    "org.springframework.boot.autoconfigure.orm.jpa.HibernateJpaAutoConfiguration",
    "org.springframework.boot.autoconfigure.transaction.TransactionAutoConfiguration",
    "org.springframework.boot.jdbc.autoconfigure.DataSourceAutoConfiguration",
    "org.springframework.boot.jdbc.autoconfigure.DataSourceTransactionManagerAutoConfiguration",
    "org.springframework.boot.hibernate.autoconfigure.HibernateJpaAutoConfiguration",
    "org.springframework.boot.transaction.autoconfigure.TransactionAutoConfiguration",
    "org.springframework.boot.actuate.autoconfigure.metrics.CompositeMeterRegistryAutoConfiguration",
    "org.springframework.boot.micrometer.metrics.autoconfigure.CompositeMeterRegistryAutoConfiguration"})
@ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
@ConditionalOnClass({Idem.class, IdempotencyFilter.class, DataSource.class, RequestMappingHandlerMapping.class})
@ConditionalOnBean(DataSource.class)
@ConditionalOnProperty(prefix = "idem", name = "enabled", havingValue = "true", matchIfMissing = true)
@EnableConfigurationProperties(IdemProperties.class)
public class IdemAutoConfiguration {
    /** Return types answered after the handler returned: never stored in its transaction. */
    private static final List<Class<?>> ASYNC = List.of(CompletionStage.class, Future.class, Callable.class,
        DeferredResult.class, WebAsyncTask.class, StreamingResponseBody.class, ResponseBodyEmitter.class);

    @Bean
    @ConditionalOnMissingBean
    public Idem idem(IdemProperties properties) {
        return properties.isServerPrepare() ? new Idem() : new Idem().withoutServerPrepare();
    }

    @Bean
    @ConditionalOnMissingBean
    public IdemTemplate idemTemplate(DataSource dataSource, Idem idem) {
        return new IdemTemplate(dataSource, idem);
    }

    /** The filter, after Spring Security's (its principal is the owner's source). */
    @Bean
    @ConditionalOnMissingBean
    public IdemFilter idemFilter(IdemProperties properties, ObjectProvider<IdemOwnerResolver> owners,
                                 BeanFactory beans, RequestMappingHandlerMapping requestMappingHandlerMapping,
                                 ObjectProvider<IdemMetrics> metrics,
                                 ObjectProvider<RequestMappingHandlerAdapter> adapters) {
        IdemOwnerResolver owner = owners.getIfAvailable();
        if (owner == null) {
            throw new NoOwnerResolverException();
        }
        Settings settings = new Settings(null, owner::ownerOf)
            .matcher(new IdempotentRoutes(requestMappingHandlerMapping))
            .transactions(new SpringTransactions(beans))
            .problemBody(new SpringProblems(adapters))
            .conflictStatus(properties.getConflictStatus())
            .maxBodyBytes(properties.getMaxBodyBytes())
            .replaySetCookie(properties.isReplaySetCookie())
            .serverPrepare(properties.isServerPrepare());
        if (properties.getTtl() != null) {
            settings.ttl(properties.getTtl());
        }
        if (properties.getErrorsUrl() != null && !properties.getErrorsUrl().isBlank()) {
            settings.errorsUrl(properties.getErrorsUrl());
        }
        IdemMetrics m = metrics.getIfAvailable();
        if (m != null) {
            settings.observer(m);
        }
        return new IdemFilter(new IdempotencyFilter(settings));
    }

    @Bean
    @ConditionalOnMissingBean
    public FailureMarker idemFailureMarker() {
        return new FailureMarker();
    }

    /**
     * Start-up fails on an {@link Idempotent} method whose answer comes after it returned; each
     * operation's meters are registered.
     */
    @Bean
    @ConditionalOnMissingBean(name = "idemAsyncCheck")
    public SmartInitializingSingleton idemAsyncCheck(RequestMappingHandlerMapping requestMappingHandlerMapping,
                                                     ObjectProvider<IdemMetrics> metrics) {
        return () -> {
            IdemMetrics m = metrics.getIfAvailable();
            for (HandlerMethod handler : requestMappingHandlerMapping.getHandlerMethods().values()) {
                Method method = handler.getMethod();
                Idempotent idempotent = handler.getMethodAnnotation(Idempotent.class);
                if (idempotent == null) {
                    continue;
                }
                if (m != null) {
                    m.registerOperation(idempotent.value());
                }
                Class<?> type = method.getReturnType();
                boolean reactive = type.getName().startsWith("reactor.core.publisher.")
                    || type.getName().equals("org.reactivestreams.Publisher");
                if (reactive || ASYNC.stream().anyMatch(a -> a.isAssignableFrom(type))) {
                    throw new IllegalStateException("idem: @Idempotent " + method.getDeclaringClass().getName() + "."
                        + method.getName() + " returns " + type.getSimpleName() + ": an answer that comes after the "
                        + "method returned cannot be stored in the request's transaction; return the value or a "
                        + "ResponseEntity");
                }
                if (idempotent.fields().length > 0 && idempotent.pathVariables().length > 0) {
                    throw new IllegalStateException("idem: @Idempotent " + method.getDeclaringClass().getName() + "."
                        + method.getName() + " names fields and pathVariables: name one of them (with pathVariables "
                        + "the request is the variables and the whole body)");
                }
            }
        };
    }

    /** Micrometer's meters, where the application has a registry (Actuator). */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "io.micrometer.core.instrument.MeterRegistry")
    static class Metrics {
        @Bean
        @ConditionalOnMissingBean
        IdemMetrics idemMetrics(ObjectProvider<io.micrometer.core.instrument.MeterRegistry> registries) {
            return new IdemMetrics(registries);
        }
    }

    /** Start-up without an {@link IdemOwnerResolver} bean ({@link OwnerResolverFailureAnalyzer}). */
    public static final class NoOwnerResolverException extends IllegalStateException {
        private static final long serialVersionUID = 1L;

        NoOwnerResolverException() {
            super("idem: define a bean of type idem.spring.IdemOwnerResolver: the owner (tenant) of a request, from "
                + "its authentication (IdemOwnerResolver.fromPrincipal(...) with Spring Security); never a header "
                + "the client chooses (clients/CONTRACT.md)");
        }
    }

    /** idem's servlet filter as a Spring bean: Spring Boot registers it for every path. */
    public static final class IdemFilter implements Filter, Ordered {
        /** After Spring Security's filter chain (-100), before the application's own filters. */
        public static final int ORDER = -50;
        private final IdempotencyFilter filter;

        /** idem's filter with settings of the application's own (a bean of its own replaces the starter's). */
        public IdemFilter(IdempotencyFilter filter) {
            this.filter = filter;
        }

        @Override
        public void doFilter(ServletRequest request, ServletResponse response, FilterChain chain)
            throws IOException, ServletException {
            filter.doFilter(request, response, chain);
        }

        @Override
        public int getOrder() {
            return ORDER;
        }
    }
}
