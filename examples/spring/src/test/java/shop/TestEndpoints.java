package shop;

import java.util.concurrent.atomic.AtomicBoolean;

import idem.spring.IdemRequests;
import idem.spring.Idempotent;
import org.springframework.http.HttpStatus;
import org.springframework.http.ResponseEntity;
import org.springframework.jdbc.core.JdbcTemplate;
import org.springframework.stereotype.Service;
import org.springframework.transaction.annotation.Propagation;
import org.springframework.transaction.annotation.Transactional;
import org.springframework.web.bind.annotation.ExceptionHandler;
import org.springframework.web.bind.annotation.PatchMapping;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.PutMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RestController;
import org.springframework.web.bind.annotation.RestControllerAdvice;

/** Handlers that fail in the ways the tests need (test sources only). */
@RestController
class TestEndpoints {
    static final AtomicBoolean FAIL_NEXT = new AtomicBoolean();

    static final class OutOfStock extends RuntimeException {
        private static final long serialVersionUID = 1L;
    }

    private final OrderService orders;
    private final ShopOrderRepository repository;
    private final Audit audit;
    private final OrderRows rows;

    TestEndpoints(OrderService orders, ShopOrderRepository repository, Audit audit, OrderRows rows) {
        this.orders = orders;
        this.repository = repository;
        this.audit = audit;
        this.rows = rows;
    }

    /** The order through Spring Data JDBC; a quantity of 99 throws after the write (it must roll back). */
    @PostMapping("/api/test/data-jdbc/orders")
    @Idempotent(value = "CREATE_ORDER_DATA_JDBC", fields = {"skuId", "quantity"})
    ResponseEntity<OrderResponse> dataJdbc(@RequestBody CreateOrderRequest request) {
        OrderRow row = rows.save(new OrderRow(null, IdemRequests.owner(), request.skuId(), request.quantity()));
        if (request.quantity() == 99) {
            throw new IllegalStateException("failed after the Spring Data JDBC write");
        }
        IdemRequests.resourceId(row.id());
        return ResponseEntity.status(HttpStatus.CREATED)
            .body(new OrderResponse(row.id(), row.skuId(), row.quantity(), "CREATED"));
    }

    /** Writes the order, then throws when told to: the retry must execute. */
    @PostMapping("/api/test/flaky")
    @Idempotent("FLAKY")
    OrderResponse flaky(@RequestBody CreateOrderRequest request) {
        OrderResponse order = orders.create(IdemRequests.owner(), request);
        if (FAIL_NEXT.getAndSet(false)) {
            throw new IllegalStateException("the payment provider timed out");
        }
        return order;
    }

    /** Writes the order, then throws what the advice below answers 422 for. */
    @PostMapping("/api/test/advised")
    @Idempotent("ADVISED")
    OrderResponse advised(@RequestBody CreateOrderRequest request) {
        orders.create(IdemRequests.owner(), request);
        throw new OutOfStock();
    }

    /** A returned 4xx is an answer: stored and replayed. */
    @PostMapping("/api/test/refused")
    @Idempotent("REFUSED")
    ResponseEntity<String> refused(@RequestBody CreateOrderRequest request) {
        orders.create(IdemRequests.owner(), request);
        return ResponseEntity.status(HttpStatus.CONFLICT).body("{\"error\": \"duplicate order\"}");
    }

    /** A JPA write that breaks a CHECK only when flushed (an UPDATE of a managed entity). */
    @PostMapping("/api/test/flush")
    @Idempotent("FLUSH")
    @Transactional
    OrderResponse flush(@RequestBody CreateOrderRequest request) {
        ShopOrder order = repository.save(new ShopOrder(IdemRequests.owner(), request.skuId(), request.quantity()));
        order.setQuantity(500);                 // shop_order's CHECK: 1 to 100
        return new OrderResponse(order.getId(), order.getSkuId(), request.quantity(), "CREATED");
    }

    /** PUT and PATCH routes: the order of the path's cart, one per key. */
    @PutMapping("/api/test/carts/{cart}/order")
    @Idempotent(value = "PUT_ORDER", pathVariables = "cart")
    OrderResponse put(@PathVariable long cart, @RequestBody CreateOrderRequest request) {
        return orders.create(IdemRequests.owner(), request);
    }

    @PatchMapping("/api/test/carts/{cart}/order")
    @Idempotent(value = "PATCH_ORDER", pathVariables = "cart")
    OrderResponse patch(@PathVariable long cart, @RequestBody CreateOrderRequest request) {
        return orders.create(IdemRequests.owner(), request);
    }

    /** A REQUIRES_NEW write commits apart: it stays when the request fails. */
    @PostMapping("/api/test/requires-new")
    @Idempotent("REQUIRES_NEW")
    OrderResponse requiresNew(@RequestBody CreateOrderRequest request) {
        audit.write(IdemRequests.owner(), request);
        orders.create(IdemRequests.owner(), request);
        throw new IllegalStateException("failed after the audit row");
    }

    @RestControllerAdvice
    static class Advice {
        @ExceptionHandler(OutOfStock.class)
        ResponseEntity<String> outOfStock() {
            return ResponseEntity.unprocessableEntity().body("{\"error\": \"out of stock\"}");
        }
    }

    @Service
    static class Audit {
        private final JdbcTemplate jdbc;

        Audit(JdbcTemplate jdbc) {
            this.jdbc = jdbc;
        }

        @Transactional(propagation = Propagation.REQUIRES_NEW)
        public void write(long owner, CreateOrderRequest request) {
            jdbc.update("INSERT INTO shop_order (owner_id, sku_id, quantity) VALUES (?, ?, ?)",
                owner, request.skuId(), request.quantity());
        }
    }
}
