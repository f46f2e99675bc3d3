--
-- Fingerprints do not depend on the database encoding: the canonical text
-- is hashed as UTF-8 whatever the server encoding is.
--
\set regress_db :DBNAME
SELECT idem_request_hash('{"qty":2,"sku":1001,"note":"déjà vu","zé":1,"z":"\u00ff"}') AS utf8_hash \gset
CREATE DATABASE regress_idem_latin1 TEMPLATE template0 ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C';
\c regress_idem_latin1
SET client_encoding = 'UTF8';	-- this file is UTF-8, whatever the database is
CREATE EXTENSION idem;
SHOW server_encoding;
SELECT idem_request_hash('{"qty":2,"sku":1001,"note":"déjà vu","zé":1,"z":"\u00ff"}') = :'utf8_hash' AS same_hash_as_utf8,
       idem_canonical_json('{"qty":2,"sku":1001,"note":"déjà vu","zé":1,"z":"\u00ff"}');
-- the order protocol works there too
SELECT order_no, replayed FROM idem_create_order(1, 'latin1-database-0001', 1001, 2);
SELECT order_no, replayed FROM idem_create_order(1, 'latin1-database-0001', 1001, 2);
SELECT request_hash = idem_request_hash('{"sku":1001,"qty":2}') AS fingerprint_matches FROM idem_internal.idempotency_record;
\c :regress_db
DROP DATABASE regress_idem_latin1;
