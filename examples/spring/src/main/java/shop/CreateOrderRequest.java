package shop;

import java.math.BigDecimal;
import java.math.BigInteger;
import java.util.Map;

/** The body of POST /api/orders: {"skuId": 1001, "quantity": 2}. */
public record CreateOrderRequest(long skuId, int quantity) {
    /**
     * The request of a JSON body (as Spring's JSON converter reads an object, Jackson 2 or 3), or
     * null when it is not a valid order (the other examples' rule: numbers with integer values,
     * 1.0 and 1e2 among them; a quantity from 1 to 100).
     */
    static CreateOrderRequest of(Map<String, Object> body) {
        BigInteger sku = integer(body == null ? null : body.get("skuId"));
        BigInteger qty = integer(body == null ? null : body.get("quantity"));
        if (sku == null || qty == null || sku.bitLength() > 63 || qty.compareTo(BigInteger.ONE) < 0
            || qty.compareTo(BigInteger.valueOf(100)) > 0) {
            return null;
        }
        return new CreateOrderRequest(sku.longValueExact(), qty.intValueExact());
    }

    private static BigInteger integer(Object value) {
        if (!(value instanceof Number n)) {
            return null;
        }
        BigDecimal d;
        try {
            d = new BigDecimal(n.toString());
        } catch (NumberFormatException e) {     // NaN, Infinity
            return null;
        }
        d = d.stripTrailingZeros();
        return d.scale() <= 0 ? d.toBigIntegerExact() : null;
    }
}
