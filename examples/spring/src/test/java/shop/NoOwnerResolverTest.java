package shop;

import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.springframework.boot.WebApplicationType;
import org.springframework.boot.autoconfigure.EnableAutoConfiguration;
import org.springframework.boot.builder.SpringApplicationBuilder;
import org.springframework.context.annotation.Configuration;

/** Start-up fails without an IdemOwnerResolver bean, saying what to define. */
class NoOwnerResolverTest {
    @Configuration(proxyBeanMethods = false)
    @EnableAutoConfiguration
    static class NoOwner {
    }

    @Test
    @DisplayName("start-up fails without an IdemOwnerResolver bean, naming it")
    void refused() {
        Exception e = assertThrows(Exception.class, () -> new SpringApplicationBuilder(NoOwner.class)
            .web(WebApplicationType.SERVLET).properties("server.port=0").run().close());
        Throwable t = e;
        StringBuilder messages = new StringBuilder();
        for (; t != null; t = t.getCause()) {
            messages.append(t.getMessage()).append(" / ");
        }
        assertTrue(messages.toString().contains("define a bean of type idem.spring.IdemOwnerResolver"),
            messages.toString());
    }
}
