-- Overloads of every idem function, planted where a call could find them:
-- in idem's schema and in each schema on the callers' search_path ("$user"
-- of the roles given in :'callers', then public).  Each takes one of the
-- function's arguments as smallint, integer, numeric, real, text, varchar,
-- bpchar or json (the types drivers send: psycopg a small int as smallint,
-- node-postgres unknown, pgjdbc varchar), keeps the other arguments, the
-- defaults and the result, records that it ran (a row of
-- public.idem_plant_log as current_user, and a non-transactional
-- public.idem_plant_hits, which a rollback does not undo), and calls idem's
-- own function.  A library that names idem's schema and casts every
-- argument to idem's exact types never reaches one (test/lib.sh,
-- plants_check).  Run by a superuser after CREATE EXTENSION idem.
CREATE TABLE public.idem_plant_log (who text, fn text, at timestamptz DEFAULT pg_catalog.now());
GRANT INSERT ON public.idem_plant_log TO PUBLIC;
CREATE SEQUENCE public.idem_plant_hits;
GRANT USAGE ON SEQUENCE public.idem_plant_hits TO PUBLIC;

SELECT pg_catalog.set_config('idem_test.callers', :'callers', false);
DO $plant$
DECLARE
    idem_nsp oid := (SELECT e.extnamespace FROM pg_catalog.pg_extension e WHERE e.extname = 'idem');
    f record;
    nsp text;
    t text;
    decl text[];
    call text[];
    ins text[];         -- the types of the arguments, idem's
    types text[];
    sig text;
    planted int := 0;
BEGIN
    FOREACH nsp IN ARRAY ARRAY(SELECT DISTINCT s FROM pg_catalog.unnest(ARRAY[idem_nsp::regnamespace::text]
            || pg_catalog.string_to_array(pg_catalog.current_setting('idem_test.callers'), ' ')) s) LOOP
        EXECUTE pg_catalog.format('CREATE SCHEMA IF NOT EXISTS %I', nsp);
        EXECUTE pg_catalog.format('GRANT USAGE ON SCHEMA %I TO PUBLIC', nsp);
        FOR f IN
            SELECT p.oid, p.proname, p.pronargs, p.pronargdefaults,
                   pg_catalog.pg_get_function_result(p.oid) AS result,
                   COALESCE(p.proallargtypes, pg_catalog.string_to_array(p.proargtypes::text, ' ')::oid[]) AS alltypes,
                   COALESCE(p.proargmodes, pg_catalog.array_fill('i'::"char", ARRAY[p.pronargs])) AS modes,
                   COALESCE(p.proargnames, '{}') AS names
              FROM pg_catalog.pg_proc p
              JOIN pg_catalog.pg_depend d ON d.classid = 'pg_catalog.pg_proc'::regclass AND d.objid = p.oid
                                        AND d.refclassid = 'pg_catalog.pg_extension'::regclass AND d.deptype = 'e'
              JOIN pg_catalog.pg_extension e ON e.oid = d.refobjid AND e.extname = 'idem'
             WHERE p.pronamespace = idem_nsp AND p.pronargs > 0 AND p.prokind = 'f'
        LOOP
            ins := ARRAY(SELECT f.alltypes[k]::regtype::text FROM pg_catalog.generate_subscripts(f.alltypes, 1) k
                          WHERE f.modes[k] IN ('i', 'b', 'v') ORDER BY k);
            -- the arguments every call gives: an overload of a defaulted one
            -- would make a call that leaves it out ambiguous, not captured
            -- (that case has a test of its own)
            FOR i IN 1 .. f.pronargs - f.pronargdefaults LOOP
                FOREACH t IN ARRAY ARRAY['smallint', 'integer', 'numeric', 'real', 'text', 'character varying',
                                         'character', 'json'] LOOP
                    CONTINUE WHEN t = ins[i];
                    types := ins;
                    types[i] := t;
                    decl := '{}';
                    call := '{}';
                    FOR j IN 1 .. f.pronargs LOOP
                        decl := decl || (pg_catalog.format('p%s %s', j, types[j])
                                         || CASE WHEN j > f.pronargs - f.pronargdefaults THEN ' DEFAULT NULL' ELSE '' END);
                        call := call || pg_catalog.format('p%s::%s', j, ins[j]);
                    END LOOP;
                    FOR k IN 1 .. pg_catalog.array_length(f.alltypes, 1) LOOP
                        IF f.modes[k] = 'o' THEN
                            decl := decl || pg_catalog.format('OUT %I %s', f.names[k], f.alltypes[k]::regtype);
                        END IF;
                    END LOOP;
                    sig := pg_catalog.format('%I.%I(%s)', nsp, f.proname, pg_catalog.array_to_string(types, ', '));
                    BEGIN
                        EXECUTE pg_catalog.format(
                            'CREATE FUNCTION %I.%I(%s) RETURNS %s LANGUAGE sql AS $body$'
                            ' SELECT pg_catalog.nextval(''public.idem_plant_hits'');'
                            ' INSERT INTO public.idem_plant_log (who, fn) VALUES (current_user, %L);'
                            ' SELECT * FROM %s.%I(%s) $body$',
                            nsp, f.proname, pg_catalog.array_to_string(decl, ', '), f.result, sig,
                            idem_nsp::regnamespace, f.proname, pg_catalog.array_to_string(call, ', '));
                        EXECUTE pg_catalog.format('GRANT EXECUTE ON FUNCTION %s TO PUBLIC', sig);
                        planted := planted + 1;
                    EXCEPTION WHEN duplicate_function OR undefined_function OR cannot_coerce
                              OR datatype_mismatch OR invalid_function_definition THEN
                        NULL;   -- no cast to idem's type
                    END;
                END LOOP;
            END LOOP;
        END LOOP;
    END LOOP;
    RAISE NOTICE 'planted % overloads of idem''s functions', planted;
END
$plant$;
