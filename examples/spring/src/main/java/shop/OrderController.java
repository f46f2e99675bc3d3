package shop;

import java.math.BigDecimal;
import java.net.URI;
import java.util.Map;

import idem.spring.IdemRequests;
import idem.spring.Idempotent;
import jakarta.servlet.http.Cookie;
import jakarta.servlet.http.HttpServletResponse;
import org.springframework.http.ResponseEntity;
import org.springframework.transaction.annotation.Transactional;
import org.springframework.web.bind.annotation.PathVariable;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * POST /api/orders (the article's): one order per Idempotency-Key, the request being its skuId and
 * quantity; POST /api/jpa/orders: the same through Spring Data JPA; POST /api/accounts/{id}/debit:
 * a debit of the account of the path (the same key on two accounts: two requests).
 */
@RestController
@RequestMapping("/api")
public class OrderController {
    private final OrderService orders;
    private final ShopOrderRepository repository;

    public OrderController(OrderService orders, ShopOrderRepository repository) {
        this.orders = orders;
        this.repository = repository;
    }

    @PostMapping("/orders")
    @Idempotent(value = "CREATE_ORDER", fields = {"skuId", "quantity"})
    public ResponseEntity<?> create(@RequestBody Map<String, Object> body, HttpServletResponse response) {
        CreateOrderRequest request = CreateOrderRequest.of(body);
        if (request == null) {              // a 400 the handler returns is an answer: stored and replayed
            return ResponseEntity.badRequest().body(
                Map.of("error", "skuId must be an integer and quantity one from 1 to 100"));
        }
        OrderResponse order = orders.create(IdemRequests.owner(), request);
        IdemRequests.resourceId(order.orderId());
        response.addCookie(new Cookie("last_order", Long.toString(order.orderId())));   // not replayed
        return ResponseEntity.created(URI.create("/api/orders/" + order.orderId())).body(order);
    }

    @PostMapping("/jpa/orders")
    @Idempotent(value = "CREATE_ORDER_JPA", fields = {"skuId", "quantity"})
    @Transactional
    public ResponseEntity<?> createWithJpa(@RequestBody Map<String, Object> body) {
        CreateOrderRequest request = CreateOrderRequest.of(body);
        if (request == null) {
            return ResponseEntity.badRequest().body(
                Map.of("error", "skuId must be an integer and quantity one from 1 to 100"));
        }
        ShopOrder order = repository.save(new ShopOrder(IdemRequests.owner(), request.skuId(), request.quantity()));
        IdemRequests.resourceId(order.getId());
        return ResponseEntity.created(URI.create("/api/orders/" + order.getId()))
            .body(new OrderResponse(order.getId(), order.getSkuId(), order.getQuantity(), "CREATED"));
    }

    /** The body of a debit: its amount, exactly as sent (never through a double). */
    public record DebitRequest(BigDecimal amount) {
    }

    @PostMapping("/accounts/{id}/debit")
    @Idempotent(value = "DEBIT", pathVariables = "id")
    public ResponseEntity<?> debit(@PathVariable long id, @RequestBody DebitRequest body) {
        if (body.amount() == null) {
            return ResponseEntity.badRequest().body(Map.of("error", "amount must be a number"));
        }
        OrderService.Debit d = orders.debit(id, body.amount());
        if (d == null) {
            return ResponseEntity.unprocessableEntity().body(Map.of("error", "insufficient funds"));
        }
        IdemRequests.resourceId(d.debitId());
        return ResponseEntity.created(URI.create("/api/debits/" + d.debitId())).body(d);
    }
}
