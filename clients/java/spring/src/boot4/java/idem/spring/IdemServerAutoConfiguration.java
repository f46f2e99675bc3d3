package idem.spring;

import javax.sql.DataSource;

import idem.servlet.TomcatProblemValve;
import org.springframework.boot.autoconfigure.AutoConfiguration;
import org.springframework.boot.autoconfigure.condition.ConditionalOnBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnClass;
import org.springframework.boot.autoconfigure.condition.ConditionalOnMissingBean;
import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.boot.autoconfigure.condition.ConditionalOnWebApplication;
import org.springframework.boot.tomcat.servlet.TomcatServletWebServerFactory;
import org.springframework.boot.web.server.WebServerFactoryCustomizer;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Configuration;

/**
 * What the starter adds to Spring Boot's modules whose packages differ between Boot 3 and Boot 4
 * (Boot 4 moved them to spring-boot-health and spring-boot-tomcat): Actuator's health indicator
 * and the embedded Tomcat's problem valve. src/boot3/java and src/boot4/java hold this class in
 * each line's names, and differ in nothing else (test/clients/spring.sh checks it).
 */
@AutoConfiguration(after = IdemAutoConfiguration.class)
@ConditionalOnWebApplication(type = ConditionalOnWebApplication.Type.SERVLET)
@ConditionalOnBean(DataSource.class)
@ConditionalOnProperty(prefix = "idem", name = "enabled", havingValue = "true", matchIfMissing = true)
public class IdemServerAutoConfiguration {
    /**
     * Actuator's health: is idem installed in the database? One catalog lookup, never
     * idem_health(), which counts whole tables.
     */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = "org.springframework.boot.health.contributor.HealthIndicator")
    static class Health {
        @Bean(name = "idemHealthIndicator")
        @ConditionalOnMissingBean(name = "idemHealthIndicator")
        IdemHealthIndicator idemHealthIndicator(DataSource dataSource) {
            return new IdemHealthIndicator(dataSource);
        }
    }

    /**
     * Embedded Tomcat: a request its parser refuses is answered 400 problem+json
     * ({@link TomcatProblemValve}); the parser's own log line, which quotes the refused header (an
     * idempotency key, maybe), is kept to warnings: keys are never logged.
     */
    @Configuration(proxyBeanMethods = false)
    @ConditionalOnClass(name = {"org.apache.catalina.valves.ErrorReportValve",
        "org.springframework.boot.tomcat.servlet.TomcatServletWebServerFactory"})
    static class Tomcat {
        @Bean
        @ConditionalOnMissingBean(name = "idemTomcatCustomizer")
        WebServerFactoryCustomizer<TomcatServletWebServerFactory> idemTomcatCustomizer(IdemProperties properties) {
            return factory -> factory.addContextCustomizers(
                context -> TomcatProblemValve.install(context.getParent(), properties.getErrorsUrl()));
        }
    }
}
