-- Every member of the extension idem, as one line per fact, sorted: what
-- test/upgrade/suite_after_update.sh compares between a fresh install of
-- the current version and each older version updated to it.  The members
-- come from pg_depend (deptype 'e'), not from a list of names or a schema:
-- a member a script forgot, or one it left behind, is a line of its own.
-- For each: functions by pg_get_functiondef (body, language, volatility,
-- SET clauses, SECURITY DEFINER), their ACL and comment; tables, views and
-- sequences by their columns (name, logical order, type, NOT NULL,
-- default, collation), reloptions, persistence, ACL, comments (theirs and
-- their columns'), indexes, constraints and triggers by their definitions,
-- views by pg_get_viewdef, sequences by their parameters and owner column;
-- types by their enum labels in order or their attributes; schemas by their
-- ACL; and the extension's extconfig / extcondition.  OIDs never appear,
-- only names.  Run with psql -X -At.
SET search_path = pg_catalog, pg_temp;

WITH ext AS (
    SELECT oid, extconfig, extcondition FROM pg_extension WHERE extname = 'idem'
), m AS (
    SELECT d.classid, d.objid
    FROM pg_depend d, ext
    WHERE d.refclassid = 'pg_extension'::regclass AND d.refobjid = ext.oid AND d.deptype = 'e'
), rels AS (
    SELECT c.oid, c.oid::regclass::text AS name, c.relkind
    FROM m JOIN pg_class c ON m.classid = 'pg_class'::regclass AND c.oid = m.objid
), facts(fact) AS (
    -- functions
    SELECT 'function ' || p.oid::regprocedure::text || E'\n' || pg_get_functiondef(p.oid)
    FROM m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
    UNION ALL
    SELECT 'function ' || p.oid::regprocedure::text || ' acl ' || coalesce(p.proacl::text, '(default)')
           || ' comment ' || coalesce(obj_description(p.oid, 'pg_proc'), '(none)')
    FROM m JOIN pg_proc p ON m.classid = 'pg_proc'::regclass AND p.oid = m.objid
    -- relations: kind, persistence, options, ACL, comment
    UNION ALL
    SELECT 'relation ' || r.name || ' kind ' || r.relkind::text || ' persistence ' || c.relpersistence::text
           || ' options ' || coalesce(c.reloptions::text, '(none)')
           || ' acl ' || coalesce(c.relacl::text, '(default)')
           || ' comment ' || coalesce(obj_description(c.oid, 'pg_class'), '(none)')
    FROM rels r JOIN pg_class c ON c.oid = r.oid
    -- columns by name and logical order
    UNION ALL
    SELECT 'column ' || r.name || ' #' || row_number() OVER (PARTITION BY r.oid ORDER BY a.attnum)
           || ' ' || a.attname || ' ' || format_type(a.atttypid, a.atttypmod)
           || CASE WHEN a.attnotnull THEN ' not null' ELSE '' END
           || coalesce(' default ' || pg_get_expr(ad.adbin, ad.adrelid), '')
           || coalesce(' collate ' || nullif(co.collname, 'default'), '')
           || coalesce(' identity ' || nullif(a.attidentity::text, ''), '')
           || coalesce(' generated ' || nullif(a.attgenerated::text, ''), '')
           || ' acl ' || coalesce(a.attacl::text, '(default)')
           || ' comment ' || coalesce(col_description(r.oid, a.attnum), '(none)')
    FROM rels r
    JOIN pg_attribute a ON a.attrelid = r.oid AND a.attnum > 0 AND NOT a.attisdropped
    LEFT JOIN pg_attrdef ad ON ad.adrelid = r.oid AND ad.adnum = a.attnum
    LEFT JOIN pg_collation co ON co.oid = a.attcollation
    -- indexes of member tables
    UNION ALL
    SELECT 'index ' || r.name || ' ' || pg_get_indexdef(i.indexrelid)
           || ' options ' || coalesce(ic.reloptions::text, '(none)')
           || ' comment ' || coalesce(obj_description(i.indexrelid, 'pg_class'), '(none)')
    FROM rels r JOIN pg_index i ON i.indrelid = r.oid JOIN pg_class ic ON ic.oid = i.indexrelid
    -- constraints of member tables and types
    UNION ALL
    SELECT 'constraint ' || r.name || ' ' || con.conname || ' ' || pg_get_constraintdef(con.oid)
           || CASE WHEN con.condeferrable THEN ' deferrable' ELSE '' END
    FROM rels r JOIN pg_constraint con ON con.conrelid = r.oid
    -- triggers of member tables
    UNION ALL
    SELECT 'trigger ' || r.name || ' ' || pg_get_triggerdef(t.oid) || ' enabled ' || t.tgenabled::text
    FROM rels r JOIN pg_trigger t ON t.tgrelid = r.oid AND NOT t.tgisinternal
    -- views
    UNION ALL
    SELECT 'view ' || r.name || E'\n' || pg_get_viewdef(r.oid)
    FROM rels r WHERE r.relkind IN ('v', 'm')
    -- sequences
    UNION ALL
    SELECT 'sequence ' || r.name || ' ' || format_type(s.seqtypid, NULL)
           || ' start ' || s.seqstart || ' increment ' || s.seqincrement || ' min ' || s.seqmin
           || ' max ' || s.seqmax || ' cache ' || s.seqcache || ' cycle ' || s.seqcycle
           || coalesce(' owned by ' || (SELECT d.refobjid::regclass::text || '.' || a.attname
                                         FROM pg_depend d JOIN pg_attribute a ON a.attrelid = d.refobjid AND a.attnum = d.refobjsubid
                                         WHERE d.classid = 'pg_class'::regclass AND d.objid = r.oid
                                           AND d.refclassid = 'pg_class'::regclass AND d.deptype IN ('a', 'i')
                                         LIMIT 1), '')
    FROM rels r JOIN pg_sequence s ON s.seqrelid = r.oid
    -- types: enum labels in order, composite attributes through their relation
    UNION ALL
    SELECT 'type ' || t.oid::regtype::text || ' kind ' || t.typtype::text
           || coalesce(' labels ' || (SELECT string_agg(e.enumlabel, ',' ORDER BY e.enumsortorder)
                                      FROM pg_enum e WHERE e.enumtypid = t.oid), '')
           || coalesce(' attributes ' || (SELECT string_agg(a.attname || ' ' || format_type(a.atttypid, a.atttypmod), ', ' ORDER BY a.attnum)
                                          FROM pg_attribute a WHERE a.attrelid = t.typrelid AND a.attnum > 0 AND NOT a.attisdropped), '')
           || ' acl ' || coalesce(t.typacl::text, '(default)')
           || ' comment ' || coalesce(obj_description(t.oid, 'pg_type'), '(none)')
    FROM m JOIN pg_type t ON m.classid = 'pg_type'::regclass AND t.oid = m.objid
    -- schemas
    UNION ALL
    SELECT 'schema ' || n.nspname || ' acl ' || coalesce(n.nspacl::text, '(default)')
           || ' comment ' || coalesce(obj_description(n.oid, 'pg_namespace'), '(none)')
    FROM m JOIN pg_namespace n ON m.classid = 'pg_namespace'::regclass AND n.oid = m.objid
    -- any other kind of member, by its description
    UNION ALL
    SELECT 'member ' || pg_describe_object(m.classid, m.objid, 0)
    FROM m WHERE m.classid NOT IN ('pg_proc'::regclass, 'pg_class'::regclass, 'pg_type'::regclass, 'pg_namespace'::regclass)
    -- what pg_dump dumps of the extension's tables
    UNION ALL
    SELECT 'extconfig ' || c.oid::regclass::text || ' condition ' || coalesce(cond, '(none)')
    FROM ext, unnest(ext.extconfig, ext.extcondition) AS x(cfg, cond) JOIN pg_class c ON c.oid = x.cfg
)
SELECT fact FROM facts ORDER BY fact COLLATE "C";
