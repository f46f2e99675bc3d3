package shop;

import com.fasterxml.jackson.databind.JsonNode;

/** The body of POST /api/orders: {"skuId": 1001, "quantity": 2}. */
public record CreateOrderRequest(long skuId, int quantity) {
    /** The request of a JSON body, or null when it is not a valid order (the other examples' rule). */
    static CreateOrderRequest of(JsonNode body) {
        JsonNode sku = body == null ? null : body.get("skuId");
        JsonNode qty = body == null ? null : body.get("quantity");
        if (sku == null || qty == null || !sku.isNumber() || !qty.isNumber()
            || !sku.canConvertToExactIntegral() || !qty.canConvertToExactIntegral()
            || !sku.canConvertToLong() || qty.asDouble() < 1 || qty.asDouble() > 100) {
            return null;
        }
        return new CreateOrderRequest(sku.asLong(), qty.asInt());
    }
}
