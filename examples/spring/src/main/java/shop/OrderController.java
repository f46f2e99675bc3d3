package shop;

import java.net.URI;
import java.util.Map;

import idem.spring.IdemRequests;
import idem.spring.Idempotent;
import org.springframework.http.ResponseEntity;
import org.springframework.transaction.annotation.Transactional;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestMapping;
import org.springframework.web.bind.annotation.RestController;

/**
 * POST /api/orders (the article's): one order per Idempotency-Key, the request being its skuId and
 * quantity. POST /api/jpa/orders: the same through Spring Data JPA.
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
    public ResponseEntity<?> create(@RequestBody CreateOrderRequest request) {
        if (!request.valid()) {             // a 400 the handler returns is stored and replayed
            return ResponseEntity.badRequest().body(
                Map.of("error", "skuId must be an integer and quantity one from 1 to 100"));
        }
        OrderResponse order = orders.create(IdemRequests.owner(), request);
        IdemRequests.resourceId(order.orderId());
        return ResponseEntity.created(URI.create("/api/orders/" + order.orderId())).body(order);
    }

    @PostMapping("/jpa/orders")
    @Idempotent(value = "CREATE_ORDER_JPA", fields = {"skuId", "quantity"})
    @Transactional
    public ResponseEntity<OrderResponse> createWithJpa(@RequestBody CreateOrderRequest request) {
        ShopOrder order = repository.save(new ShopOrder(IdemRequests.owner(), request.skuId(),
            request.quantity() == null ? 0 : request.quantity()));
        return ResponseEntity.created(URI.create("/api/orders/" + order.getId()))
            .body(new OrderResponse(order.getId(), order.getSkuId(), order.getQuantity(), "CREATED"));
    }
}
