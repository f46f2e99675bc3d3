-- The attackers' tools, for the escalation tests of both editions
-- (test/t/014_schema_hijack.pl, test/managed/run.sh): hijack_log.plant(s)
-- plants, as the role that calls it, look-alikes of every idem function,
-- table, view, index and type in schema s, operators and the catalog
-- functions idem's code would call unqualified, and hijack_log.plant_temp()
-- the same in the session's pg_temp.  Each plant that runs raises a
-- WARNING "hijack: plant ... ran as <role>".  Run by a superuser.
CREATE SCHEMA hijack_log;
GRANT USAGE ON SCHEMA hijack_log TO PUBLIC;
-- a plant says so in the server log, with its database (log_line_prefix):
-- a warning stays when its caller's transaction then fails
CREATE FUNCTION hijack_log.hit(plant text) RETURNS boolean
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    RAISE WARNING 'hijack: plant % ran as %', plant, current_user;
    RETURN true;
END $$;
CREATE FUNCTION hijack_log.hit_trigger() RETURNS trigger
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM hijack_log.hit('trigger ' || TG_TABLE_SCHEMA || '.' || TG_TABLE_NAME);
    RETURN NULL;
END $$;
GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA hijack_log TO PUBLIC;

-- idem's functions, relations, indexes and types, what to imitate: the
-- extension's members (pg_depend), or where the extension is not installed
-- the objects of the SQL edition's schema idem
CREATE FUNCTION hijack_log.members()
RETURNS TABLE (kind text, fn oid, name name)
LANGUAGE sql STABLE AS $$
    WITH ext AS (SELECT oid FROM pg_catalog.pg_extension WHERE extname = 'idem'),
    sql_edition AS (SELECT n.oid FROM pg_catalog.pg_namespace n WHERE n.nspname = 'idem' AND NOT EXISTS (SELECT FROM ext)),
    objects (classid, objid) AS (
        SELECT d.classid, d.objid FROM pg_catalog.pg_depend d JOIN ext ON d.refobjid = ext.oid AND d.deptype = 'e'
        UNION ALL
        SELECT 'pg_catalog.pg_proc'::pg_catalog.regclass, p.oid FROM pg_catalog.pg_proc p JOIN sql_edition s ON p.pronamespace = s.oid
        UNION ALL
        SELECT 'pg_catalog.pg_class'::pg_catalog.regclass, c.oid FROM pg_catalog.pg_class c JOIN sql_edition s ON c.relnamespace = s.oid
         WHERE c.relkind IN ('r', 'p', 'v', 'S')
        UNION ALL
        SELECT 'pg_catalog.pg_type'::pg_catalog.regclass, t.oid FROM pg_catalog.pg_type t JOIN sql_edition s ON t.typnamespace = s.oid
         WHERE t.typtype IN ('d', 'e') OR (t.typtype = 'c' AND (SELECT c.relkind FROM pg_catalog.pg_class c WHERE c.oid = t.typrelid) = 'c'))
    SELECT 'function', p.oid, p.proname
      FROM objects o JOIN pg_catalog.pg_proc p ON p.oid = o.objid
     WHERE o.classid = 'pg_catalog.pg_proc'::pg_catalog.regclass
    UNION ALL
    SELECT CASE c.relkind WHEN 'v' THEN 'view' ELSE 'table' END, c.oid, c.relname
      FROM objects o JOIN pg_catalog.pg_class c ON c.oid = o.objid
     WHERE o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
    UNION ALL
    SELECT 'table', 0, i.relname
      FROM pg_catalog.pg_index x JOIN pg_catalog.pg_class i ON i.oid = x.indexrelid
      JOIN objects o ON o.objid = x.indrelid AND o.classid = 'pg_catalog.pg_class'::pg_catalog.regclass
    UNION ALL
    SELECT 'type', t.oid, t.typname
      FROM objects o JOIN pg_catalog.pg_type t ON t.oid = o.objid
     WHERE o.classid = 'pg_catalog.pg_type'::pg_catalog.regclass
$$;
GRANT EXECUTE ON FUNCTION hijack_log.members() TO PUBLIC;

-- Plant in schema s, as the calling role, everything it may: returns how
-- many plants it made.  A plant a name already taken refuses is skipped.
CREATE FUNCTION hijack_log.plant(s text) RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m record;
    made integer := 0;
    args text;
    result text;
    body text;
    stmt text;
    stmts text[];
BEGIN
    FOR m IN SELECT * FROM hijack_log.members() LOOP
        stmts := ARRAY[]::text[];
        IF m.kind = 'function' THEN
            -- the same name and arguments; defaults kept, as NULL
            args := regexp_replace(pg_get_function_arguments(m.fn), ' DEFAULT [^,]+', ' DEFAULT NULL', 'g');
            result := pg_get_function_result(m.fn);
            body := format('BEGIN PERFORM hijack_log.hit(%L); %s END',
                           'function ' || s || '.' || m.name,
                           CASE WHEN result ~ '^(TABLE|SETOF )' OR result = 'void' OR args ~ '(^|, )OUT '
                                THEN 'RETURN;' ELSE 'RETURN NULL;' END);
            stmts := ARRAY[
                format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', s, m.name, args, result, body),
                -- a result type the attacker cannot name (no USAGE on it)
                format('CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE plpgsql AS %L', s, m.name, args,
                       CASE WHEN result ~ '^(TABLE|SETOF )' THEN 'SETOF record' ELSE 'record' END,
                       format('BEGIN PERFORM hijack_log.hit(%L); RETURN%s; END',
                              'function ' || s || '.' || m.name,
                              CASE WHEN result ~ '^(TABLE|SETOF )' THEN '' ELSE ' NULL' END))];
        ELSIF m.kind = 'table' THEN
            stmts := ARRAY[
                format('CREATE TABLE %I.%I (id bigint, owner_id bigint, operation text, idempotency_key text, topic text, message_id bigint, status text, expires_at timestamptz)', s, m.name)
                || format('; CREATE TRIGGER hijack_s BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON %I.%I FOR EACH STATEMENT EXECUTE FUNCTION hijack_log.hit_trigger()', s, m.name)
                || format('; CREATE TRIGGER hijack_r BEFORE INSERT OR UPDATE OR DELETE ON %I.%I FOR EACH ROW EXECUTE FUNCTION hijack_log.hit_trigger()', s, m.name)
                || format('; CREATE RULE hijack_rule AS ON INSERT TO %I.%I DO ALSO SELECT hijack_log.hit(%L)', s, m.name, 'rule ' || s || '.' || m.name)];
        ELSIF m.kind = 'view' THEN
            stmts := ARRAY[format('CREATE VIEW %I.%I AS SELECT hijack_log.hit(%L) AS hit', s, m.name, 'view ' || s || '.' || m.name)];
        ELSIF m.kind = 'type' THEN
            -- a type of the name, and casts into it that run a plant
            stmts := ARRAY[
                format('CREATE TYPE %I.%I AS (http_status integer)', s, m.name)
                || format('; CREATE FUNCTION %I.%I(x pg_catalog.json) RETURNS %I.%I LANGUAGE plpgsql AS %L', s, 'hijack_cast_' || m.name, s, m.name,
                          format('BEGIN PERFORM hijack_log.hit(%L); RETURN NULL; END', 'cast ' || s || '.' || m.name))
                || format('; CREATE CAST (pg_catalog.json AS %I.%I) WITH FUNCTION %I.%I(pg_catalog.json) AS IMPLICIT', s, m.name, s, 'hijack_cast_' || m.name)
                || format('; CREATE FUNCTION %I.%I(x pg_catalog.record) RETURNS %I.%I LANGUAGE plpgsql AS %L', s, 'hijack_rcast_' || m.name, s, m.name,
                          format('BEGIN PERFORM hijack_log.hit(%L); RETURN NULL; END', 'cast ' || s || '.' || m.name))];
        END IF;
        FOREACH stmt IN ARRAY stmts LOOP
            BEGIN
                EXECUTE stmt;
                made := made + 1;
                EXIT;
            EXCEPTION WHEN OTHERS THEN
                NULL;
            END;
        END LOOP;
    END LOOP;

    -- operators on the types idem compares, and the functions idem's code
    -- would call unqualified
    FOREACH stmt IN ARRAY ARRAY[
        'varchar,varchar,=', 'varchar,text,=', 'text,varchar,=', 'text,text,=', 'bpchar,bpchar,=',
        'bigint,bigint,=', 'integer,integer,=', 'oid,oid,=', 'name,name,=', 'name,text,=', 'jsonb,jsonb,=',
        'bigint,bigint,<', 'integer,integer,<', 'integer,integer,>', 'bigint,bigint,+', 'integer,integer,+',
        'timestamptz,timestamptz,<', 'timestamptz,timestamptz,<=', 'timestamptz,interval,+',
        'timestamptz,timestamptz,-', 'interval,interval,<=', 'text,text,||', 'text,text,!~', 'text,text,~',
        'jsonb,text,->>', 'jsonb,text,->', 'jsonb,text,?'] LOOP
        DECLARE
            parts text[] := string_to_array(stmt, ',');
            fname text := 'hijack_op_' || md5(stmt);
        BEGIN
            EXECUTE format('CREATE FUNCTION %I.%I(pg_catalog.%s, pg_catalog.%s) RETURNS boolean LANGUAGE sql AS %L',
                           s, fname, parts[1], parts[2], format('SELECT hijack_log.hit(%L)', 'operator ' || s || '.' || parts[3]));
            EXECUTE format('CREATE OPERATOR %I.%s (LEFTARG = pg_catalog.%s, RIGHTARG = pg_catalog.%s, FUNCTION = %I.%I)',
                           s, parts[3], parts[1], parts[2], s, fname);
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
    FOREACH stmt IN ARRAY ARRAY[
        'now() RETURNS timestamptz', 'clock_timestamp() RETURNS timestamptz',
        'nextval(regclass) RETURNS bigint', 'lpad(text, integer, text) RETURNS text',
        'format(text, text) RETURNS text', 'current_database() RETURNS name',
        'array_length(anyarray, integer) RETURNS integer', 'to_regclass(text) RETURNS regclass',
        'substr(text, integer) RETURNS text', 'strpos(text, text) RETURNS integer',
        'has_function_privilege(oid, text) RETURNS boolean', 'has_table_privilege(oid, text) RETURNS boolean',
        'has_schema_privilege(name, text) RETURNS boolean', 'set_config(text, text, boolean) RETURNS text',
        'pg_table_size(regclass) RETURNS bigint', 'unnest(anyarray) RETURNS SETOF anyelement',
        'jsonb_build_object(text, jsonb) RETURNS jsonb', 'pg_extension_config_dump(regclass, text) RETURNS void'] LOOP
        BEGIN
            EXECUTE format('CREATE FUNCTION %I.%s LANGUAGE plpgsql AS %L', s, stmt,
                           format('BEGIN PERFORM hijack_log.hit(%L); RETURN%s; END', 'function ' || s || '.' || split_part(stmt, '(', 1),
                                  CASE WHEN stmt ~ '(SETOF|void)' THEN '' ELSE ' NULL' END));
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
    RETURN made;
END
$fn$;
GRANT EXECUTE ON FUNCTION hijack_log.plant(text) TO PUBLIC;

-- the same in this session's pg_temp: tables with triggers and rules, and
-- views, named as idem's relations (and look-alike functions, which only
-- a name written pg_temp.f would reach)
CREATE FUNCTION hijack_log.plant_temp() RETURNS integer
LANGUAGE plpgsql SET search_path = pg_catalog, pg_temp AS $fn$
DECLARE
    m record;
    made integer := 0;
BEGIN
    FOR m IN SELECT DISTINCT kind, name FROM hijack_log.members() WHERE kind IN ('table', 'view', 'function') LOOP
        BEGIN
            IF m.kind = 'function' THEN
                EXECUTE format('CREATE FUNCTION pg_temp.%I() RETURNS boolean LANGUAGE sql AS %L',
                               m.name, format('SELECT hijack_log.hit(%L)', 'function pg_temp.' || m.name));
            ELSIF m.kind = 'view' THEN
                EXECUTE format('CREATE TEMP VIEW %I AS SELECT hijack_log.hit(%L) AS hit', m.name, 'view pg_temp.' || m.name);
            ELSE
                EXECUTE format('CREATE TEMP TABLE %I (id bigint, owner_id bigint, operation text, idempotency_key text, topic text, message_id bigint, status text, expires_at timestamptz)', m.name);
                EXECUTE format('CREATE TRIGGER hijack_s BEFORE INSERT OR UPDATE OR DELETE OR TRUNCATE ON pg_temp.%I FOR EACH STATEMENT EXECUTE FUNCTION hijack_log.hit_trigger()', m.name);
                EXECUTE format('CREATE TRIGGER hijack_r BEFORE INSERT OR UPDATE OR DELETE ON pg_temp.%I FOR EACH ROW EXECUTE FUNCTION hijack_log.hit_trigger()', m.name);
                EXECUTE format('CREATE RULE hijack_rule AS ON INSERT TO pg_temp.%I DO ALSO SELECT hijack_log.hit(%L)', m.name, 'rule pg_temp.' || m.name);
            END IF;
            made := made + 1;
        EXCEPTION WHEN OTHERS THEN
            NULL;
        END;
    END LOOP;
    RETURN made;
END
$fn$;
GRANT EXECUTE ON FUNCTION hijack_log.plant_temp() TO PUBLIC;