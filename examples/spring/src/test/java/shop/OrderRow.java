package shop;

import org.springframework.data.annotation.Id;
import org.springframework.data.relational.core.mapping.Table;

/** The order row through Spring Data JDBC (test sources: the third way a handler writes). */
@Table("shop_order")
record OrderRow(@Id Long id, long ownerId, long skuId, int quantity) {
}
