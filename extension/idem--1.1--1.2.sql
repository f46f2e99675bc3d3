/* idem--1.1--1.2.sql: idem_create_order takes its owner's rights itself */

\echo Use "ALTER EXTENSION idem UPDATE TO '1.2'" to load this file. \quit

-- idem_create_order reads and writes its tables as its owner, switching in C
-- around that work only, and runs anything user-defined its writes may fire
-- (triggers, constraints) under search_path = pg_catalog, pg_temp.  fmgr's
-- SECURITY DEFINER switch, with its SET clause, saved and restored a GUC on
-- every call, replays included.  The library of 1.2 also runs the 1.1
-- definition correctly: it then switches to the owner a second time.
ALTER FUNCTION @extschema@.idem_create_order(bigint, text, bigint, integer)
    SECURITY INVOKER RESET search_path;
