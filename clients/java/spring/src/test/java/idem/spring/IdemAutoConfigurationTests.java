package idem.spring;

import static org.assertj.core.api.Assertions.assertThat;

import java.util.Set;
import java.util.stream.Collectors;
import javax.sql.DataSource;

import idem.Idem;
import io.micrometer.core.instrument.Meter;
import io.micrometer.core.instrument.MeterRegistry;
import io.micrometer.core.instrument.Tag;
import io.micrometer.core.instrument.simple.SimpleMeterRegistry;
import org.junit.jupiter.api.Test;
import org.springframework.boot.autoconfigure.AutoConfigurations;
import org.springframework.boot.diagnostics.FailureAnalysis;
import org.springframework.boot.test.context.FilteredClassLoader;
import org.springframework.boot.test.context.runner.ApplicationContextRunner;
import org.springframework.boot.test.context.runner.WebApplicationContextRunner;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;
import org.springframework.jdbc.datasource.DriverManagerDataSource;
import org.springframework.web.servlet.mvc.method.annotation.RequestMappingHandlerMapping;

/**
 * The starter's conditions, as Spring Boot tests its own auto-configurations: each context is
 * started and inspected, and never connects to a database (the data source points nowhere).
 */
class IdemAutoConfigurationTests {
    private final WebApplicationContextRunner web = new WebApplicationContextRunner()
        .withConfiguration(AutoConfigurations.of(IdemAutoConfiguration.class));

    @Configuration(proxyBeanMethods = false)
    static class Application {
        @Bean
        DataSource dataSource() {
            return new DriverManagerDataSource("jdbc:postgresql://127.0.0.1:1/never-connected");
        }

        @Bean
        RequestMappingHandlerMapping requestMappingHandlerMapping() {
            return new RequestMappingHandlerMapping();
        }

        @Bean
        IdemOwnerResolver owner() {
            return request -> 1L;
        }
    }

    @Configuration(proxyBeanMethods = false)
    static class WithoutDataSource {
        @Bean
        RequestMappingHandlerMapping requestMappingHandlerMapping() {
            return new RequestMappingHandlerMapping();
        }
    }

    @Configuration(proxyBeanMethods = false)
    static class WithoutOwner {
        @Bean
        DataSource dataSource() {
            return new DriverManagerDataSource("jdbc:postgresql://127.0.0.1:1/never-connected");
        }

        @Bean
        RequestMappingHandlerMapping requestMappingHandlerMapping() {
            return new RequestMappingHandlerMapping();
        }
    }

    @Configuration(proxyBeanMethods = false)
    static class OwnBeans {
        static final Idem IDEM = new Idem().withoutServerPrepare();

        @Bean
        Idem myIdem() {
            return IDEM;
        }

        @Bean
        IdemTemplate myTemplate(DataSource dataSource) {
            return new IdemTemplate(dataSource, IDEM);
        }
    }

    @Configuration(proxyBeanMethods = false)
    static class Registry {
        @Bean
        MeterRegistry meterRegistry() {
            return new SimpleMeterRegistry();
        }
    }

    @Test
    void configuresEveryBeanOfAServletApplication() {
        web.withUserConfiguration(Application.class).run(context -> {
            assertThat(context).hasNotFailed();
            assertThat(context).hasSingleBean(Idem.class).hasSingleBean(IdemTemplate.class)
                .hasSingleBean(IdemAutoConfiguration.IdemFilter.class).hasSingleBean(FailureMarker.class)
                .hasSingleBean(IdemMetrics.class).hasBean("idemAsyncCheck");
        });
    }

    @Test
    void backsOffWithoutADataSource() {
        web.withUserConfiguration(WithoutDataSource.class).run(context -> {
            assertThat(context).hasNotFailed();
            assertThat(context).doesNotHaveBean(Idem.class).doesNotHaveBean(IdemAutoConfiguration.IdemFilter.class);
        });
    }

    @Test
    void backsOffWhenDisabled() {
        web.withUserConfiguration(Application.class).withPropertyValues("idem.enabled=false").run(context -> {
            assertThat(context).hasNotFailed();
            assertThat(context).doesNotHaveBean(Idem.class).doesNotHaveBean(IdemTemplate.class)
                .doesNotHaveBean(IdemAutoConfiguration.IdemFilter.class);
        });
    }

    @Test
    void backsOffWithoutIdemPg() {
        web.withUserConfiguration(Application.class).withClassLoader(new FilteredClassLoader(Idem.class))
            .run(context -> assertThat(context).hasNotFailed().doesNotHaveBean(IdemAutoConfiguration.IdemFilter.class));
    }

    @Test
    void backsOffOutsideAServletApplication() {
        new ApplicationContextRunner().withConfiguration(AutoConfigurations.of(IdemAutoConfiguration.class))
            .withUserConfiguration(Application.class)
            .run(context -> assertThat(context).hasNotFailed().doesNotHaveBean(Idem.class));
    }

    @Test
    void theApplicationsBeansReplaceTheDefaults() {
        web.withUserConfiguration(Application.class, OwnBeans.class).run(context -> {
            assertThat(context).hasNotFailed().hasSingleBean(Idem.class).hasSingleBean(IdemTemplate.class);
            assertThat(context.getBean(Idem.class)).isSameAs(OwnBeans.IDEM);
            assertThat(context).hasBean("myTemplate").doesNotHaveBean("idemTemplate").doesNotHaveBean("idem");
        });
    }

    @Test
    void withoutAnOwnerResolverStartUpFailsAndSaysWhatToDefine() {
        web.withUserConfiguration(WithoutOwner.class).run(context -> {
            assertThat(context).hasFailed();
            Throwable failure = context.getStartupFailure();
            assertThat(failure).rootCause().hasMessageContaining("define a bean of type idem.spring.IdemOwnerResolver");
            FailureAnalysis analysis = new OwnerResolverFailureAnalyzer().analyze(failure);
            assertThat(analysis).isNotNull();
            assertThat(analysis.getDescription()).contains("no bean of type idem.spring.IdemOwnerResolver");
            assertThat(analysis.getAction()).contains("IdemOwnerResolver.fromPrincipal").contains("idem.enabled=false");
        });
    }

    @Test
    void theFailureAnalyzerIsRegistered() throws Exception {
        String factories = new String(IdemAutoConfigurationTests.class.getClassLoader()
            .getResourceAsStream("META-INF/spring.factories").readAllBytes(), java.nio.charset.StandardCharsets.UTF_8);
        assertThat(factories).contains("org.springframework.boot.diagnostics.FailureAnalyzer")
            .contains(OwnerResolverFailureAnalyzer.class.getName());
    }

    @Test
    void metricTagsAreOperationOutcomeAndStatusClassOnly() {
        web.withUserConfiguration(Application.class, Registry.class).run(context -> {
            IdemMetrics metrics = context.getBean(IdemMetrics.class);
            metrics.answered("CREATE_ORDER", 201, false, null, 1_000_000);
            metrics.answered("CREATE_ORDER", 409, false, "key-reused", 1_000_000);
            MeterRegistry registry = context.getBean(MeterRegistry.class);
            for (Meter meter : registry.find("idem.requests").meters()) {
                Set<String> keys = meter.getId().getTags().stream().map(Tag::getKey).collect(Collectors.toSet());
                assertThat(keys).containsExactlyInAnyOrder("operation", "outcome", "status");
            }
            assertThat(registry.find("idem.requests").tags("outcome", "executed", "status", "2xx").timer()).isNotNull();
            assertThat(registry.find("idem.requests").tags("outcome", "conflict", "status", "4xx").timer()).isNotNull();
        });
    }
}
