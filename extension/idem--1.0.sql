/* idem--1.0.sql: the idempotency record, the demo order, and the protocol's API */

\echo Use "CREATE EXTENSION idem" to load this file. \quit

-- One row per (owner, operation, key): the claim, the request fingerprint and,
-- once the business write is done, the response snapshot that repeats replay.
CREATE TABLE @extschema@.idempotency_record (
    id              BIGSERIAL PRIMARY KEY,
    owner_id        BIGINT NOT NULL,
    operation       VARCHAR(64) NOT NULL,
    idempotency_key VARCHAR(128) NOT NULL,
    request_hash    CHAR(64) NOT NULL,
    status          VARCHAR(20) NOT NULL,
    http_status     INTEGER,
    response_json   JSONB,
    resource_id     BIGINT,
    created_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    updated_at      TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP,
    expires_at      TIMESTAMPTZ NOT NULL,
    CONSTRAINT uk_idempotency_scope UNIQUE (owner_id, operation, idempotency_key),
    -- pg_catalog's operator by name: an = for varchar planted in the target
    -- schema would otherwise win over pg_catalog's text = text
    CONSTRAINT ck_idempotency_status CHECK (
        status::pg_catalog.text OPERATOR(pg_catalog.=)
            ANY (ARRAY['PROCESSING', 'SUCCEEDED']::pg_catalog.text[]))
);
CREATE INDEX idx_idempotency_expire ON @extschema@.idempotency_record (expires_at);

COMMENT ON TABLE @extschema@.idempotency_record IS
    'idem: one claim per (owner_id, operation, idempotency_key), with the request fingerprint and the response to replay';

-- The demo business table: the order's own unique business id (order_no)
-- is the second layer of uniqueness.
CREATE TABLE @extschema@.purchase_order (
    id         BIGSERIAL PRIMARY KEY,
    order_no   VARCHAR(40) NOT NULL UNIQUE,
    owner_id   BIGINT NOT NULL,
    sku_id     BIGINT NOT NULL,
    quantity   INTEGER NOT NULL,
    status     VARCHAR(20) NOT NULL,
    created_at TIMESTAMPTZ NOT NULL DEFAULT CURRENT_TIMESTAMP
);

COMMENT ON TABLE @extschema@.purchase_order IS
    'idem: the demo order that idem_create_order inserts exactly once per idempotency key';

-- pg_dump must keep the rows (and the sequences' positions).
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_record', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.idempotency_record_id_seq', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.purchase_order', '');
SELECT pg_catalog.pg_extension_config_dump('@extschema@.purchase_order_id_seq', '');

-- Callers go through the functions below; the tables are not theirs to write.
REVOKE ALL ON TABLE @extschema@.idempotency_record, @extschema@.purchase_order FROM PUBLIC;

-- Lowercase hex SHA-256 of the RFC 8785 canonical form of a JSON value.
CREATE FUNCTION @extschema@.idem_request_hash(request jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_request_hash'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_request_hash(jsonb) IS
    'idem: lowercase hex SHA-256 of the RFC 8785 (JCS) canonical form of the request';

-- The RFC 8785 canonical text itself, the input of idem_request_hash.
CREATE FUNCTION @extschema@.idem_canonical_json(request jsonb)
RETURNS text
AS 'MODULE_PATHNAME', 'idem_canonical_json'
LANGUAGE C IMMUTABLE PARALLEL SAFE;

COMMENT ON FUNCTION @extschema@.idem_canonical_json(jsonb) IS
    'idem: the RFC 8785 (JCS) canonical serialization of a JSON value';

-- The article's order flow: claim, insert the order, store the response,
-- all in the caller's transaction; a repeat replays the stored response.
CREATE FUNCTION @extschema@.idem_create_order(
    owner bigint, key text, sku bigint, qty integer,
    OUT order_id bigint, OUT order_no text, OUT status text,
    OUT http_status integer, OUT replayed boolean)
RETURNS record
AS 'MODULE_PATHNAME', 'idem_create_order'
LANGUAGE C VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) IS
    'idem: create an order exactly once per (owner, idempotency key); repeats replay the first response';

REVOKE ALL ON FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer) FROM PUBLIC;

-- Batch deletion of expired records; never waits on a row another
-- transaction holds.
CREATE FUNCTION @extschema@.idem_cleanup_expired(
    batch_size integer DEFAULT 1000, max_batches integer DEFAULT NULL)
RETURNS bigint
AS 'MODULE_PATHNAME', 'idem_cleanup_expired'
LANGUAGE C VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp;

COMMENT ON FUNCTION @extschema@.idem_cleanup_expired(integer, integer) IS
    'idem: delete expired idempotency records in batches; returns how many were deleted';

REVOKE ALL ON FUNCTION @extschema@.idem_cleanup_expired(integer, integer) FROM PUBLIC;
