package shop;

import jakarta.persistence.Column;
import jakarta.persistence.Entity;
import jakarta.persistence.GeneratedValue;
import jakarta.persistence.GenerationType;
import jakarta.persistence.Id;
import jakarta.persistence.Table;

/** The order row through JPA (examples/schema.sql's shop_order). */
@Entity
@Table(name = "shop_order")
public class ShopOrder {
    @Id
    @GeneratedValue(strategy = GenerationType.IDENTITY)
    private Long id;
    @Column(name = "owner_id", nullable = false)
    private long ownerId;
    @Column(name = "sku_id", nullable = false)
    private long skuId;
    @Column(nullable = false)
    private int quantity;

    protected ShopOrder() {
    }

    public ShopOrder(long ownerId, long skuId, int quantity) {
        this.ownerId = ownerId;
        this.skuId = skuId;
        this.quantity = quantity;
    }

    public Long getId() {
        return id;
    }

    public long getSkuId() {
        return skuId;
    }

    public int getQuantity() {
        return quantity;
    }

    public void setQuantity(int quantity) {
        this.quantity = quantity;
    }
}
