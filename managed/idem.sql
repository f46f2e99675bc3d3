-- idem's SQL edition: idem's API in SQL and PL/pgSQL, for a managed
-- PostgreSQL that loads no extension of ours (docs/managed.md).  The
-- preview slice: the article's order, idem_begin / idem_finish /
-- idem_finish_stored, the fingerprints, per-operation ttl and IK007
-- retention, the outbox in commit order, grants, the cleanup.
--
-- A role that owns schema "idem" (and no other role may CREATE in it), or
-- a member of that role, runs:
--     psql -v ON_ERROR_STOP=1 -f managed/idem.sql
-- in one transaction; nothing needs a superuser.  Every entry point runs
-- as that role (SECURITY DEFINER, search_path pg_catalog, pg_temp) and
-- names every object with its schema.

\set ON_ERROR_STOP 1
BEGIN;

-- Install as the schema's owner; refuse a schema another role owns or
-- can create in, and a database that is not UTF8.
DO $install$
DECLARE
    nsp_owner pg_catalog.oid;
    creators text;
BEGIN
    SELECT n.nspowner INTO nsp_owner FROM pg_catalog.pg_namespace n
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idem';
    IF NOT FOUND THEN
        RAISE EXCEPTION 'schema "idem" does not exist'
            USING ERRCODE = '3F000',
                  HINT = 'A DBA runs: CREATE ROLE idem_owner NOLOGIN; CREATE SCHEMA idem AUTHORIZATION idem_owner; GRANT idem_owner TO <the installing role>;';
    END IF;
    IF nsp_owner OPERATOR(pg_catalog.<>) (SELECT r.oid FROM pg_catalog.pg_roles r WHERE r.rolname OPERATOR(pg_catalog.=) current_user) THEN
        IF NOT pg_catalog.pg_has_role(current_user, nsp_owner, 'USAGE') THEN
            RAISE EXCEPTION 'schema "idem" is owned by role %, which % is not a member of', nsp_owner::pg_catalog.regrole, current_user
                USING ERRCODE = '55000',
                      HINT = 'Run the installer as the schema''s owner or a member of it.';
        END IF;
        EXECUTE pg_catalog.format('SET LOCAL ROLE %I', nsp_owner::pg_catalog.regrole::pg_catalog.text);
    END IF;
    SELECT pg_catalog.string_agg(CASE WHEN a.grantee OPERATOR(pg_catalog.=) 0 THEN 'PUBLIC'
                                      ELSE a.grantee::pg_catalog.regrole::pg_catalog.text END, ', ')
      INTO creators
      FROM pg_catalog.pg_namespace n, pg_catalog.aclexplode(n.nspacl) a
     WHERE n.nspname OPERATOR(pg_catalog.=) 'idem' AND a.privilege_type OPERATOR(pg_catalog.=) 'CREATE'
       AND a.grantee OPERATOR(pg_catalog.<>) nsp_owner;
    IF creators IS NOT NULL THEN
        RAISE EXCEPTION 'roles other than the owner of schema "idem" can create objects in it: %', creators
            USING ERRCODE = '55000',
                  DETAIL = 'A function or operator they plant there would run as idem''s owner.',
                  HINT = 'REVOKE CREATE ON SCHEMA idem FROM each of them, then install again.';
    END IF;
    IF pg_catalog.getdatabaseencoding() OPERATOR(pg_catalog.<>) 'UTF8' THEN
        RAISE EXCEPTION 'idem''s SQL edition needs a UTF8 database, not %', pg_catalog.getdatabaseencoding()
            USING ERRCODE = '55000';
    END IF;
    IF EXISTS (SELECT FROM pg_catalog.pg_class c JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) c.relnamespace
                WHERE n.nspname OPERATOR(pg_catalog.=) 'idem') THEN
        RAISE EXCEPTION 'schema "idem" is not empty'
            USING ERRCODE = '55000', HINT = 'The installer creates idem in an empty schema.';
    END IF;
END
$install$;
-- the DO block's SET LOCAL ROLE lasts for the transaction
SET LOCAL search_path = pg_catalog, pg_temp;

-- ===========================================================================
-- Records and the article's order
-- ===========================================================================

-- The C edition's record, with the claim's transaction (claim_xid) and
-- ttl: a claim is a PROCESSING row until idem_finish.
CREATE TABLE idem.idempotency_record (
    id              bigserial PRIMARY KEY,
    owner_id        bigint NOT NULL,
    operation       varchar(64) NOT NULL,
    idempotency_key varchar(128) NOT NULL,
    request_hash    char(64) NOT NULL,
    status          varchar(20) NOT NULL,
    http_status     integer,
    response_json   jsonb,
    resource_id     bigint,
    created_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    updated_at      timestamptz NOT NULL DEFAULT pg_catalog.now(),
    expires_at      timestamptz NOT NULL,
    response_body   json,
    response_headers jsonb,
    fingerprint_version smallint,
    response_header_list json,
    claim_xid       xid8,
    claim_ttl       interval,
    CONSTRAINT uk_idempotency_scope UNIQUE (owner_id, operation, idempotency_key),
    CONSTRAINT ck_idempotency_status CHECK (
        status::text OPERATOR(pg_catalog.=)
            ANY (ARRAY['PROCESSING', 'SUCCEEDED', 'FAILED_RETRYABLE', 'FAILED_FINAL']::text[]))
) WITH (fillfactor = 90);
CREATE INDEX idx_idempotency_expire ON idem.idempotency_record (expires_at);
-- what the commit's check (IK005) looks up: the transaction's open claims
-- (a predicate no other statement implies, so that only it uses the index)
CREATE INDEX idx_idempotency_claims ON idem.idempotency_record (claim_xid)
    WHERE http_status IS NULL AND status::text OPERATOR(pg_catalog.=) 'PROCESSING';

CREATE TABLE idem.purchase_order (
    id         bigserial PRIMARY KEY,
    order_no   varchar(40) NOT NULL UNIQUE,
    owner_id   bigint NOT NULL,
    sku_id     bigint NOT NULL,
    quantity   integer NOT NULL,
    status     varchar(20) NOT NULL,
    created_at timestamptz NOT NULL DEFAULT pg_catalog.now()
);

-- The audit fields of expired executions, kept until audit_until.
CREATE TABLE idem.idem_history (
    owner_id            bigint NOT NULL,
    operation           varchar(64) NOT NULL,
    idempotency_key     varchar(128) NOT NULL,
    record_id           bigint NOT NULL,
    request_hash        char(64) NOT NULL,
    fingerprint_version smallint,
    status              varchar(20) NOT NULL,
    http_status         integer,
    resource_id         bigint,
    created_at          timestamptz NOT NULL,
    updated_at          timestamptz NOT NULL,
    expires_at          timestamptz NOT NULL,
    archived_at         timestamptz NOT NULL,
    audit_until         timestamptz NOT NULL,
    CONSTRAINT pk_idem_history PRIMARY KEY (owner_id, record_id)
);
CREATE INDEX idem_history_key ON idem.idem_history (owner_id, operation, idempotency_key);
CREATE INDEX idem_history_audit_until ON idem.idem_history (audit_until);

-- The C edition's policy row; the SQL edition reads ttl, failure_ttl,
-- wait_timeout, audit_ttl and reuse_after_expiry.
CREATE TABLE idem.idem_policy (
    operation     text PRIMARY KEY CHECK (pg_catalog.length(operation) OPERATOR(pg_catalog.>=) 1 AND pg_catalog.length(operation) OPERATOR(pg_catalog.<=) 64
        AND operation OPERATOR(pg_catalog.!~) '[^A-Za-z0-9_.:-]'),
    ttl           interval,
    failure_ttl   interval,
    wait_timeout  interval,
    max_attempts  integer,
    retry_base    interval,
    retry_max     interval,
    redact        text[],
    key_format    text,
    reject_weak_keys boolean,
    updated_at    timestamptz NOT NULL DEFAULT pg_catalog.now(),
    audit_ttl     interval,
    reuse_after_expiry text
        CHECK (reuse_after_expiry OPERATOR(pg_catalog.=) ANY (ARRAY['execute', 'refuse']::text[]))
);

-- Which owners and operations a login role may act for, checked against
-- session_user; a role with no row acts for any.
CREATE TABLE idem.idem_binding (
    role_name  name PRIMARY KEY,
    owners     int8multirange,
    operations text[]
);

-- One row per transaction with open claims: its deferred trigger checks
-- them all at COMMIT (IK005).
CREATE TABLE idem.idem_claim_marker (
    xact xid8 PRIMARY KEY
);

REVOKE ALL ON TABLE idem.idempotency_record, idem.purchase_order, idem.idem_history,
    idem.idem_policy, idem.idem_binding, idem.idem_claim_marker FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem.idempotency_record_id_seq, idem.purchase_order_id_seq FROM PUBLIC;

-- What idem_create_order, idem_begin and idem_finish_stored return: the C
-- edition's types.
CREATE TYPE idem.idem_order_outcome AS (
    order_id    bigint,
    order_no    text,
    status      text,
    http_status integer,
    replayed    boolean
);
CREATE TYPE idem.idem_outcome AS (
    replayed    boolean,
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint,
    expires_at  timestamptz,
    header_list json
);
-- the claim's decision, internal
CREATE TYPE idem.idem_sql_claimed AS (
    replayed    boolean,
    record_id   bigint,
    http_status integer,
    body        json,
    headers     jsonb,
    resource_id bigint,
    expires_at  timestamptz,
    header_list json,
    response_json jsonb
);

-- ===========================================================================
-- Fingerprints: RFC 8785 canonical text and SHA-256, byte for byte the C
-- edition's
-- ===========================================================================

-- A member name's order key: COLLATE "C" on it orders names by UTF-16
-- code units, as RFC 8785 does.  UTF-8 bytes order by code point, which
-- differs only for U+E000..U+FFFF against the characters above U+FFFF
-- (surrogate pairs in UTF-16): those sort after them as U+10FFFF and
-- themselves, and U+10FFFF itself as U+10FFFF and U+0001.
CREATE FUNCTION idem.idem_sql_utf16_key(name text) RETURNS text
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT CASE WHEN name OPERATOR(pg_catalog.!~) '[\uE000-\uFFFF\U0010FFFF]' THEN name
           ELSE pg_catalog.regexp_replace(
                    pg_catalog.replace(name, pg_catalog.chr(1114111), pg_catalog.chr(1114111) OPERATOR(pg_catalog.||) pg_catalog.chr(1)),
                    '([\uE000-\uFFFF])', pg_catalog.chr(1114111) OPERATOR(pg_catalog.||) '\1', 'g')
           END;
END;

-- Is 0.digits * 10^n read back as d?  Never for a value beyond the double
-- range (which float8in refuses): past half an ulp above the largest
-- double, or below half the smallest.
CREATE FUNCTION idem.idem_sql_reads_back(digits text, n integer, d double precision) RETURNS boolean
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT CASE WHEN c OPERATOR(pg_catalog.>=) 1.797693134862315807937e308
                  OR c OPERATOR(pg_catalog.<=) 2.4703282292062327209e-324 THEN false
                ELSE c::double precision OPERATOR(pg_catalog.=) d END
      FROM (SELECT ('0.' OPERATOR(pg_catalog.||) digits OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) n)::numeric AS c) x;
END;

-- A JSON number as ECMAScript's Number::toString writes it (RFC 8785
-- 3.2.2.3): the shortest digits that read back, plain for 1e-7 <= |d| <
-- 1e21, else in exponent notation.  float8out's shortest digits (Ryu)
-- never take a candidate on the rounding boundary, which ECMAScript does
-- (1e23): one digit fewer is tried while one reads back.
CREATE FUNCTION idem.idem_sql_number(num numeric) RETURNS text
LANGUAGE plpgsql IMMUTABLE STRICT PARALLEL SAFE
SET search_path = pg_catalog, pg_temp
SET extra_float_digits = 1
AS $$
DECLARE
    d double precision;
    neg boolean;
    s text;
    mant text;
    digits text;
    n integer;
    k integer;
    t text;
    up text;
    ok_t boolean;
    ok_up boolean;
    point integer;
BEGIN
    IF pg_catalog.abs(num) OPERATOR(pg_catalog.>=) 1.7976931348623158e308 THEN
        RAISE EXCEPTION 'JSON number is out of range for canonical JSON'
            USING ERRCODE = '22003',
                  DETAIL = pg_catalog.format('RFC 8785 numbers must fit an IEEE 754 double; the number has %s characters.',
                                             pg_catalog.length(num::text)),
                  HINT = 'Send numbers outside the double range as JSON strings.';
    END IF;
    IF pg_catalog.abs(num) OPERATOR(pg_catalog.<) 2.4703282292062328e-324 THEN
        RETURN '0';
    END IF;
    d := num::double precision;
    IF d OPERATOR(pg_catalog.=) 0 THEN
        RETURN '0';
    END IF;
    neg := d OPERATOR(pg_catalog.<) 0;
    d := pg_catalog.abs(d);
    IF d OPERATOR(pg_catalog.<) 9007199254740992 AND d OPERATOR(pg_catalog.=) pg_catalog.floor(d) THEN
        RETURN CASE WHEN neg THEN '-' ELSE '' END OPERATOR(pg_catalog.||) d::bigint::text;
    END IF;
    -- float8out: "123.45", "0.001", "1.2345e+22", "1e-07"
    s := d::text;
    mant := pg_catalog.split_part(s, 'e', 1);
    n := COALESCE(NULLIF(pg_catalog.split_part(s, 'e', 2), '')::integer, 0);
    point := pg_catalog.strpos(mant OPERATOR(pg_catalog.||) '.', '.') OPERATOR(pg_catalog.-) 1;
    digits := pg_catalog.replace(mant, '.', '');
    n := n OPERATOR(pg_catalog.+) point;
    WHILE pg_catalog.left(digits, 1) OPERATOR(pg_catalog.=) '0' LOOP
        digits := pg_catalog.substr(digits, 2);
        n := n OPERATOR(pg_catalog.-) 1;
    END LOOP;
    digits := pg_catalog.rtrim(digits, '0');
    k := pg_catalog.length(digits);
    WHILE k OPERATOR(pg_catalog.>) 1 LOOP
        t := pg_catalog.left(digits, k OPERATOR(pg_catalog.-) 1);
        up := (t::numeric OPERATOR(pg_catalog.+) 1)::text;
        ok_t := idem.idem_sql_reads_back(t, n, d);
        IF pg_catalog.length(up) OPERATOR(pg_catalog.>) pg_catalog.length(t) THEN
            ok_up := idem.idem_sql_reads_back(up, n OPERATOR(pg_catalog.+) 1, d);
        ELSE
            ok_up := idem.idem_sql_reads_back(up, n, d);
        END IF;
        EXIT WHEN NOT ok_t AND NOT ok_up;
        IF ok_up AND (NOT ok_t OR pg_catalog.substr(digits, k, 1)::integer OPERATOR(pg_catalog.>=) 5) THEN
            IF pg_catalog.length(up) OPERATOR(pg_catalog.>) pg_catalog.length(t) THEN
                n := n OPERATOR(pg_catalog.+) 1;
            END IF;
            digits := pg_catalog.rtrim(up, '0');
        ELSE
            digits := pg_catalog.rtrim(t, '0');
        END IF;
        k := pg_catalog.length(digits);
    END LOOP;
    IF k OPERATOR(pg_catalog.<=) n AND n OPERATOR(pg_catalog.<=) 21 THEN
        s := digits OPERATOR(pg_catalog.||) pg_catalog.repeat('0', n OPERATOR(pg_catalog.-) k);
    ELSIF 0 OPERATOR(pg_catalog.<) n AND n OPERATOR(pg_catalog.<=) 21 THEN
        s := pg_catalog.left(digits, n) OPERATOR(pg_catalog.||) '.' OPERATOR(pg_catalog.||) pg_catalog.substr(digits, n OPERATOR(pg_catalog.+) 1);
    ELSIF -6 OPERATOR(pg_catalog.<) n AND n OPERATOR(pg_catalog.<=) 0 THEN
        s := '0.' OPERATOR(pg_catalog.||) pg_catalog.repeat('0', OPERATOR(pg_catalog.-) n) OPERATOR(pg_catalog.||) digits;
    ELSE
        s := pg_catalog.left(digits, 1)
             OPERATOR(pg_catalog.||) CASE WHEN k OPERATOR(pg_catalog.>) 1 THEN '.' OPERATOR(pg_catalog.||) pg_catalog.substr(digits, 2) ELSE '' END
             OPERATOR(pg_catalog.||) 'e' OPERATOR(pg_catalog.||) CASE WHEN n OPERATOR(pg_catalog.-) 1 OPERATOR(pg_catalog.>=) 0 THEN '+' ELSE '-' END
             OPERATOR(pg_catalog.||) pg_catalog.abs(n OPERATOR(pg_catalog.-) 1)::text;
    END IF;
    RETURN CASE WHEN neg THEN '-' ELSE '' END OPERATOR(pg_catalog.||) s;
END
$$;

-- The RFC 8785 (JCS) canonical text of a JSON value.  It and
-- idem_request_hash run as their caller and name everything with its
-- schema, so they need no SET of their own (which would keep them from
-- being inlined and cost a GUC save and restore per call).
CREATE FUNCTION idem.idem_canonical_json(request jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
DECLARE
    kind text := pg_catalog.jsonb_typeof(request);
BEGIN
    IF request IS NULL THEN
        RAISE EXCEPTION 'argument "request" must not be null' USING ERRCODE = '22004';
    ELSIF kind OPERATOR(pg_catalog.=) 'object' THEN
        RETURN '{' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(ARRAY(
            SELECT pg_catalog.to_json(e.key)::text OPERATOR(pg_catalog.||) ':' OPERATOR(pg_catalog.||) idem.idem_sql_canonical_member(e.value)
              FROM pg_catalog.jsonb_each(request) e
             ORDER BY CASE WHEN pg_catalog.octet_length(e.key) OPERATOR(pg_catalog.=) pg_catalog.length(e.key) THEN e.key
                      ELSE idem.idem_sql_utf16_key(e.key) END COLLATE "C"), ',') OPERATOR(pg_catalog.||) '}';
    ELSIF kind OPERATOR(pg_catalog.=) 'array' THEN
        RETURN '[' OPERATOR(pg_catalog.||) pg_catalog.array_to_string(ARRAY(
            SELECT idem.idem_sql_canonical_member(a.v)
              FROM pg_catalog.jsonb_array_elements(request) WITH ORDINALITY AS a (v, i) ORDER BY a.i), ',') OPERATOR(pg_catalog.||) ']';
    ELSIF kind OPERATOR(pg_catalog.=) 'string' THEN
        RETURN pg_catalog.to_json(request OPERATOR(pg_catalog.#>>) '{}'::text[])::text;
    ELSIF kind OPERATOR(pg_catalog.=) 'number' THEN
        RETURN idem.idem_sql_number(request::numeric);
    END IF;
    RETURN request::text;
END
$$;

-- A member's or element's canonical text, in the caller's query (inlined:
-- STABLE, no SET, not strict): jsonb writes a string (escape_json, as
-- to_json does), a boolean, null and an integer of at most 15 digits as
-- RFC 8785 does; other numbers and containers by their functions.
CREATE FUNCTION idem.idem_sql_canonical_member(v jsonb) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN CASE WHEN pg_catalog.jsonb_typeof(v) OPERATOR(pg_catalog.=) ANY (ARRAY['object', 'array']) THEN idem.idem_canonical_json(v)
            WHEN pg_catalog.jsonb_typeof(v) OPERATOR(pg_catalog.<>) 'number'
              OR (pg_catalog.length(v::text) OPERATOR(pg_catalog.<=) 15 AND v::text OPERATOR(pg_catalog.~) '^(-?[1-9][0-9]*|0)$') THEN v::text
            ELSE idem.idem_sql_number(v::numeric) END;

-- Lowercase hex SHA-256 of a canonical text, in the caller's expression
-- (inlined: STABLE as convert_to is, no SET).
CREATE FUNCTION idem.idem_sql_digest(canonical text) RETURNS text
LANGUAGE sql STABLE PARALLEL SAFE
RETURN pg_catalog.encode(pg_catalog.sha256(pg_catalog.convert_to(canonical, 'UTF8')), 'hex');

-- Lowercase hex SHA-256 of the canonical text.  PL/pgSQL: an IMMUTABLE
-- SQL function calling convert_to (STABLE) is never inlined.
CREATE FUNCTION idem.idem_request_hash(request jsonb) RETURNS text
LANGUAGE plpgsql IMMUTABLE PARALLEL SAFE
AS $$
BEGIN
    RETURN idem.idem_sql_digest(idem.idem_canonical_json(request));
END
$$;
-- ===========================================================================
-- Settings, bindings and checks
-- ===========================================================================

-- The server-wide settings the C edition reads from postgresql.conf
-- (superuser-only there): one row, written by idem's owner.  A session
-- sets idem_sql.ttl, idem_sql.failure_ttl and idem_sql.wait_timeout, as
-- the C edition's idem.ttl, idem.failure_ttl and idem.wait_timeout.
CREATE TABLE idem.idem_settings (
    one                boolean PRIMARY KEY DEFAULT true CHECK (one),
    max_ttl            interval NOT NULL DEFAULT interval '30 days',
    audit_ttl          interval NOT NULL DEFAULT interval '0',
    reuse_after_expiry text NOT NULL DEFAULT 'execute'
        CHECK (reuse_after_expiry OPERATOR(pg_catalog.=) ANY (ARRAY['execute', 'refuse']::text[]))
);
INSERT INTO idem.idem_settings DEFAULT VALUES;
REVOKE ALL ON TABLE idem.idem_settings FROM PUBLIC;

-- A session setting under idem_sql. as an interval: a bare number is in
-- unit (seconds or milliseconds), else an interval's text; default when
-- unset or empty.
CREATE FUNCTION idem.idem_sql_setting(name text, unit text, fallback interval) RETURNS interval
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    v text := pg_catalog.current_setting('idem_sql.' OPERATOR(pg_catalog.||) name, true);
    iv interval;
BEGIN
    IF v IS NULL OR v OPERATOR(pg_catalog.=) '' THEN
        RETURN fallback;
    ELSIF v OPERATOR(pg_catalog.~) '^[0-9]+$' THEN
        iv := (v OPERATOR(pg_catalog.||) ' ' OPERATOR(pg_catalog.||) unit)::interval;
    ELSIF v OPERATOR(pg_catalog.~) '^\s*[-+]?[0-9.]+\s*(ms|s|min|h|d|milliseconds?|seconds?|minutes?|hours?|days?)?\s*$' THEN
        iv := v::interval;
    ELSE
        iv := NULL;
    END IF;
    -- the C edition's ranges: ttls of at least 1 s, a wait not negative
    IF iv IS NULL OR iv OPERATOR(pg_catalog.<) interval '0'
       OR (unit OPERATOR(pg_catalog.=) 's' AND iv OPERATOR(pg_catalog.<) interval '1 s') THEN
        RAISE EXCEPTION 'invalid value for idem_sql.%: "%"', name, v
            USING ERRCODE = '22023',
                  HINT = CASE WHEN unit OPERATOR(pg_catalog.=) 's' THEN 'Give at least 1 second, such as 86400 or ''1d''.'
                              ELSE 'Give milliseconds, such as 5000 or ''5s''.' END;
    END IF;
    RETURN iv;
END
$$;

-- 22004 for a NULL argument, as the C edition words it.
CREATE FUNCTION idem.idem_sql_not_null(missing boolean, argname text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF missing THEN
        RAISE EXCEPTION 'argument "%" must not be null', argname USING ERRCODE = '22004';
    END IF;
END
$$;

-- The scope's checks, in the C edition's order: NULLs, the owner's
-- binding, the operation (1 to 64 characters of [A-Za-z0-9_.:-]), its
-- binding, the key (16 to 128 of [A-Za-z0-9_-], never echoed).
CREATE FUNCTION idem.idem_sql_check_scope(owner bigint, operation text, key text) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
BEGIN
    IF owner IS NULL OR operation IS NULL OR key IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN owner IS NULL THEN 'owner' WHEN operation IS NULL THEN 'operation' ELSE 'key' END
            USING ERRCODE = '22004';
    END IF;
    PERFORM idem.idem_sql_check_bound(owner, NULL);
    IF pg_catalog.length(operation) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length(operation) OPERATOR(pg_catalog.>) 64 THEN
        RAISE EXCEPTION 'operation must be 1 to 64 characters long'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The operation has %s characters.', pg_catalog.length(operation));
    END IF;
    IF operation OPERATOR(pg_catalog.~) '[^A-Za-z0-9_.:-]' THEN
        RAISE EXCEPTION 'operation may contain only letters A-Z and a-z, digits, "_", ".", ":" and "-"'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('Character %s of the operation is not allowed.',
                                             pg_catalog.length(pg_catalog.substring(operation, '^[A-Za-z0-9_.:-]*')) OPERATOR(pg_catalog.+) 1);
    END IF;
    PERFORM idem.idem_sql_check_bound(owner, operation);
    IF pg_catalog.length(key) OPERATOR(pg_catalog.<) 16 OR pg_catalog.length(key) OPERATOR(pg_catalog.>) 128 THEN
        RAISE EXCEPTION 'idempotency key must be 16 to 128 characters long'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The key has %s characters.', pg_catalog.length(key)),
                  HINT = 'Send one high-entropy key per business intent, such as a UUID or a ULID.';
    END IF;
    IF key OPERATOR(pg_catalog.~) '[^A-Za-z0-9_-]' THEN
        RAISE EXCEPTION 'idempotency key may contain only letters A-Z and a-z, digits, "_" and "-"'
            USING ERRCODE = '22023',
                  DETAIL = pg_catalog.format('Character %s of the key is not allowed.',
                                             pg_catalog.length(pg_catalog.substring(key, '^[A-Za-z0-9_-]*')) OPERATOR(pg_catalog.+) 1),
                  HINT = 'Send one high-entropy key per business intent, such as a UUID or a ULID.';
    END IF;
END
$$;

-- Does the scope pass idem_sql_check_scope's checks?  Inlined into the
-- entry points, which call that function (for its error) only when not.
CREATE FUNCTION idem.idem_sql_scope_valid(owner bigint, operation text, key text) RETURNS boolean
LANGUAGE sql IMMUTABLE PARALLEL SAFE
RETURN COALESCE(owner IS NOT NULL
                AND pg_catalog.length(key) OPERATOR(pg_catalog.>=) 16 AND pg_catalog.length(key) OPERATOR(pg_catalog.<=) 128
                AND key OPERATOR(pg_catalog.!~) '[^A-Za-z0-9_-]'
                AND pg_catalog.length(operation) OPERATOR(pg_catalog.>=) 1 AND pg_catalog.length(operation) OPERATOR(pg_catalog.<=) 64
                AND operation OPERATOR(pg_catalog.!~) '[^A-Za-z0-9_.:-]', false);

-- 42501 unless session_user's binding (idem_bind) allows owner and
-- operation (operation NULL: the owner alone).  session_user: neither SET
-- ROLE nor a non-superuser's SET SESSION AUTHORIZATION changes it.
CREATE FUNCTION idem.idem_sql_check_bound(owner bigint, operation text) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    b record;
BEGIN
    SELECT * INTO b FROM idem.idem_binding WHERE role_name OPERATOR(pg_catalog.=) session_user;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    IF b.owners IS NOT NULL AND NOT b.owners OPERATOR(pg_catalog.@>) owner THEN
        RAISE EXCEPTION 'owner % is not one this session may act for', owner
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Role %I is bound to owners %s (idem_bind).', session_user, b.owners),
                  HINT = 'idem''s owner binds a role to its owners with idem_bind.';
    END IF;
    IF operation IS NOT NULL AND b.operations IS NOT NULL AND NOT operation OPERATOR(pg_catalog.=) ANY (b.operations) THEN
        RAISE EXCEPTION 'operation "%" is not one this session may act for', operation
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('Role %I is bound to operations %s (idem_bind).', session_user, pg_catalog.array_to_string(b.operations, ',')),
                  HINT = 'idem''s owner binds a role to its operations with idem_bind.';
    END IF;
END
$$;

-- Bind a login role to owners ("7,9,100-199") and operations
-- ("CREATE_ORDER,SHIP"); NULL for either: any.  Both NULL: the binding goes.
CREATE FUNCTION idem.idem_bind(role name, owners text, operations text) RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    ranges int8multirange;
BEGIN
    PERFORM idem.idem_sql_not_null(role IS NULL, 'role');
    IF owners IS NOT NULL THEN
        IF owners OPERATOR(pg_catalog.!~) '^\s*-?[0-9]+(\s*-\s*-?[0-9]+)?(\s*,\s*-?[0-9]+(\s*-\s*-?[0-9]+)?)*\s*$' THEN
            RAISE EXCEPTION 'owners must be owners and ranges separated by commas, such as "7", "7,9" or "100-199"'
                USING ERRCODE = '22023';
        END IF;
        SELECT pg_catalog.range_agg(pg_catalog.int8range(
                   pg_catalog.split_part(r, '-', 1)::bigint,
                   COALESCE(NULLIF(pg_catalog.split_part(r, '-', 2), ''), pg_catalog.split_part(r, '-', 1))::bigint, '[]'))
          INTO ranges
          FROM pg_catalog.regexp_split_to_table(pg_catalog.replace(owners, ' ', ''), ',') r;
    END IF;
    IF owners IS NULL AND operations IS NULL THEN
        DELETE FROM idem.idem_binding WHERE role_name OPERATOR(pg_catalog.=) role;
        RETURN;
    END IF;
    INSERT INTO idem.idem_binding (role_name, owners, operations)
    VALUES (role, ranges, pg_catalog.string_to_array(pg_catalog.replace(operations, ' ', ''), ','))
    ON CONFLICT (role_name) DO UPDATE SET owners = EXCLUDED.owners, operations = EXCLUDED.operations;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_bind(name, text, text) FROM PUBLIC;

-- now + a call's ttl: 22023 unless positive and within max_ttl.
CREATE FUNCTION idem.idem_sql_check_ttl(ttl interval) RETURNS void
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    max_ttl interval;
BEGIN
    IF ttl IS NULL THEN
        RETURN;
    END IF;
    SELECT s.max_ttl INTO max_ttl FROM idem.idem_settings s;
    IF pg_catalog.now() OPERATOR(pg_catalog.+) ttl OPERATOR(pg_catalog.<=) pg_catalog.now() THEN
        RAISE EXCEPTION 'ttl must be positive'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has ttl %s.', ttl);
    END IF;
    IF pg_catalog.now() OPERATOR(pg_catalog.+) ttl OPERATOR(pg_catalog.>) (pg_catalog.now() OPERATOR(pg_catalog.+) max_ttl) THEN
        RAISE EXCEPTION 'ttl must not exceed idem''s max_ttl (%)', max_ttl
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has ttl %s.', ttl);
    END IF;
END
$$;

-- When a record of this status expires (C: idem_record_expiry): a 4xx
-- after the policy's failure_ttl, else idem_sql.failure_ttl (600 s); a
-- success after the call's ttl, else the policy's, else idem_sql.ttl
-- (86400 s).
CREATE FUNCTION idem.idem_sql_expiry(failed boolean, ttl interval, operation text) RETURNS timestamptz
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    p_ttl interval;
    p_failure interval;
BEGIN
    IF failed THEN
        SELECT p.failure_ttl INTO p_failure FROM idem.idem_policy p WHERE p.operation OPERATOR(pg_catalog.=) idem_sql_expiry.operation;
        RETURN pg_catalog.now() OPERATOR(pg_catalog.+) COALESCE(p_failure, idem.idem_sql_setting('failure_ttl', 's', interval '600 s'));
    END IF;
    IF ttl IS NULL THEN
        SELECT p.ttl INTO p_ttl FROM idem.idem_policy p WHERE p.operation OPERATOR(pg_catalog.=) idem_sql_expiry.operation;
    END IF;
    RETURN pg_catalog.now() OPERATOR(pg_catalog.+) COALESCE(ttl, p_ttl, idem.idem_sql_setting('ttl', 's', interval '86400 s'));
END
$$;

-- How long a claim waits for an in-flight original: the operation's
-- wait_timeout, else idem_sql.wait_timeout (ms, 5000); the caller's
-- lock_timeout if shorter; at least 1 ms (lock_timeout 0 waits for ever).
CREATE FUNCTION idem.idem_sql_wait(policy_wait interval) RETURNS text
LANGUAGE plpgsql STABLE
AS $$
DECLARE
    wait interval := COALESCE(policy_wait, idem.idem_sql_setting('wait_timeout', 'ms', interval '5 s'));
    ms bigint := pg_catalog.ceil(pg_catalog.date_part('epoch', wait) OPERATOR(pg_catalog.*) 1000)::bigint;
    caller text := pg_catalog.current_setting('lock_timeout');
    caller_ms bigint;
BEGIN
    caller_ms := pg_catalog.ceil(pg_catalog.date_part('epoch',
                     CASE WHEN caller OPERATOR(pg_catalog.~) '^[0-9]+$' THEN (caller OPERATOR(pg_catalog.||) ' ms')::interval
                          ELSE caller::interval END) OPERATOR(pg_catalog.*) 1000)::bigint;
    IF caller_ms OPERATOR(pg_catalog.>) 0 AND caller_ms OPERATOR(pg_catalog.<) ms THEN
        ms := caller_ms;
    END IF;
    RETURN GREATEST(ms, 1)::text OPERATOR(pg_catalog.||) 'ms';
END
$$;

-- ===========================================================================
-- The claim
-- ===========================================================================

-- The jsonb object of headers in json form: an object as it is, pairs with
-- the values of a repeated name joined by ", " under its first spelling.
CREATE FUNCTION idem.idem_sql_headers_of_list(list json) RETURNS jsonb
LANGUAGE sql IMMUTABLE STRICT
BEGIN ATOMIC
    SELECT CASE WHEN pg_catalog.json_typeof(list) OPERATOR(pg_catalog.=) 'object' THEN list::jsonb
           ELSE COALESCE((SELECT pg_catalog.jsonb_object_agg(g.name, g.value)
                  FROM (SELECT (pg_catalog.array_agg(p.pair OPERATOR(pg_catalog.->>) 0 ORDER BY p.i))[1] AS name,
                               pg_catalog.string_agg(p.pair OPERATOR(pg_catalog.->>) 1, ', ' ORDER BY p.i) AS value
                          FROM pg_catalog.json_array_elements(list) WITH ORDINALITY AS p (pair, i)
                         GROUP BY pg_catalog.lower(p.pair OPERATOR(pg_catalog.->>) 0)) g), '{}'::jsonb)
           END;
END;

-- 22023 for headers a server could not send (C: check_headers).
CREATE FUNCTION idem.idem_sql_check_header(name text, value text, what text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
BEGIN
    IF name OPERATOR(pg_catalog.=) '' THEN
        RAISE EXCEPTION '% must not hold an empty header name', what USING ERRCODE = '22023';
    END IF;
    IF name OPERATOR(pg_catalog.~) '[\r\n]' OR value OPERATOR(pg_catalog.~) '[\r\n]' THEN
        RAISE EXCEPTION '% must not hold a carriage return or a line feed in a header %', what,
            CASE WHEN name OPERATOR(pg_catalog.~) '[\r\n]' THEN 'name' ELSE 'value' END
            USING ERRCODE = '22023', DETAIL = 'A replay would split the response (HTTP response splitting).';
    END IF;
    IF name OPERATOR(pg_catalog.~) '[^!#$%&''*+.^_`|~0-9A-Za-z-]' THEN
        RAISE EXCEPTION '% must hold header names made of letters, digits and !#$%%&''*+-.^_`|~ only', what
            USING ERRCODE = '22023';
    END IF;
END
$$;

CREATE FUNCTION idem.idem_sql_check_headers(headers jsonb, header_list json) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    e record;
BEGIN
    IF headers IS NOT NULL THEN
        IF pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
            RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = '22023';
        END IF;
        FOR e IN SELECT * FROM pg_catalog.jsonb_each(headers) LOOP
            IF pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.<>) 'string' THEN
                RAISE EXCEPTION 'headers must be a JSON object of string values' USING ERRCODE = '22023';
            END IF;
            PERFORM idem.idem_sql_check_header(e.key, e.value OPERATOR(pg_catalog.->>) 0, 'headers');
        END LOOP;
    END IF;
    IF header_list IS NULL THEN
        RETURN;
    END IF;
    IF headers IS NOT NULL THEN
        RAISE EXCEPTION 'headers and header_list must not both be given'
            USING ERRCODE = '22023',
                  HINT = 'header_list (json) keeps the headers as given; headers (jsonb) is the older form.';
    END IF;
    IF pg_catalog.json_typeof(header_list) OPERATOR(pg_catalog.=) 'object' THEN
        FOR e IN SELECT * FROM pg_catalog.jsonb_each(header_list::jsonb) LOOP
            IF pg_catalog.jsonb_typeof(e.value) OPERATOR(pg_catalog.<>) 'string' THEN
                RAISE EXCEPTION 'header_list must be a JSON object of string values' USING ERRCODE = '22023';
            END IF;
            PERFORM idem.idem_sql_check_header(e.key, e.value OPERATOR(pg_catalog.->>) 0, 'header_list');
        END LOOP;
        RETURN;
    END IF;
    IF pg_catalog.json_typeof(header_list) OPERATOR(pg_catalog.<>) 'array' OR EXISTS (
        SELECT FROM pg_catalog.json_array_elements(header_list) p
         WHERE pg_catalog.json_typeof(p) OPERATOR(pg_catalog.<>) 'array' OR pg_catalog.json_array_length(p) OPERATOR(pg_catalog.<>) 2
            OR pg_catalog.json_typeof(p OPERATOR(pg_catalog.->) 0) OPERATOR(pg_catalog.<>) 'string'
            OR pg_catalog.json_typeof(p OPERATOR(pg_catalog.->) 1) OPERATOR(pg_catalog.<>) 'string') THEN
        RAISE EXCEPTION 'header_list must be a JSON object of string values or an array of [name, value] pairs of strings'
            USING ERRCODE = '22023',
                  HINT = 'A repeated header (two Set-Cookie) is two pairs: [["Set-Cookie", "a=1"], ["Set-Cookie", "b=2"]].';
    END IF;
    FOR e IN SELECT p OPERATOR(pg_catalog.->>) 0 AS n, p OPERATOR(pg_catalog.->>) 1 AS v FROM pg_catalog.json_array_elements(header_list) p LOOP
        PERFORM idem.idem_sql_check_header(e.n, e.v, 'header_list');
    END LOOP;
END
$$;

-- IK001, IK002 and IK007 as the C edition words them.
CREATE FUNCTION idem.idem_sql_refuse(code text, owner bigint, operation text, key text, why text) RETURNS void
LANGUAGE plpgsql IMMUTABLE
AS $$
DECLARE
    scope text := pg_catalog.format('Owner %s, operation %s, key "%s...": ', owner, operation, pg_catalog.left(key, 8));
BEGIN
    IF code OPERATOR(pg_catalog.=) 'IK001' THEN
        RAISE EXCEPTION 'idempotency key was already used with a different request'
            USING ERRCODE = 'IK001',
                  DETAIL = scope OPERATOR(pg_catalog.||) 'the stored request fingerprint differs from this request''s.',
                  HINT = 'Send a new idempotency key for a new request; an HTTP API answers 409 Conflict (or 422 Unprocessable Content).';
    ELSIF code OPERATOR(pg_catalog.=) 'IK002' THEN
        RAISE EXCEPTION 'a request with this idempotency key is still being processed'
            USING ERRCODE = 'IK002', DETAIL = scope OPERATOR(pg_catalog.||) why,
                  HINT = 'Retry the same request in about a second; an HTTP API answers 409 Conflict with Retry-After: 1.';
    END IF;
    RAISE EXCEPTION 'idempotency key expired'
        USING ERRCODE = 'IK007', DETAIL = scope OPERATOR(pg_catalog.||) why,
              HINT = 'The request was executed before and is not executed again. Send a new idempotency key for a new request; an HTTP API answers 422 Unprocessable Content.';
END
$$;

-- Decide a call: replay a finished record of the scope the statement's
-- snapshot sees (or refuse: IK001, IK002, IK007), else insert the claim,
-- a PROCESSING row, waiting at most idem_sql_wait() for an original in
-- flight (55P03 from this function's INSERT: the libraries' IK002).  A
-- claim this function opens (opens) is checked at COMMIT (IK005).
CREATE FUNCTION idem.idem_sql_claim(owner bigint, operation text, key text, fp text,
                                    ttl interval, opens boolean)
RETURNS idem.idem_sql_claimed
LANGUAGE plpgsql
AS $$
DECLARE
    rec record;
    pol record;
    until timestamptz;
    got bigint;
    saved text;
    result idem.idem_sql_claimed;
    expires timestamptz;
BEGIN
    FOR attempt IN 1..4 LOOP
        -- one read: the session's binding and the record
        SELECT b.role_name IS NOT NULL AS bound, b.owners, b.operations, r.id, r.request_hash, r.status, r.claim_xid, r.expires_at, r.http_status, r.response_body,
               r.response_headers, r.response_header_list, r.resource_id, r.response_json
          INTO rec
          FROM (SELECT) AS one
          LEFT JOIN idem.idem_binding b ON b.role_name OPERATOR(pg_catalog.=) session_user
          LEFT JOIN idem.idempotency_record r
                 ON r.owner_id OPERATOR(pg_catalog.=) owner AND r.operation::text OPERATOR(pg_catalog.=) idem_sql_claim.operation
                AND r.idempotency_key::text OPERATOR(pg_catalog.=) key;
        IF rec.bound AND ((rec.owners IS NOT NULL AND NOT rec.owners OPERATOR(pg_catalog.@>) owner)
                          OR (rec.operations IS NOT NULL AND NOT operation OPERATOR(pg_catalog.=) ANY (rec.operations))) THEN
            PERFORM idem.idem_sql_check_bound(owner, operation);
        END IF;
        IF rec.id IS NOT NULL AND rec.expires_at OPERATOR(pg_catalog.>=) pg_catalog.now() THEN
            IF rec.request_hash::text OPERATOR(pg_catalog.<>) fp THEN
                PERFORM idem.idem_sql_refuse('IK001', owner, operation, key, NULL);
            END IF;
            IF rec.status::text OPERATOR(pg_catalog.<>) ALL (ARRAY['SUCCEEDED', 'FAILED_FINAL']) THEN
                PERFORM idem.idem_sql_refuse('IK002', owner, operation, key,
                    CASE WHEN rec.claim_xid OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned()
                         THEN 'this transaction claimed the key and has not called idem_finish for it.'
                         ELSE 'the first request is recorded as still processing.' END);
            END IF;
            result := ROW(true, rec.id, rec.http_status, rec.response_body,
                          COALESCE(rec.response_headers, idem.idem_sql_headers_of_list(rec.response_header_list)),
                          rec.resource_id, rec.expires_at,
                          COALESCE(rec.response_header_list, rec.response_headers::text::json), rec.response_json);
            RETURN result;
        END IF;
        -- not a replay: the operation's policy and the settings
        IF attempt OPERATOR(pg_catalog.=) 1 THEN
            SELECT p.ttl AS p_ttl, p.wait_timeout AS p_wait,
                   COALESCE(p.reuse_after_expiry, s.reuse_after_expiry) OPERATOR(pg_catalog.=) 'refuse' AS refuses,
                   COALESCE(p.audit_ttl, s.audit_ttl) AS audit
              INTO pol
              FROM idem.idem_settings s
              LEFT JOIN idem.idem_policy p ON p.operation OPERATOR(pg_catalog.=) idem_sql_claim.operation;
        END IF;
        -- expired or gone: refused while in its audit period (reuse 'refuse')
        IF rec.id IS NOT NULL AND pol.refuses THEN
            until := rec.expires_at OPERATOR(pg_catalog.+) pol.audit;
            IF until OPERATOR(pg_catalog.>) pg_catalog.now() THEN
                PERFORM idem.idem_sql_refuse('IK007', owner, operation, key,
                    pg_catalog.format('its record expired at %s; the operation refuses the key until %s (reuse_after_expiry ''refuse'').', rec.expires_at, until));
            END IF;
        END IF;
        IF pol.refuses THEN
            SELECT h.audit_until INTO until FROM idem.idem_history h
             WHERE h.owner_id OPERATOR(pg_catalog.=) owner AND h.operation::text OPERATOR(pg_catalog.=) idem_sql_claim.operation
               AND h.idempotency_key::text OPERATOR(pg_catalog.=) key AND h.audit_until OPERATOR(pg_catalog.>) pg_catalog.now()
             ORDER BY h.audit_until DESC LIMIT 1;
            IF FOUND THEN
                PERFORM idem.idem_sql_refuse('IK007', owner, operation, key,
                    pg_catalog.format('an earlier execution of the key is in its audit period until %s (reuse_after_expiry ''refuse'').', until));
            END IF;
        END IF;
        expires := pg_catalog.now() OPERATOR(pg_catalog.+) COALESCE(ttl, pol.p_ttl, idem.idem_sql_setting('ttl', 's', interval '86400 s'));
        -- the bounded wait: for the row of an original in flight, whether
        -- it holds the expired record (deleting it) or the new claim
        saved := pg_catalog.current_setting('lock_timeout');
        PERFORM pg_catalog.set_config('lock_timeout', idem.idem_sql_wait(pol.p_wait), true);
        IF rec.id IS NOT NULL THEN
            -- the expired record goes (its audit fields to the history);
            -- another may have taken it first: look again
            PERFORM idem.idem_sql_archive(rec.id, rec.expires_at);
        END IF;
        INSERT INTO idem.idempotency_record AS r
               (owner_id, operation, idempotency_key, request_hash, status, expires_at, claim_xid, claim_ttl)
        VALUES (owner, operation, key, fp, 'PROCESSING',
                expires, pg_catalog.pg_current_xact_id(), ttl)
        ON CONFLICT ON CONSTRAINT uk_idempotency_scope DO NOTHING
        RETURNING r.id INTO got;
        PERFORM pg_catalog.set_config('lock_timeout', saved, true);
        IF got IS NOT NULL THEN
            IF opens AND pg_catalog.current_setting('idem_sql.marker', true) IS DISTINCT FROM pg_catalog.pg_current_xact_id()::text THEN
                PERFORM pg_catalog.set_config('idem_sql.claiming', 'on', true);
                INSERT INTO idem.idem_claim_marker (xact) VALUES (pg_catalog.pg_current_xact_id())
                ON CONFLICT (xact) DO NOTHING;
                PERFORM pg_catalog.set_config('idem_sql.claiming', 'off', true);
                PERFORM pg_catalog.set_config('idem_sql.marker', pg_catalog.pg_current_xact_id()::text, true);
            END IF;
            result := ROW(false, got, NULL, NULL, NULL, NULL, expires, NULL, NULL);
            RETURN result;
        END IF;
    END LOOP;
    RAISE EXCEPTION 'could not claim idempotency key: its record kept changing'
        USING ERRCODE = '40001', HINT = 'Retry the transaction.';
END
$$;

-- Move an expired record to the history (its audit fields, while its
-- operation keeps them) and delete it; false if another changed it first.
CREATE FUNCTION idem.idem_sql_archive(record_id bigint, expired_at timestamptz) RETURNS boolean
LANGUAGE plpgsql
AS $$
DECLARE
    rec idem.idempotency_record;
    until timestamptz;
BEGIN
    DELETE FROM idem.idempotency_record r
     WHERE r.id OPERATOR(pg_catalog.=) record_id AND r.expires_at OPERATOR(pg_catalog.=) expired_at
    RETURNING r.* INTO rec;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    until := rec.expires_at OPERATOR(pg_catalog.+) COALESCE(
        (SELECT p.audit_ttl FROM idem.idem_policy p WHERE p.operation OPERATOR(pg_catalog.=) rec.operation::text),
        (SELECT s.audit_ttl FROM idem.idem_settings s));
    IF until OPERATOR(pg_catalog.>) pg_catalog.now() THEN
        INSERT INTO idem.idem_history (owner_id, operation, idempotency_key, record_id, request_hash,
                                       fingerprint_version, status, http_status, resource_id,
                                       created_at, updated_at, expires_at, archived_at, audit_until)
        VALUES (rec.owner_id, rec.operation, rec.idempotency_key, rec.id, rec.request_hash,
                rec.fingerprint_version, rec.status, rec.http_status, rec.resource_id,
                rec.created_at, rec.updated_at, rec.expires_at, pg_catalog.now(), until)
        ON CONFLICT ON CONSTRAINT pk_idem_history DO NOTHING;
    END IF;
    RETURN true;
END
$$;

-- IK005: at COMMIT (and PREPARE) a claim of the transaction still
-- PROCESSING.  One event per transaction: its marker row's.
CREATE FUNCTION idem.idem_sql_check_claims() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rec record;
BEGIN
    IF pg_catalog.current_setting('idem_sql.claiming', true) OPERATOR(pg_catalog.=) 'on' THEN
        RAISE EXCEPTION 'idem''s check of unfinished claims must stay deferred'
            USING ERRCODE = 'IK005',
                  DETAIL = 'SET CONSTRAINTS ALL IMMEDIATE (or idem.idem_check_claims IMMEDIATE) makes the SQL edition check each claim at the end of its own statement, before idem_finish can store its result.',
                  HINT = 'Set only your own constraints IMMEDIATE, by name (docs/managed.md).';
    END IF;
    SELECT r.owner_id, r.operation, r.idempotency_key INTO rec
      FROM idem.idempotency_record r
     WHERE r.claim_xid OPERATOR(pg_catalog.=) NEW.xact
       AND r.http_status IS NULL AND r.status::text OPERATOR(pg_catalog.=) 'PROCESSING'
     LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'transaction claimed an idempotency key and did not finish it'
            USING ERRCODE = 'IK005',
                  DETAIL = pg_catalog.format('Owner %s, operation %s, key "%s...": idem_begin claimed it, idem_finish was not called.',
                                             rec.owner_id, rec.operation, pg_catalog.left(rec.idempotency_key, 8)),
                  HINT = 'Call idem_finish for the key before COMMIT, or roll back.';
    END IF;
    DELETE FROM idem.idem_claim_marker m WHERE m.xact OPERATOR(pg_catalog.=) NEW.xact;
    PERFORM pg_catalog.set_config('idem_sql.marker', '', true);
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER idem_check_claims AFTER INSERT ON idem.idem_claim_marker
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idem.idem_sql_check_claims();

-- ===========================================================================
-- The generic API and the article's order
-- ===========================================================================

-- Claim a key for the caller's transaction, or replay its finished result.
CREATE FUNCTION idem.idem_begin(
    owner bigint, operation text, key text, request jsonb,
    ttl interval DEFAULT NULL)
RETURNS idem.idem_outcome
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c idem.idem_sql_claimed;
    result idem.idem_outcome;
BEGIN
    -- the scope's checks, written out only when one fails
    IF NOT idem.idem_sql_scope_valid(owner, operation, key) THEN
        PERFORM idem.idem_sql_check_scope(owner, operation, key);
    END IF;
    -- the binding (else checked by the claim's read) before the request and ttl
    IF request IS NULL OR ttl IS NOT NULL THEN
        PERFORM idem.idem_sql_check_bound(owner, operation);
        PERFORM idem.idem_sql_not_null(request IS NULL, 'request');
        PERFORM idem.idem_sql_check_ttl(ttl);
    END IF;
    c := idem.idem_sql_claim(owner, operation, key,
             idem.idem_sql_digest(idem.idem_canonical_json(request)), ttl, true);
    result := ROW(c.replayed, c.http_status, c.body, c.headers, c.resource_id, c.expires_at, c.header_list);
    RETURN result;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_begin(bigint, text, text, jsonb, interval) FROM PUBLIC;

-- Store the result of the claim this transaction holds: the record as
-- stored, as a replay returns it (replayed false).
CREATE FUNCTION idem.idem_finish_stored(
    owner bigint, operation text, key text, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS idem.idem_outcome
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    rec idem.idempotency_record;
    result idem.idem_outcome;
BEGIN
    -- the scope's checks, written out only when one fails
    IF NOT idem.idem_sql_scope_valid(owner, operation, key) THEN
        PERFORM idem.idem_sql_check_scope(owner, operation, key);
    END IF;
    PERFORM idem.idem_sql_check_bound(owner, operation);
    PERFORM idem.idem_sql_not_null(http_status IS NULL, 'http_status');
    IF http_status OPERATOR(pg_catalog.<) 200 OR http_status OPERATOR(pg_catalog.>) 499 THEN
        RAISE EXCEPTION 'http_status must be between 200 and 499'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The result has http_status %s.', http_status),
                  HINT = 'A 5xx failure is transient: roll back, and the key stays retryable.';
    END IF;
    PERFORM idem.idem_sql_check_headers(headers, header_list);
    UPDATE idem.idempotency_record r
       SET status = CASE WHEN idem_finish_stored.http_status OPERATOR(pg_catalog.<) 400 THEN 'SUCCEEDED' ELSE 'FAILED_FINAL' END,
           http_status = idem_finish_stored.http_status,
           response_body = body,
           resource_id = idem_finish_stored.resource_id,
           response_headers = headers,
           response_header_list = header_list,
           updated_at = pg_catalog.now(),
           expires_at = idem.idem_sql_expiry(idem_finish_stored.http_status OPERATOR(pg_catalog.>=) 400, r.claim_ttl, idem_finish_stored.operation)
     WHERE r.owner_id OPERATOR(pg_catalog.=) owner AND r.operation::text OPERATOR(pg_catalog.=) idem_finish_stored.operation
       AND r.idempotency_key::text OPERATOR(pg_catalog.=) key AND r.status::text OPERATOR(pg_catalog.=) 'PROCESSING'
       -- as text: found through the key's index, never the index of claims
       AND r.claim_xid::text OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned()::text
    RETURNING r.* INTO rec;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'this transaction holds no unfinished claim of the idempotency key'
            USING ERRCODE = 'IK003',
                  DETAIL = pg_catalog.format('Owner %s, operation %s, key "%s...": ', owner, operation, pg_catalog.left(key, 8))
                           OPERATOR(pg_catalog.||) CASE WHEN EXISTS (
                               SELECT FROM idem.idempotency_record r
                                WHERE r.owner_id OPERATOR(pg_catalog.=) owner AND r.operation::text OPERATOR(pg_catalog.=) idem_finish_stored.operation
                                  AND r.idempotency_key::text OPERATOR(pg_catalog.=) key
                                  AND r.claim_xid OPERATOR(pg_catalog.=) pg_catalog.pg_current_xact_id_if_assigned())
                               THEN 'idem_finish was already called for it.'
                               ELSE 'idem_begin did not claim it in this transaction.' END,
                  HINT = 'Call idem_begin first, in the same transaction, and finish only when it returned replayed = false.';
    END IF;
    result := ROW(false, rec.http_status, rec.response_body,
                  COALESCE(rec.response_headers, idem.idem_sql_headers_of_list(rec.response_header_list)),
                  rec.resource_id, rec.expires_at,
                  COALESCE(rec.response_header_list, rec.response_headers::text::json));
    RETURN result;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json) FROM PUBLIC;

CREATE FUNCTION idem.idem_finish(
    owner bigint, operation text, key text, http_status integer, body json,
    resource_id bigint DEFAULT NULL, headers jsonb DEFAULT NULL,
    header_list json DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    PERFORM idem.idem_finish_stored(owner, operation, key, http_status, body, resource_id, headers, header_list);
END
$$;
REVOKE ALL ON FUNCTION idem.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json) FROM PUBLIC;

-- The article's order flow: claim, insert the order, store the response,
-- in the caller's transaction; a repeat replays the stored response.
CREATE FUNCTION idem.idem_create_order(owner bigint, key text, sku bigint, qty integer)
RETURNS idem.idem_order_outcome
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    c idem.idem_sql_claimed;
    order_id bigint;
    order_no text;
    response jsonb;
    result idem.idem_order_outcome;
BEGIN
    -- the C edition's order: NULLs, the binding, the key, the request
    IF owner IS NULL OR key IS NULL OR sku IS NULL OR qty IS NULL THEN
        PERFORM idem.idem_sql_not_null(true, CASE WHEN owner IS NULL THEN 'owner' WHEN key IS NULL THEN 'key'
                                                  WHEN sku IS NULL THEN 'sku' ELSE 'qty' END);
    END IF;
    IF NOT idem.idem_sql_scope_valid(owner, 'CREATE_ORDER', key)
       OR qty OPERATOR(pg_catalog.<) 1 OR qty OPERATOR(pg_catalog.>) 100
       OR sku OPERATOR(pg_catalog.<) -9007199254740991 OR sku OPERATOR(pg_catalog.>) 9007199254740991 THEN
        PERFORM idem.idem_sql_check_scope(owner, 'CREATE_ORDER', key);
    END IF;
    IF qty OPERATOR(pg_catalog.<) 1 OR qty OPERATOR(pg_catalog.>) 100 THEN
        RAISE EXCEPTION 'qty must be between 1 and 100'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The request has qty %s.', qty);
    END IF;
    IF sku OPERATOR(pg_catalog.<) -9007199254740991 OR sku OPERATOR(pg_catalog.>) 9007199254740991 THEN
        RAISE EXCEPTION 'sku must be between -9007199254740991 and 9007199254740991'
            USING ERRCODE = '22023',
                  DETAIL = 'The request fingerprint holds sku as a JSON number, exact only up to 2^53 - 1.';
    END IF;
    c := idem.idem_sql_claim(owner, 'CREATE_ORDER', key,
                             idem.idem_sql_digest(pg_catalog.format('{"qty":%s,"sku":%s}', qty, sku)),
                             NULL, false);
    IF c.replayed THEN
        result := ROW((c.response_json OPERATOR(pg_catalog.->>) 'orderId')::bigint,
                      c.response_json OPERATOR(pg_catalog.->>) 'orderNo',
                      c.response_json OPERATOR(pg_catalog.->>) 'status', c.http_status, true);
        RETURN result;
    END IF;
    order_id := pg_catalog.nextval('idem.purchase_order_id_seq'::pg_catalog.regclass);
    order_no := 'ORD-' OPERATOR(pg_catalog.||) pg_catalog.lpad(order_id::text, GREATEST(12, pg_catalog.length(order_id::text)), '0');
    INSERT INTO idem.purchase_order (id, order_no, owner_id, sku_id, quantity, status, created_at)
    VALUES (order_id, order_no, owner, sku, qty, 'CREATED', pg_catalog.now());
    response := pg_catalog.jsonb_build_object('orderId', order_id, 'orderNo', order_no, 'status', 'CREATED');
    UPDATE idem.idempotency_record r
       SET status = 'SUCCEEDED', http_status = 201, response_json = response, resource_id = order_id,
           updated_at = pg_catalog.now()
     WHERE r.id OPERATOR(pg_catalog.=) c.record_id;
    result := ROW(order_id, order_no, 'CREATED', 201, false);
    RETURN result;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_create_order(bigint, text, bigint, integer) FROM PUBLIC;

-- ===========================================================================
-- Policies, retention and the cleanup
-- ===========================================================================

-- idem_set_policy(operation, ...): every argument after operation named and
-- optional; omitted: unchanged; NULL: the setting.  The SQL edition keeps
-- ttl, failure_ttl, wait_timeout, audit_ttl and reuse_after_expiry; the
-- others are refused (0A000) until it has them.
CREATE FUNCTION idem.idem_set_policy(
    operation text,
    ttl interval DEFAULT interval '-178000000 years',
    failure_ttl interval DEFAULT interval '-178000000 years',
    wait_timeout interval DEFAULT interval '-178000000 years',
    max_attempts integer DEFAULT -2147483648,
    retry_base interval DEFAULT interval '-178000000 years',
    retry_max interval DEFAULT interval '-178000000 years',
    audit_ttl interval DEFAULT interval '-178000000 years',
    reuse_after_expiry text DEFAULT '<unchanged>',
    redact text[] DEFAULT ARRAY['<unchanged>'],
    key_format text DEFAULT '<unchanged>',
    reject_weak_keys boolean DEFAULT NULL,
    uncertain text DEFAULT '<unchanged>',
    reconcile_within interval DEFAULT interval '-178000000 years')
RETURNS idem.idem_policy
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    keep constant interval := interval '-178000000 years';
    p idem.idem_policy;
BEGIN
    PERFORM idem.idem_sql_not_null(operation IS NULL, 'operation');
    IF operation OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,64}$' THEN
        RAISE EXCEPTION 'operation must be 1 to 64 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF max_attempts IS DISTINCT FROM -2147483648 OR retry_base IS DISTINCT FROM keep OR retry_max IS DISTINCT FROM keep
       OR redact IS DISTINCT FROM ARRAY['<unchanged>'] OR key_format IS DISTINCT FROM '<unchanged>' OR reject_weak_keys IS NOT NULL
       OR uncertain IS DISTINCT FROM '<unchanged>' OR reconcile_within IS DISTINCT FROM keep THEN
        RAISE EXCEPTION 'idem''s SQL edition has no policy of tasks, redaction or key formats yet'
            USING ERRCODE = '0A000', HINT = 'It keeps ttl, failure_ttl, wait_timeout, audit_ttl and reuse_after_expiry (docs/managed.md).';
    END IF;
    IF (ttl IS DISTINCT FROM keep AND ttl OPERATOR(pg_catalog.<=) interval '0')
       OR (failure_ttl IS DISTINCT FROM keep AND failure_ttl OPERATOR(pg_catalog.<=) interval '0') THEN
        RAISE EXCEPTION '% must be positive', CASE WHEN ttl OPERATOR(pg_catalog.<=) interval '0' THEN 'ttl' ELSE 'failure_ttl' END
            USING ERRCODE = '22023';
    END IF;
    IF (wait_timeout IS DISTINCT FROM keep AND wait_timeout OPERATOR(pg_catalog.<) interval '0')
       OR (audit_ttl IS DISTINCT FROM keep AND audit_ttl OPERATOR(pg_catalog.<) interval '0') THEN
        RAISE EXCEPTION '% must not be negative', CASE WHEN wait_timeout OPERATOR(pg_catalog.<) interval '0' THEN 'wait_timeout' ELSE 'audit_ttl' END
            USING ERRCODE = '22023';
    END IF;
    IF reuse_after_expiry IS DISTINCT FROM '<unchanged>' AND reuse_after_expiry OPERATOR(pg_catalog.<>) ALL (ARRAY['execute', 'refuse']) THEN
        RAISE EXCEPTION 'reuse_after_expiry must be ''execute'' or ''refuse'''
            USING ERRCODE = '22023';
    END IF;
    INSERT INTO idem.idem_policy AS t (operation) VALUES (operation)
    ON CONFLICT ON CONSTRAINT idem_policy_pkey DO NOTHING;
    UPDATE idem.idem_policy t
       SET ttl = CASE WHEN idem_set_policy.ttl IS DISTINCT FROM keep THEN idem_set_policy.ttl ELSE t.ttl END,
           failure_ttl = CASE WHEN idem_set_policy.failure_ttl IS DISTINCT FROM keep THEN idem_set_policy.failure_ttl ELSE t.failure_ttl END,
           wait_timeout = CASE WHEN idem_set_policy.wait_timeout IS DISTINCT FROM keep THEN idem_set_policy.wait_timeout ELSE t.wait_timeout END,
           audit_ttl = CASE WHEN idem_set_policy.audit_ttl IS DISTINCT FROM keep THEN idem_set_policy.audit_ttl ELSE t.audit_ttl END,
           reuse_after_expiry = CASE WHEN idem_set_policy.reuse_after_expiry IS DISTINCT FROM '<unchanged>' THEN idem_set_policy.reuse_after_expiry ELSE t.reuse_after_expiry END,
           updated_at = pg_catalog.now()
     WHERE t.operation OPERATOR(pg_catalog.=) idem_set_policy.operation
    RETURNING t.* INTO p;
    RETURN p;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_set_policy(text, interval, interval, interval, integer, interval, interval, interval, text, text[], text, boolean, text, interval) FROM PUBLIC;

CREATE FUNCTION idem.idem_drop_policy(operation text) RETURNS boolean
LANGUAGE sql STRICT
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    WITH d AS (DELETE FROM idem.idem_policy p WHERE p.operation OPERATOR(pg_catalog.=) idem_drop_policy.operation RETURNING 1)
    SELECT EXISTS (SELECT FROM d);
END;
REVOKE ALL ON FUNCTION idem.idem_drop_policy(text) FROM PUBLIC;

-- The server-wide settings (max_ttl, audit_ttl, reuse_after_expiry):
-- omitted or NULL leaves one as it is.
CREATE FUNCTION idem.idem_configure(max_ttl interval DEFAULT NULL, audit_ttl interval DEFAULT NULL,
                                    reuse_after_expiry text DEFAULT NULL)
RETURNS idem.idem_settings
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    UPDATE idem.idem_settings s
       SET max_ttl = COALESCE(idem_configure.max_ttl, s.max_ttl),
           audit_ttl = COALESCE(idem_configure.audit_ttl, s.audit_ttl),
           reuse_after_expiry = COALESCE(idem_configure.reuse_after_expiry, s.reuse_after_expiry)
    RETURNING s.*;
END;
REVOKE ALL ON FUNCTION idem.idem_configure(interval, interval, text) FROM PUBLIC;

-- Batch deletion of expired records (their audit fields to the history,
-- while their operation keeps them) and of history past its audit period;
-- never waits on a row another transaction holds.  In a transaction of its
-- own (READ COMMITTED): under REPEATABLE READ a record another transaction
-- changed since the snapshot fails it with 40001.  For pg_cron
-- (cron.schedule('idem', '* * * * *', 'SELECT idem.idem_cleanup_expired()'))
-- or the application.
CREATE FUNCTION idem.idem_cleanup_expired(batch_size integer DEFAULT 1000, max_batches integer DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    total bigint := 0;
    n bigint;
    batches integer := 0;
BEGIN
    PERFORM idem.idem_sql_not_null(batch_size IS NULL, 'batch_size');
    IF batch_size OPERATOR(pg_catalog.<) 1 OR max_batches OPERATOR(pg_catalog.<) 1 THEN
        RAISE EXCEPTION '% must be positive', CASE WHEN batch_size OPERATOR(pg_catalog.<) 1 THEN 'batch_size' ELSE 'max_batches' END
            USING ERRCODE = '22023';
    END IF;
    LOOP
        EXIT WHEN max_batches IS NOT NULL AND batches OPERATOR(pg_catalog.>=) max_batches;
        WITH due AS (
            SELECT r.id FROM idem.idempotency_record r
             WHERE r.expires_at OPERATOR(pg_catalog.<) pg_catalog.now()
               AND r.status::text OPERATOR(pg_catalog.<>) 'PROCESSING'
             ORDER BY r.expires_at
             LIMIT batch_size
               FOR UPDATE SKIP LOCKED
        ), gone AS (
            DELETE FROM idem.idempotency_record r USING due
             WHERE r.id OPERATOR(pg_catalog.=) due.id
            RETURNING r.*
        ), kept AS (
            INSERT INTO idem.idem_history (owner_id, operation, idempotency_key, record_id, request_hash,
                                           fingerprint_version, status, http_status, resource_id,
                                           created_at, updated_at, expires_at, archived_at, audit_until)
            SELECT g.owner_id, g.operation, g.idempotency_key, g.id, g.request_hash,
                   g.fingerprint_version, g.status, g.http_status, g.resource_id,
                   g.created_at, g.updated_at, g.expires_at, pg_catalog.now(),
                   g.expires_at OPERATOR(pg_catalog.+) COALESCE(p.audit_ttl, s.audit_ttl)
              FROM gone g CROSS JOIN idem.idem_settings s
              LEFT JOIN idem.idem_policy p ON p.operation OPERATOR(pg_catalog.=) g.operation::text
             WHERE g.expires_at OPERATOR(pg_catalog.+) COALESCE(p.audit_ttl, s.audit_ttl) OPERATOR(pg_catalog.>) pg_catalog.now()
            ON CONFLICT ON CONSTRAINT pk_idem_history DO NOTHING
        )
        SELECT pg_catalog.count(*) INTO n FROM gone;
        total := total OPERATOR(pg_catalog.+) n;
        batches := batches OPERATOR(pg_catalog.+) 1;
        EXIT WHEN n OPERATOR(pg_catalog.<) batch_size;
    END LOOP;
    DELETE FROM idem.idem_history h WHERE h.audit_until OPERATOR(pg_catalog.<=) pg_catalog.now();
    RETURN total;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_cleanup_expired(integer, integer) FROM PUBLIC;

-- ===========================================================================
-- The outbox, in commit order per key
-- ===========================================================================

-- The C edition's outbox, and the emitting transaction (emit_xid) of a
-- keyed message until its COMMIT gives it commit_seq (0 until then).
CREATE SEQUENCE idem.idem_outbox_message_id_seq;
CREATE SEQUENCE idem.idem_outbox_commit_seq;
CREATE TABLE idem.idem_outbox (
    message_id   bigint PRIMARY KEY,
    topic        varchar(128) NOT NULL,
    msg_key      varchar(256),
    payload      jsonb NOT NULL,
    headers      jsonb,
    emitted_at   timestamptz NOT NULL,
    commit_seq   bigint NOT NULL,
    attempt      integer NOT NULL,
    ready        boolean NOT NULL,
    leased_until timestamptz,
    acked_at     timestamptz,
    owner_id     bigint,
    nacks        integer,
    lapses       integer,
    last_reason  text,
    not_before   timestamptz,
    dead_at      timestamptz,
    emit_xid     xid8
) WITH (fillfactor = 50);
ALTER SEQUENCE idem.idem_outbox_message_id_seq OWNED BY idem.idem_outbox.message_id;
CREATE INDEX idem_outbox_pending ON idem.idem_outbox (topic, commit_seq)
    WHERE acked_at IS NULL AND ready;
CREATE INDEX idem_outbox_key_order ON idem.idem_outbox (topic, msg_key, commit_seq)
    WHERE acked_at IS NULL AND msg_key IS NOT NULL;
CREATE INDEX idem_outbox_unflushed ON idem.idem_outbox (emit_xid)
    WHERE commit_seq OPERATOR(pg_catalog.=) 0;

-- One row per transaction that emitted keyed messages: its deferred
-- trigger gives them their order at COMMIT.
CREATE TABLE idem.idem_outbox_marker (
    xact xid8 PRIMARY KEY
);
REVOKE ALL ON TABLE idem.idem_outbox, idem.idem_outbox_marker FROM PUBLIC;
REVOKE ALL ON SEQUENCE idem.idem_outbox_message_id_seq, idem.idem_outbox_commit_seq FROM PUBLIC;

-- The commit-order lock of a (topic, msg_key): transaction advisory locks
-- of class 0x69646d01 ("idm" and 1, 1768189185), second key the pair's
-- hash (never 0); (class, 0) is the all-keys lock.  Applications' own
-- advisory locks must not use this class.
CREATE FUNCTION idem.idem_sql_key_hash(topic text, msg_key text) RETURNS integer
LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE
BEGIN ATOMIC
    SELECT CASE WHEN h OPERATOR(pg_catalog.=) 0 THEN 1 ELSE h END
      FROM (SELECT pg_catalog.hashtextextended(topic OPERATOR(pg_catalog.||) pg_catalog.chr(1) OPERATOR(pg_catalog.||) msg_key, 0)::bit(64)::bit(32)::integer AS h) x;
END;

-- Take the commit-order locks of these keys' hashes until the end of the
-- transaction, in one global order: at most 16 keys, the all-keys lock
-- shared and each key's exclusive, by hash; more, the all-keys lock
-- exclusive alone.  What an emitter's COMMIT and an acknowledgement take.
CREATE FUNCTION idem.idem_sql_lock_keys(hashes integer[]) RETURNS void
LANGUAGE plpgsql
AS $$
DECLARE
    h integer;
BEGIN
    IF pg_catalog.cardinality(hashes) OPERATOR(pg_catalog.=) 0 THEN
        RETURN;
    END IF;
    IF pg_catalog.cardinality(hashes) OPERATOR(pg_catalog.>) 16 THEN
        PERFORM pg_catalog.pg_advisory_xact_lock(1768189185, 0);
        RETURN;
    END IF;
    PERFORM pg_catalog.pg_advisory_xact_lock_shared(1768189185, 0);
    FOR h IN SELECT DISTINCT u FROM pg_catalog.unnest(hashes) u ORDER BY u LOOP
        PERFORM pg_catalog.pg_advisory_xact_lock(1768189185, h);
    END LOOP;
END
$$;

-- headers with the caller's idem.trace_context as "traceparent", unless
-- they carry one (the C edition checks the setting when it is set; this
-- edition, a placeholder setting, checks it here: 22023).
CREATE FUNCTION idem.idem_sql_traced_headers(headers jsonb)
RETURNS jsonb
LANGUAGE plpgsql STABLE
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    trace text := pg_catalog.current_setting('idem.trace_context', true);
BEGIN
    IF trace IS NULL OR trace OPERATOR(pg_catalog.=) '' THEN
        RETURN headers;
    END IF;
    IF trace OPERATOR(pg_catalog.!~) '^[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}$'
       OR pg_catalog.left(trace, 2) OPERATOR(pg_catalog.=) 'ff'
       OR pg_catalog.substr(trace, 4, 32) OPERATOR(pg_catalog.=) pg_catalog.repeat('0', 32)
       OR pg_catalog.substr(trace, 37, 16) OPERATOR(pg_catalog.=) pg_catalog.repeat('0', 16) THEN
        RAISE EXCEPTION 'invalid value for parameter "idem.trace_context": "%"', trace
            USING ERRCODE = '22023',
                  DETAIL = 'idem.trace_context is a W3C traceparent: 00-<32 lowercase hex digits>-<16 lowercase hex digits>-<2 hex digits>, the ids not all zeros.';
    END IF;
    RETURN pg_catalog.jsonb_build_object('traceparent', trace) OPERATOR(pg_catalog.||) COALESCE(headers, '{}');
END
$$;
REVOKE ALL ON FUNCTION idem.idem_sql_traced_headers(jsonb) FROM PUBLIC;

-- Emit a message with the caller's transaction.
CREATE FUNCTION idem.idem_outbox_emit(
    topic text, payload jsonb, msg_key text DEFAULT NULL, headers jsonb DEFAULT NULL,
    owner bigint DEFAULT NULL)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    id bigint;
    keyed boolean := msg_key IS NOT NULL;
BEGIN
    PERFORM idem.idem_sql_not_null(topic IS NULL, 'topic');
    PERFORM idem.idem_sql_not_null(payload IS NULL, 'payload');
    IF pg_catalog.length(topic) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length(topic) OPERATOR(pg_catalog.>) 128 THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters long'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The topic has %s characters.', pg_catalog.length(topic));
    END IF;
    IF topic OPERATOR(pg_catalog.~) '[^A-Za-z0-9_.:-]' THEN
        RAISE EXCEPTION 'topic may contain only letters A-Z and a-z, digits, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF keyed AND (pg_catalog.length(msg_key) OPERATOR(pg_catalog.<) 1 OR pg_catalog.length(msg_key) OPERATOR(pg_catalog.>) 256) THEN
        RAISE EXCEPTION 'msg_key must be 1 to 256 characters long'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The msg_key has %s characters.', pg_catalog.length(msg_key));
    END IF;
    IF keyed AND msg_key OPERATOR(pg_catalog.~) '[\x01-\x1f\x7f-\x9f]' THEN
        RAISE EXCEPTION 'msg_key must not contain control characters' USING ERRCODE = '22023';
    END IF;
    IF headers IS NOT NULL AND pg_catalog.jsonb_typeof(headers) OPERATOR(pg_catalog.<>) 'object' THEN
        RAISE EXCEPTION 'headers must be a JSON object' USING ERRCODE = '22023';
    END IF;
    IF owner IS NOT NULL THEN
        PERFORM idem.idem_sql_check_bound(owner, NULL);
    END IF;
    headers := idem.idem_sql_traced_headers(headers);
    IF keyed AND pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'idem''s SQL edition emits keyed messages in READ COMMITTED transactions only'
            USING ERRCODE = '0A000',
                  DETAIL = pg_catalog.format('This transaction is %s: its COMMIT could not see the messages of its keys committed after its snapshot.',
                                             pg_catalog.upper(pg_catalog.current_setting('transaction_isolation'))),
                  HINT = 'Emit keyed messages in a READ COMMITTED transaction, or without a key (docs/managed.md).';
    END IF;
    id := pg_catalog.nextval('idem.idem_outbox_message_id_seq'::pg_catalog.regclass);
    INSERT INTO idem.idem_outbox (message_id, topic, msg_key, payload, headers, emitted_at,
                                  commit_seq, attempt, ready, owner_id, emit_xid)
    VALUES (id, topic, msg_key, payload, headers, pg_catalog.clock_timestamp(),
            CASE WHEN keyed THEN 0 ELSE pg_catalog.nextval('idem.idem_outbox_commit_seq'::pg_catalog.regclass) END,
            0, NOT keyed, owner, CASE WHEN keyed THEN pg_catalog.pg_current_xact_id() END);
    IF keyed THEN
        IF pg_catalog.current_setting('idem_sql.outbox', true) IS DISTINCT FROM pg_catalog.pg_current_xact_id()::text THEN
            INSERT INTO idem.idem_outbox_marker (xact) VALUES (pg_catalog.pg_current_xact_id())
            ON CONFLICT (xact) DO NOTHING;
            PERFORM pg_catalog.set_config('idem_sql.outbox', pg_catalog.pg_current_xact_id()::text, true);
        END IF;
    END IF;
    PERFORM pg_catalog.pg_notify('idem_outbox', topic);
    RETURN id;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_outbox_emit(text, jsonb, text, jsonb, bigint) FROM PUBLIC;

-- At COMMIT: the transaction's keyed messages get their commit_seq, under
-- their keys' locks (held until the commit is done), and each is its
-- key's head (ready) if nothing of its key is unacknowledged.  The marker's
-- one event does it for every message the transaction emitted so far; a
-- message emitted after (SET CONSTRAINTS ... IMMEDIATE) inserts another
-- marker, whose event does the rest.
CREATE FUNCTION idem.idem_sql_outbox_flush() RETURNS trigger
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    m record;
BEGIN
    PERFORM idem.idem_sql_lock_keys(ARRAY(
        SELECT DISTINCT idem.idem_sql_key_hash(o.topic, o.msg_key) FROM idem.idem_outbox o
         WHERE o.emit_xid OPERATOR(pg_catalog.=) NEW.xact AND o.commit_seq OPERATOR(pg_catalog.=) 0));
    FOR m IN SELECT o.message_id, o.topic, o.msg_key FROM idem.idem_outbox o
              WHERE o.emit_xid OPERATOR(pg_catalog.=) NEW.xact AND o.commit_seq OPERATOR(pg_catalog.=) 0
              ORDER BY o.message_id LOOP
        UPDATE idem.idem_outbox o
           SET commit_seq = pg_catalog.nextval('idem.idem_outbox_commit_seq'::pg_catalog.regclass),
               ready = NOT EXISTS (
                   SELECT FROM idem.idem_outbox p
                    WHERE p.topic::text OPERATOR(pg_catalog.=) m.topic::text AND p.msg_key::text OPERATOR(pg_catalog.=) m.msg_key::text
                      AND p.acked_at IS NULL AND p.commit_seq OPERATOR(pg_catalog.>) 0),
               emit_xid = NULL
         WHERE o.message_id OPERATOR(pg_catalog.=) m.message_id;
    END LOOP;
    DELETE FROM idem.idem_outbox_marker k WHERE k.xact OPERATOR(pg_catalog.=) NEW.xact;
    PERFORM pg_catalog.set_config('idem_sql.outbox', '', true);
    RETURN NULL;
END
$$;
CREATE CONSTRAINT TRIGGER idem_outbox_flush AFTER INSERT ON idem.idem_outbox_marker
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION idem.idem_sql_outbox_flush();

-- Lease the deliverable messages of a topic: ready (keyless, or the head
-- of its key), not acknowledged, not leased or with a lapsed lease.  FOR
-- UPDATE SKIP LOCKED: concurrent fetchers never lease one message.
CREATE FUNCTION idem.idem_outbox_fetch(
    topic text,
    batch integer DEFAULT 100,
    lease interval DEFAULT interval '30 seconds')
RETURNS TABLE (message_id bigint, msg_key text, payload jsonb, headers jsonb,
               attempt integer, emitted_at timestamptz)
LANGUAGE plpgsql VOLATILE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    t timestamptz := pg_catalog.clock_timestamp();
BEGIN
    IF idem_outbox_fetch.topic IS NULL OR batch IS NULL OR lease IS NULL THEN
        RAISE EXCEPTION 'argument "%" must not be null',
            CASE WHEN idem_outbox_fetch.topic IS NULL THEN 'topic'
                 WHEN batch IS NULL THEN 'batch' ELSE 'lease' END
            USING ERRCODE = '22004';
    END IF;
    IF idem_outbox_fetch.topic OPERATOR(pg_catalog.!~) '^[A-Za-z0-9_.:-]{1,128}$' THEN
        RAISE EXCEPTION 'topic must be 1 to 128 characters from A-Z, a-z, 0-9, "_", ".", ":" and "-"'
            USING ERRCODE = '22023';
    END IF;
    IF batch OPERATOR(pg_catalog.<) 1 OR batch OPERATOR(pg_catalog.>) 10000 THEN
        RAISE EXCEPTION 'batch must be between 1 and 10000'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has batch %s.', batch);
    END IF;
    IF lease OPERATOR(pg_catalog.<=) interval '0' THEN
        RAISE EXCEPTION 'lease must be a positive interval'
            USING ERRCODE = '22023', DETAIL = pg_catalog.format('The call has lease %s.', lease);
    END IF;
    RETURN QUERY
    WITH due AS (
        SELECT o.ctid
          FROM idem.idem_outbox o
         WHERE o.topic::text OPERATOR(pg_catalog.=) idem_outbox_fetch.topic
           AND o.acked_at IS NULL AND o.ready
           AND (o.leased_until IS NULL OR o.leased_until OPERATOR(pg_catalog.<=) t)
           AND (o.not_before IS NULL OR o.not_before OPERATOR(pg_catalog.<=) t)
         ORDER BY o.commit_seq
         LIMIT batch
           FOR UPDATE OF o SKIP LOCKED
    ), leased AS (
        UPDATE idem.idem_outbox o
           SET attempt = o.attempt OPERATOR(pg_catalog.+) 1,
               lapses = CASE WHEN o.leased_until IS NULL THEN o.lapses
                             ELSE COALESCE(o.lapses, 0) OPERATOR(pg_catalog.+) 1 END,
               not_before = NULL,
               leased_until = t OPERATOR(pg_catalog.+) lease
          FROM due
         WHERE o.ctid OPERATOR(pg_catalog.=) due.ctid
        RETURNING o.message_id, o.msg_key, o.payload, o.headers, o.attempt,
                  o.emitted_at, o.commit_seq
    )
    SELECT l.message_id, l.msg_key::text, l.payload, l.headers,
           l.attempt, l.emitted_at
      FROM leased l
     ORDER BY l.commit_seq;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_outbox_fetch(text, integer, interval) FROM PUBLIC;

-- Acknowledge delivered messages: each is deleted, and each key whose head
-- it was gets its next message ready.  Under the emitters' locks of those
-- keys (advisory locks have no SHARE mode that excludes emitters but not
-- other acknowledgements: acknowledgements of one key, or of more than 16
-- keys, queue behind each other).  Returns how many were not already
-- acknowledged.
CREATE FUNCTION idem.idem_outbox_ack(message_ids bigint[]) RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    n bigint;
    topics text[];
    keys text[];
BEGIN
    PERFORM idem.idem_sql_not_null(message_ids IS NULL, 'message_ids');
    IF pg_catalog.current_setting('transaction_isolation') OPERATOR(pg_catalog.<>) 'read committed' THEN
        RAISE EXCEPTION 'idem''s SQL edition acknowledges messages in READ COMMITTED transactions only'
            USING ERRCODE = '0A000',
                  DETAIL = 'The next message of a key may have committed after this transaction''s snapshot.',
                  HINT = 'Acknowledge in a READ COMMITTED transaction (docs/managed.md).';
    END IF;
    PERFORM idem.idem_sql_lock_keys(ARRAY(
        SELECT DISTINCT idem.idem_sql_key_hash(o.topic, o.msg_key) FROM idem.idem_outbox o
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.msg_key IS NOT NULL
           AND o.commit_seq OPERATOR(pg_catalog.>) 0));
    WITH gone AS (
        DELETE FROM idem.idem_outbox o
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (message_ids) AND o.dead_at IS NULL
           AND o.commit_seq OPERATOR(pg_catalog.>) 0
        RETURNING o.topic, o.msg_key)
    SELECT pg_catalog.count(*),
           pg_catalog.array_agg(g.topic::text) FILTER (WHERE g.msg_key IS NOT NULL),
           pg_catalog.array_agg(g.msg_key::text) FILTER (WHERE g.msg_key IS NOT NULL)
      INTO n, topics, keys
      FROM gone g;
    IF topics IS NOT NULL THEN
        -- a new snapshot: the emitters the locks waited for included
        UPDATE idem.idem_outbox o SET ready = true
         WHERE o.message_id OPERATOR(pg_catalog.=) ANY (ARRAY(
                   SELECT (SELECT p.message_id FROM idem.idem_outbox p
                            WHERE p.topic::text OPERATOR(pg_catalog.=) u.t AND p.msg_key::text OPERATOR(pg_catalog.=) u.k
                              AND p.acked_at IS NULL AND p.commit_seq OPERATOR(pg_catalog.>) 0
                            ORDER BY p.commit_seq LIMIT 1)
                     FROM ROWS FROM (pg_catalog.unnest(topics), pg_catalog.unnest(keys)) AS u (t, k)))
           AND NOT o.ready AND o.dead_at IS NULL;
    END IF;
    RETURN n;
END
$$;
REVOKE ALL ON FUNCTION idem.idem_outbox_ack(bigint[]) FROM PUBLIC;

-- ===========================================================================
-- Grants
-- ===========================================================================

-- The privileges of each kind of user.
CREATE FUNCTION idem.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT p.privilege, p.object
      FROM (VALUES
        ('app', 'EXECUTE', 'FUNCTION idem.idem_create_order(bigint, text, bigint, integer)'),
        ('app', 'EXECUTE', 'FUNCTION idem.idem_begin(bigint, text, text, jsonb, interval)'),
        ('app', 'EXECUTE', 'FUNCTION idem.idem_finish(bigint, text, text, integer, json, bigint, jsonb, json)'),
        ('app', 'EXECUTE', 'FUNCTION idem.idem_finish_stored(bigint, text, text, integer, json, bigint, jsonb, json)'),
        ('app', 'EXECUTE', 'FUNCTION idem.idem_outbox_emit(text, jsonb, text, jsonb, bigint)'),
        ('publisher', 'EXECUTE', 'FUNCTION idem.idem_outbox_fetch(text, integer, interval)'),
        ('publisher', 'EXECUTE', 'FUNCTION idem.idem_outbox_ack(bigint[])')
      ) AS p (kind, privilege, object)
     WHERE p.kind OPERATOR(pg_catalog.=) idem_privileges.kind;
END;

-- Grant (or revoke) what one kind of user needs, with the caller's rights:
-- idem's owner, or a role it gave them WITH GRANT OPTION.
CREATE FUNCTION idem.idem_sql_grant_kind(role regrole, kind text, grant_them boolean)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql
SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    p record;
BEGIN
    IF role IS NULL OR kind IS NULL THEN
        RAISE EXCEPTION 'idem_%: role and kind must not be NULL', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END
            USING ERRCODE = '22004';
    END IF;
    IF kind OPERATOR(pg_catalog.=) ANY (ARRAY['worker', 'consumer', 'monitor']) THEN
        RAISE EXCEPTION 'idem''s SQL edition has no "%" functions yet', kind
            USING ERRCODE = '0A000', HINT = 'Its kinds are app and publisher (docs/managed.md).';
    END IF;
    IF NOT EXISTS (SELECT FROM idem.idem_privileges(kind)) THEN
        RAISE EXCEPTION 'unknown kind of idem user: "%"', kind
            USING ERRCODE = '22023', HINT = 'The kinds are app, worker, publisher, consumer and monitor.';
    END IF;
    FOR p IN SELECT * FROM idem.idem_privileges(kind) LOOP
        IF NOT pg_catalog.has_function_privilege(pg_catalog.substr(p.object, 10)::pg_catalog.regprocedure, 'EXECUTE WITH GRANT OPTION') THEN
            RAISE EXCEPTION 'permission denied to % idem''s "%" privileges', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END, kind
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('%I cannot grant %s ON %s.', current_user, p.privilege, p.object),
                      HINT = 'Run it as idem''s owner.';
        END IF;
    END LOOP;
    IF grant_them AND NOT pg_catalog.has_schema_privilege(role, 'idem', 'USAGE') THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA idem TO %s', role);
        privilege := 'USAGE';
        object := 'SCHEMA idem';
        RETURN NEXT;
    END IF;
    FOR p IN SELECT * FROM idem.idem_privileges(kind) LOOP
        IF grant_them THEN
            EXECUTE pg_catalog.format('GRANT %s ON %s TO %s', p.privilege, p.object, role);
        ELSE
            EXECUTE pg_catalog.format('REVOKE %s ON %s FROM %s', p.privilege, p.object, role);
        END IF;
        privilege := p.privilege;
        object := p.object;
        RETURN NEXT;
    END LOOP;
END
$$;

CREATE FUNCTION idem.idem_grant(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem.idem_sql_grant_kind(role, kind, true) g;
END;
REVOKE ALL ON FUNCTION idem.idem_grant(regrole, text) FROM PUBLIC;

CREATE FUNCTION idem.idem_revoke(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql
SET search_path = pg_catalog, pg_temp
BEGIN ATOMIC
    SELECT g.privilege, g.object FROM idem.idem_sql_grant_kind(role, kind, false) g;
END;
REVOKE ALL ON FUNCTION idem.idem_revoke(regrole, text) FROM PUBLIC;

-- Which edition answers in this schema (the libraries ask, to find idem's
-- schema where pg_extension has no row).
CREATE FUNCTION idem.idem_edition() RETURNS text
LANGUAGE sql IMMUTABLE
SET search_path = pg_catalog, pg_temp
RETURN 'sql 1.15 preview';

-- The internal functions are not callers' to run.
DO $revoke$
DECLARE
    f pg_catalog.regprocedure;
BEGIN
    FOR f IN SELECT p.oid::pg_catalog.regprocedure FROM pg_catalog.pg_proc p
              WHERE p.pronamespace OPERATOR(pg_catalog.=) 'idem'::pg_catalog.regnamespace
                AND p.proname OPERATOR(pg_catalog.~~) 'idem\_sql\_%'
                AND p.proname OPERATOR(pg_catalog.<>) ALL (ARRAY['idem_sql_number', 'idem_sql_utf16_key', 'idem_sql_reads_back', 'idem_sql_canonical_member', 'idem_sql_digest']) LOOP
        EXECUTE pg_catalog.format('REVOKE ALL ON FUNCTION %s FROM PUBLIC', f);
    END LOOP;
END
$revoke$;
GRANT EXECUTE ON FUNCTION idem.idem_sql_grant_kind(regrole, text, boolean) TO PUBLIC;

COMMIT;
