package shop;

import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Transactional;

/**
 * The business write, as a Spring team writes it: a @Transactional service on JdbcTemplate. Under
 * an @Idempotent handler it joins the request's transaction, so the order and idem's record
 * commit together.
 */
@Service
public class OrderService {
    private final JdbcTemplate jdbc;

    public OrderService(JdbcTemplate jdbc) {
        this.jdbc = jdbc;
    }

    /** A debit's answer (examples/schema.sql's debit_account). */
    public record Debit(long debitId, java.math.BigDecimal balance) {
    }

    /** The debit, or null for insufficient funds; an unknown account raises (nothing is stored). */
    @Transactional
    public Debit debit(long account, java.math.BigDecimal amount) {
        return jdbc.queryForObject("SELECT debit_id, balance FROM debit_account(?, ?)",
            (rs, n) -> rs.getObject(1) == null ? null : new Debit(rs.getLong(1), rs.getBigDecimal(2)), account, amount);
    }

    @Transactional
    public OrderResponse create(long owner, CreateOrderRequest request) {
        Long id = jdbc.queryForObject(
            "INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (?, ?, ?) RETURNING id",
            Long.class, owner, request.skuId(), request.quantity());
        return new OrderResponse(id, request.skuId(), request.quantity(), "CREATED");
    }
}
