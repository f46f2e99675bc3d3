package shop;

/** The answer of POST /api/orders (201), stored by idem and replayed byte for byte. */
public record OrderResponse(long orderId, long skuId, int quantity, String status) {
}
