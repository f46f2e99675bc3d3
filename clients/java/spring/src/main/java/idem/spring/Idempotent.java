package idem.spring;

import java.lang.annotation.Documented;
import java.lang.annotation.ElementType;
import java.lang.annotation.Retention;
import java.lang.annotation.RetentionPolicy;
import java.lang.annotation.Target;

/**
 * An idempotent handler method ({@code @PostMapping}, {@code @PutMapping}, {@code @PatchMapping}):
 * a request with an {@code Idempotency-Key} header is claimed, handled and its answer stored in
 * one transaction of the application's transaction manager, which the handler's
 * {@code JdbcTemplate}, Spring Data JDBC and JPA writes join; a repeat gets the stored answer.
 * The HTTP contract is clients/CONTRACT.md's.
 */
@Documented
@Retention(RetentionPolicy.RUNTIME)
@Target(ElementType.METHOD)
public @interface Idempotent {
    /** The operation's name in idem ({@code ^[A-Za-z0-9_.:-]{1,64}$}), part of the key's scope. */
    String value();

    /**
     * The top-level body fields that are the request (the others do not count); empty: the whole
     * body. The fingerprint is idem_request_hash of the raw body, or of these fields.
     */
    String[] fields() default {};

    /**
     * The path variables that are part of the request ({@code POST /accounts/{id}/debit}: the same
     * key and body on two accounts are two requests). With them the request is the JSON object
     * {@code {"<variable>": "<value>", ..., "body": <the body or its fields>}}.
     */
    String[] pathVariables() default {};

    /** Is a request without the header refused (400)? If not, it runs without idem. */
    boolean keyRequired() default true;

    /** The transaction manager's bean name, with several; empty: the one. */
    String transactionManager() default "";

    /** The DataSource's bean name, with several; empty: the one. */
    String dataSource() default "";
}
