package shop;

import org.springframework.data.repository.CrudRepository;

/** Spring Data JDBC's repository of OrderRow (JPA keeps ShopOrderRepository: strict mode by entity). */
interface OrderRows extends CrudRepository<OrderRow, Long> {
}
