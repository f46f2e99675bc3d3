/* idem--1.7--1.8.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.8'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- idem_grant(role, kind) gives a role what one kind of user of idem needs
-- and nothing more; idem_revoke(role, kind) takes it back.  The kinds:
--
--   app        the synchronous calls of an application's transaction:
--              idem_create_order, idem_begin, idem_finish, idem_run,
--              idem_submit (start a long flow, ask its state) and
--              idem_outbox_emit (a message in the business transaction)
--   worker     a long flow's worker: idem_lease, idem_heartbeat,
--              idem_complete, idem_fail
--   publisher  an outbox publisher: idem_outbox_fetch, idem_outbox_ack
--   consumer   an inbox consumer: idem_consume
--   monitor    the statistics and health: SELECT on idem_stats,
--              idem_stats_entries(), idem_health(), idem_cleanup_status()
--
-- Each also grants USAGE on idem's schema when the role lacks it.  No kind
-- grants anything on idem's tables: the calls write them as idem's owner.
--
-- Both run with the caller's rights (not SECURITY DEFINER): the caller must
-- be able to grant each of those privileges (idem's owner, a superuser, or
-- a role holding them WITH GRANT OPTION); otherwise 42501 and nothing is
-- granted.  They return one row per privilege granted (or revoked).
-- ---------------------------------------------------------------------------

-- The privileges of a kind: (what, object) pairs, the object qualified.
CREATE FUNCTION @extschema@.idem_privileges(kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql IMMUTABLE STRICT
SET search_path = pg_catalog, pg_temp
AS $privileges$
    SELECT p.privilege, p.object
    FROM (VALUES
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_begin(bigint, text, text, jsonb, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_finish(bigint, text, text, integer, json, bigint, jsonb)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_run(bigint, text, text, jsonb, regprocedure, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_submit(bigint, text, text, jsonb, jsonb, interval)'),
        ('app', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_emit(text, jsonb, text, jsonb)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_lease(text, text, interval, integer, boolean)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_heartbeat(bigint, bigint, interval)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_complete(bigint, bigint, integer, json, bigint, jsonb)'),
        ('worker', 'EXECUTE', 'FUNCTION @extschema@.idem_fail(bigint, bigint, jsonb, boolean)'),
        ('publisher', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_fetch(text, integer, interval)'),
        ('publisher', 'EXECUTE', 'FUNCTION @extschema@.idem_outbox_ack(bigint[])'),
        ('consumer', 'EXECUTE', 'FUNCTION @extschema@.idem_consume(text, text, interval)'),
        ('monitor', 'SELECT', 'TABLE @extschema@.idem_stats'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_stats_entries()'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_health()'),
        ('monitor', 'EXECUTE', 'FUNCTION @extschema@.idem_cleanup_status()')
    ) AS p (kind, privilege, object)
    WHERE p.kind OPERATOR(pg_catalog.=) idem_privileges.kind
$privileges$;

COMMENT ON FUNCTION @extschema@.idem_privileges(text) IS
    'idem: the privileges idem_grant gives one kind of user (app, worker, publisher, consumer, monitor)';

-- Grant (grant = true) or revoke the privileges of a kind; for idem_grant
-- and idem_revoke.
CREATE FUNCTION @extschema@.idem_grant_kind(role regrole, kind text, grant_them boolean)
RETURNS TABLE (privilege text, object text)
LANGUAGE plpgsql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $grant$
DECLARE
    p record;
    target text;
    can boolean;
    schema_name name := (SELECT n.nspname FROM pg_catalog.pg_extension e
                         JOIN pg_catalog.pg_namespace n ON n.oid OPERATOR(pg_catalog.=) e.extnamespace
                         WHERE e.extname OPERATOR(pg_catalog.=) 'idem');
    needs_usage boolean;
BEGIN
    IF role IS NULL OR kind IS NULL THEN
        RAISE EXCEPTION 'idem_%: role and kind must not be NULL', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END
            USING ERRCODE = '22004';
    END IF;
    IF NOT EXISTS (SELECT FROM @extschema@.idem_privileges(kind)) THEN
        RAISE EXCEPTION 'unknown kind of idem user: "%"', kind
            USING ERRCODE = '22023',
                  HINT = 'The kinds are app, worker, publisher, consumer and monitor.';
    END IF;
    -- every privilege is checked first: nothing is granted unless all can be
    FOR p IN SELECT * FROM @extschema@.idem_privileges(kind) LOOP
        target := pg_catalog.substr(p.object, pg_catalog.strpos(p.object, ' ') + 1);
        IF p.object LIKE 'FUNCTION %' THEN
            can := pg_catalog.has_function_privilege(target::pg_catalog.regprocedure, 'EXECUTE WITH GRANT OPTION');
        ELSE
            can := pg_catalog.has_table_privilege(target::pg_catalog.regclass, 'SELECT WITH GRANT OPTION');
        END IF;
        IF NOT can THEN
            RAISE EXCEPTION 'permission denied to % idem''s "%" privileges', CASE WHEN grant_them THEN 'grant' ELSE 'revoke' END, kind
                USING ERRCODE = '42501',
                      DETAIL = pg_catalog.format('%I cannot grant %s ON %s.', current_user, p.privilege, p.object),
                      HINT = 'Run it as idem''s owner or as a superuser.';
        END IF;
    END LOOP;
    needs_usage := grant_them AND NOT pg_catalog.has_schema_privilege(role, schema_name, 'USAGE');
    IF needs_usage AND NOT pg_catalog.has_schema_privilege(schema_name, 'USAGE WITH GRANT OPTION') THEN
        RAISE EXCEPTION 'permission denied to grant idem''s "%" privileges', kind
            USING ERRCODE = '42501',
                  DETAIL = pg_catalog.format('%I cannot grant USAGE ON SCHEMA %I.', current_user, schema_name),
                  HINT = 'Run it as idem''s owner or as a superuser.';
    END IF;
    IF needs_usage THEN
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO %s', schema_name, role);
        privilege := 'USAGE';
        object := pg_catalog.format('SCHEMA %I', schema_name);
        RETURN NEXT;
    END IF;
    FOR p IN SELECT * FROM @extschema@.idem_privileges(kind) LOOP
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
$grant$;

-- (PUBLIC keeps EXECUTE on idem_grant_kind: it runs with the caller's
-- rights, so it can grant only what the caller could; idem_grant and
-- idem_revoke, which a granting role is given, call it.)
COMMENT ON FUNCTION @extschema@.idem_grant_kind(regrole, text, boolean) IS
    'idem: for idem_grant and idem_revoke';

CREATE FUNCTION @extschema@.idem_grant(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT * FROM @extschema@.idem_grant_kind(role, kind, true) $$;

COMMENT ON FUNCTION @extschema@.idem_grant(regrole, text) IS
    'idem: grant role what one kind of idem user needs: app, worker, publisher, consumer or monitor';

CREATE FUNCTION @extschema@.idem_revoke(role regrole, kind text)
RETURNS TABLE (privilege text, object text)
LANGUAGE sql VOLATILE
SET search_path = pg_catalog, pg_temp
AS $$ SELECT * FROM @extschema@.idem_grant_kind(role, kind, false) $$;

COMMENT ON FUNCTION @extschema@.idem_revoke(regrole, text) IS
    'idem: revoke from role what idem_grant gave it for one kind (its schema USAGE stays)';

REVOKE ALL ON FUNCTION @extschema@.idem_grant(regrole, text) FROM PUBLIC;
REVOKE ALL ON FUNCTION @extschema@.idem_revoke(regrole, text) FROM PUBLIC;
