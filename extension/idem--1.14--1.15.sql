/* idem--1.14--1.15.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.15'" to load this file. \quit

-- A definition this update replaces is copied from idem.sql by
-- test/upgrade/scripts.py --write, between "-- from idem.sql: <first
-- line>" and "-- end"; the rest is written here.

SELECT idem_internal.idem_revoke_foreign_privileges();
