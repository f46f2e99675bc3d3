package shop;

import java.net.URI;
import java.util.Map;

import org.springframework.boot.autoconfigure.condition.ConditionalOnProperty;
import org.springframework.http.ResponseEntity;
import org.springframework.web.bind.annotation.PostMapping;
import org.springframework.web.bind.annotation.RequestBody;
import org.springframework.web.bind.annotation.RequestHeader;
import org.springframework.web.bind.annotation.RestController;

/**
 * POST /bare/orders (IDEM_BENCH=1 only): the same order without idem, in the service's own
 * transaction: test/bench/clients_bench.sh's baseline for the starter's overhead.
 */
@RestController
@ConditionalOnProperty("IDEM_BENCH")
public class BareOrderController {
    private final OrderService orders;

    public BareOrderController(OrderService orders) {
        this.orders = orders;
    }

    @PostMapping("/bare/orders")
    public ResponseEntity<?> create(@RequestHeader("X-Owner-Id") long owner, @RequestBody Map<String, Object> body) {
        CreateOrderRequest request = CreateOrderRequest.of(body);
        if (request == null) {
            return ResponseEntity.badRequest().body(
                Map.of("error", "skuId must be an integer and quantity one from 1 to 100"));
        }
        OrderResponse order = orders.create(owner, request);
        return ResponseEntity.created(URI.create("/api/orders/" + order.orderId())).body(order);
    }
}
