/* idem--1.8--1.9.sql */
\echo Use "ALTER EXTENSION idem UPDATE TO '1.9'" to load this file. \quit

-- ---------------------------------------------------------------------------
-- idem_outcome, what idem_begin and idem_run return, tells when the key's
-- record expires: a replay, the stored expiry; idem_run's first execution,
-- the expiry it stored; idem_begin's claim, the expiry idem_finish will
-- store for a success (2xx/3xx) in this transaction; a 4xx result expires
-- after idem.failure_ttl instead.  The client libraries send it as the
-- Idempotency-Expires header (clients/CONTRACT.md).
-- ---------------------------------------------------------------------------
ALTER TYPE @extschema@.idem_outcome ADD ATTRIBUTE expires_at timestamptz;
