package shop;

/** The body of POST /api/orders: {"skuId": 1001, "quantity": 2}. */
public record CreateOrderRequest(Long skuId, Integer quantity) {
    boolean valid() {
        return skuId != null && quantity != null && quantity >= 1 && quantity <= 100;
    }
}
