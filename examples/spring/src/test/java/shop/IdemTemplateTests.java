package shop;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertInstanceOf;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import java.util.Map;
import java.util.UUID;

import idem.Idem;
import idem.IdemException;
import idem.spring.IdemTemplate;
import org.junit.jupiter.api.DisplayName;
import org.junit.jupiter.api.Test;
import org.springframework.beans.factory.annotation.Autowired;
import org.springframework.boot.test.context.SpringBootTest;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.transaction.support.TransactionTemplate;

/**
 * IdemTemplate in a service's own transaction (a TransactionTemplate here, a @Transactional method
 * in an application): the record and the service's writes commit or roll back together. The same
 * configuration as OrderApplicationTests: Spring's test context cache shares its application.
 */
@SpringBootTest(webEnvironment = SpringBootTest.WebEnvironment.RANDOM_PORT, properties = {
    "spring.test.observability.auto-configure=true"})
class IdemTemplateTests extends ServiceTests {
    @Autowired
    IdemTemplate idem;
    @Autowired
    TransactionTemplate tx;
    @Autowired
    JdbcTemplate jdbc;

    /** begin; the order unless replayed; finish: one transaction. */
    Idem.Outcome order(long owner, String key, String request, boolean rollback) {
        return tx.execute(status -> {
            Idem.Outcome o = idem.begin(owner, "TEMPLATE_ORDER", key, request, null);
            if (!o.replayed()) {
                Long id = jdbc.queryForObject(
                    "INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (?, 5, 1) RETURNING id", Long.class, owner);
                idem.finish(owner, "TEMPLATE_ORDER", key, 201, "{\"orderId\": " + id + "}", id, Map.of());
            }
            if (rollback) {
                status.setRollbackOnly();
            }
            return o;
        });
    }

    @Test
    @DisplayName("IdemTemplate: begin, the service's write and finish commit together; the next begin replays")
    void beginFinish() throws Exception {
        long owner = owner();
        String k = key();
        Idem.Outcome rolledBack = order(owner, k, "{\"skuId\": 5, \"quantity\": 1}", true);
        assertFalse(rolledBack.replayed());
        assertEquals(0, orders(owner), "a rollback keeps nothing");
        Idem.Outcome first = order(owner, k, "{\"skuId\": 5, \"quantity\": 1}", false);
        Idem.Outcome again = order(owner, k, "{\"quantity\": 1.0, \"skuId\": 5}", false);
        assertFalse(first.replayed(), "the rolled-back claim left no record: this one executes");
        assertTrue(again.replayed());
        assertEquals(201, again.httpStatus());
        assertTrue(again.body().contains("orderId"), again.body());
        assertEquals(1, orders(owner));
        IdemTemplate.IdemFailure reused = assertThrows(IdemTemplate.IdemFailure.class,
            () -> order(owner, k, "{\"skuId\": 6, \"quantity\": 1}", false));
        assertEquals("IK001", reused.sqlState());
        assertInstanceOf(IdemException.KeyReused.class, reused.getCause());
    }

    @Test
    @DisplayName("IdemTemplate refuses to run outside a transaction (its record would commit apart)")
    void outsideTransaction() {
        assertThrows(IllegalStateException.class, () -> idem.begin(1, "TEMPLATE_ORDER",
            key(), "{}", null));
    }

    @Test
    @DisplayName("IdemTemplate.run: the handler once per key; submit: a long flow's claim, replayed")
    void runAndSubmit() throws Exception {
        long owner = owner();
        long account = 5_000_000 + owner;      // beside the contract's accounts, never on them
        jdbc.update("INSERT INTO account VALUES (?, 100)", account);
        String k = key();
        String request = "{\"account\": " + account + ", \"amount\": 30}";
        Idem.Outcome r1 = tx.execute(s -> idem.run(owner, "TEMPLATE_DEBIT", k, request, "debit_handler(jsonb)", null));
        Idem.Outcome r2 = tx.execute(s -> idem.run(owner, "TEMPLATE_DEBIT", k, request, "debit_handler(jsonb)", null));
        assertFalse(r1.replayed());
        assertTrue(r2.replayed());
        assertEquals(r1.body(), r2.body());
        assertEquals(70, count("SELECT balance FROM account WHERE id = ?", account));
        String op = "TEMPLATE_SHIP";
        String tk = key();
        Idem.Submission s1 = tx.execute(s -> idem.submit(owner, op, tk, "{\"order\": 7}", "{\"priority\": \"high\"}", null));
        Idem.Submission s2 = tx.execute(s -> idem.submit(owner, op, tk, "{\"order\": 7}", null, null));
        assertFalse(s1.replayed());
        assertEquals("PROCESSING", s1.status());
        assertTrue(s2.replayed());
        assertEquals(s1.taskId(), s2.taskId());
    }

    @Test
    @DisplayName("IdemTemplate.emit rolls back with the service's transaction; consume is true once per message")
    void emitAndConsume() throws Exception {
        String topic = "template-" + UUID.randomUUID();
        tx.execute(s -> {
            idem.emit(topic, "{\"order\": 1}", "order-1", Map.of());
            s.setRollbackOnly();
            return null;
        });
        assertEquals(0, count("SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = ?", topic));
        Long id = tx.execute(s -> idem.emit(topic, "{\"order\": 1}", "order-1", Map.of("kind", "created")));
        assertEquals(1, count("SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = ?", topic));
        String consumer = "template-consumer-" + UUID.randomUUID();
        Boolean once = tx.execute(s -> idem.consume(consumer, topic + "-" + id, null, null));
        Boolean twice = tx.execute(s -> idem.consume(consumer, topic + "-" + id, null, null));
        assertTrue(once);
        assertFalse(twice);
    }
}
