package shop;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.net.http.HttpResponse;
import java.util.UUID;
import javax.sql.DataSource;

import idem.spring.IdemRequests;
import idem.spring.Idempotent;
import jakarta.persistence.EntityManagerFactory;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Qualifier;
import org.springframework.beans.factory.annotation.Value;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.boot.test.context.TestConfiguration;
import org.springframework.context.annotation.Bean;
import org.springframework.context.annotation.Primary;
import org.springframework.http.HttpStatus;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.jdbc.datasource.DataSourceTransactionManager;
import org.springframework.jdbc.datasource.DriverManagerDataSource;
import org.springframework.orm.jpa.JpaTransactionManager;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;

/**
 * An application with two DataSources and two transaction managers: the route names the ledger's
 * ({@code @Idempotent(dataSource, transactionManager)}), and the record and the handler's ledger
 * writes commit or roll back together. Were the record on the primary's transaction, the ledger
 * write of a failed request would have committed on its own.
 */
@SpringBootTest(webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT)
class TwoDataSourcesTests extends ServiceTests {

    @TestConfiguration(proxyBeanMethods = false)
    static class Ledger {
        static DataSource connecting(String url, String user) {
            DriverManagerDataSource ds = new DriverManagerDataSource(url);
            ds.setUsername(user);
            return ds;
        }

        @Bean
        @Primary
        DataSource dataSource(@Value("${spring.datasource.url}") String url,
                              @Value("${spring.datasource.username}") String user) {
            return connecting(url, user);
        }

        @Bean
        DataSource ledgerDataSource(@Value("${spring.datasource.url}") String url,
                                    @Value("${spring.datasource.username}") String user) {
            return connecting(url, user);
        }

        @Bean
        @Primary
        JpaTransactionManager transactionManager(EntityManagerFactory emf) {
            return new JpaTransactionManager(emf);
        }

        @Bean
        DataSourceTransactionManager ledgerTransactionManager(@Qualifier("ledgerDataSource") DataSource ledger) {
            return new DataSourceTransactionManager(ledger);
        }

        /** A bean of this test's context only (component scanning leaves test classes out). */
        @Bean
        LedgerEndpoint ledgerEndpoint(@Qualifier("ledgerDataSource") DataSource ledger) {
            return new LedgerEndpoint(ledger);
        }
    }

    /** The ledger's order; a quantity of 99 throws after the write. */
    @RestController
    static class LedgerEndpoint {
        private final JdbcTemplate ledger;

        LedgerEndpoint(@Qualifier("ledgerDataSource") DataSource ledger) {
            this.ledger = new JdbcTemplate(ledger);
        }

        @PostMapping("/api/test/ledger/orders")
        @Idempotent(value = "LEDGER_ORDER", fields = {"skuId", "quantity"},
            dataSource = "ledgerDataSource", transactionManager = "ledgerTransactionManager")
        ResponseEntity<String> order(@RequestBody CreateOrderRequest request) {
            Long id = ledger.queryForObject("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (?, ?, ?) RETURNING id",
                Long.class, IdemRequests.owner(), request.skuId(), request.quantity());
            if (request.quantity() == 99) {
                throw new IllegalStateException("failed after the ledger's write");
            }
            return ResponseEntity.status(HttpStatus.CREATED).body("{\"orderId\": " + id + "}");
        }
    }

    static final String LEDGER = "/api/test/ledger/orders";

    @Test
    @DisplayName("two DataSources: @Idempotent(dataSource, transactionManager) keeps the record and the writes on the one it names")
    void namedDataSource() throws Exception {
        long owner = owner();
        String k = "ledger-" + UUID.randomUUID();
        HttpResponse<byte[]> failed = post(LEDGER, k, owner, "{\"skuId\": 8, \"quantity\": 99}");
        assertEquals(500, failed.statusCode(), text(failed));
        assertEquals(0, orders(owner), "the ledger's write rolled back");
        HttpResponse<byte[]> first = post(LEDGER, k, owner, "{\"skuId\": 8, \"quantity\": 2}");
        HttpResponse<byte[]> again = post(LEDGER, k, owner, "{\"skuId\": 8, \"quantity\": 2}");
        assertEquals(201, first.statusCode(), text(first));
        assertEquals("true", again.headers().firstValue("Idempotent-Replayed").orElse(null), text(again));
        assertEquals(1, orders(owner));
        assertEquals(1, records(owner, k));
    }
}
