package shop;

import idem.spring.IdemOwnerResolver;
import org.springframework.boot.SpringApplication;
import org.springframework.boot.autoconfigure.SpringBootApplication;
import org.springframework.context.annotation.Bean;

/** The article's order service: POST /api/orders, once per Idempotency-Key. */
@SpringBootApplication
public class OrderApplication {
    public static void main(String[] args) {
        SpringApplication.run(OrderApplication.class, args);
    }

    /**
     * The owner of a request. Here the X-Owner-Id header stands in for real authentication (as in
     * the other examples); a real service takes it from its authentication, e.g.
     * {@code IdemOwnerResolver.fromPrincipal(p -> accounts.idOf(p.getName()))} with Spring Security.
     */
    @Bean
    IdemOwnerResolver ownerResolver() {
        return request -> {
            String owner = request.getHeader("X-Owner-Id");
            return owner != null && owner.matches("\\d{1,18}") ? Long.valueOf(owner) : null;
        };
    }
}
