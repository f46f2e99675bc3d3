# A database's owner cannot stall the cleanup of the other databases
# (issue 10, D3).  The worker pins every setting that could block or fail it
# (ALTER DATABASE ... SET default_transaction_isolation = serializable,
# read_only, deferrable, statement_timeout), so an open SERIALIZABLE writer
# no longer makes it wait for a safe snapshot; and the launcher gives each
# database idem.cleanup_database_timeout, after which it stops that worker
# and goes on.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IdemTest;

my $node = idem_node('hostile');
$node->start;
# created in this order, so that a round visits them in it
for my $db ('hostile_db', 'other_db', 'slow_db', 'late_db')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
	$node->safe_psql($db, 'CREATE EXTENSION idem');
}

# --- the reproduction: defaults that would park the worker, and a writer ---
add_records($node, 'hostile_db', 'old', 200, '-1 second');
$node->safe_psql('postgres', q{
	ALTER DATABASE hostile_db SET default_transaction_isolation = 'serializable';
	ALTER DATABASE hostile_db SET default_transaction_read_only = on;
	ALTER DATABASE hostile_db SET default_transaction_deferrable = on;
	ALTER DATABASE hostile_db SET statement_timeout = '1ms';
	ALTER DATABASE hostile_db SET search_path = nowhere;});
my $writer = $node->background_psql('hostile_db');
$writer->query_safe(q{SET statement_timeout = 0});
$writer->query_safe(q{BEGIN ISOLATION LEVEL SERIALIZABLE READ WRITE});
$writer->query_safe(q{SELECT count(*) FROM idem_internal.idempotency_record});
add_records($node, 'other_db', 'old', 200, '-1 second');

# read hostile_db with its defaults turned off for the session
my $plain = q{SET default_transaction_deferrable = off; SET statement_timeout = 0; SET search_path = public; };
my $waited = wait_until($node, 'other_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 20);
ok(defined $waited, sprintf('another database is cleaned while hostile_db has a serializable writer and hostile defaults (%.1f s)', $waited // -1));
$waited = wait_until($node, 'hostile_db',
	$plain . 'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 20);
ok(defined $waited, sprintf('hostile_db itself is cleaned: the worker pins isolation, read-only, deferrable, timeouts, search_path (%.1f s)', $waited // -1));
is($node->safe_psql('other_db', q{
	SELECT coalesce(last_error, '') FROM idem_cleanup_status() WHERE datname = 'hostile_db'}), '',
	'no error is recorded for hostile_db');
$writer->query_safe('COMMIT');
$writer->quit;

# --- a worker past idem.cleanup_database_timeout is stopped ---
$node->safe_psql('slow_db', q{
	CREATE FUNCTION public.slow_delete() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN PERFORM pg_catalog.pg_sleep(0.2); RETURN OLD; END $$;
	CREATE TRIGGER slow_delete BEFORE DELETE ON idem_internal.idempotency_record
	FOR EACH ROW EXECUTE FUNCTION public.slow_delete();});
add_records($node, 'slow_db', 'old', 100, '-1 second');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idem.cleanup_database_timeout = '2s'});
$node->reload;
my $log_offset = -s $node->logfile;
add_records($node, 'late_db', 'old', 200, '-1 second');
$waited = wait_until($node, 'late_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 12);
ok(defined $waited, sprintf('a database whose worker needs 20 s does not hold up the next one: cleaned in %.1f s', $waited // -1));
ok(defined wait_until($node, 'other_db', q{
	SELECT last_error FROM idem_cleanup_status() WHERE datname = 'slow_db'},
	'stopped after idem.cleanup_database_timeout (2000 ms)', 30),
	'idem_cleanup_status() shows that slow_db was stopped');
like(slurp_file($node->logfile, $log_offset),
	qr/idem: the cleanup worker for database "slow_db" stopped after idem.cleanup_database_timeout/,
	'the launcher logs it');
# --- a database dropped while the round is busy elsewhere is skipped ---
$node->safe_psql('postgres', 'CREATE DATABASE doomed_db');
# a worker in slow_db of a round begun after doomed_db existed: the slow_db
# worker seen first may belong to an older round, so wait for the next one
my $first = '';
wait_until($node, 'postgres', q{SELECT count(*) > 0 FROM pg_stat_activity
	WHERE backend_type = 'idem cleanup worker' AND datname = 'slow_db'}, 't', 30);
$first = worker_pids($node, 'slow_db');
ok(defined wait_until($node, 'postgres', qq{
	SELECT count(*) > 0 FROM pg_stat_activity
	WHERE backend_type = 'idem cleanup worker' AND datname = 'slow_db'
	  AND pid::text <> ALL (pg_catalog.string_to_array('@{[ $first || 0 ]}', ','))}, 't', 30),
	'the worker is busy in slow_db, in a round that listed doomed_db');
$log_offset = -s $node->logfile;
my $late_runs = q{SELECT runs FROM idem_cleanup_status() WHERE datname = 'late_db'};
my $runs_at_drop = $node->safe_psql('late_db', $late_runs);
$node->safe_psql('postgres', 'DROP DATABASE doomed_db');
# the rest of the round (slow_db's 2 s budget, late_db, doomed_db's turn)
# is over once late_db has been visited twice more: the second visit is in
# a later round
ok(defined wait_until($node, 'late_db', qq{SELECT ($late_runs) >= $runs_at_drop + 2}, 't'),
	'two more visits of late_db after the drop: the round that listed doomed_db is over');
add_records($node, 'late_db', 'after-drop', 10, '-1 second');
ok(defined wait_until($node, 'late_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 15),
	'the rounds go on after the drop');
unlike(slurp_file($node->logfile, $log_offset), qr/FATAL:  database \d+ does not exist/,
	'no worker was started for it: no FATAL "database ... does not exist" in the log');

$node->safe_psql('postgres', q{ALTER SYSTEM RESET idem.cleanup_database_timeout});
$node->safe_psql('slow_db', q{DROP TRIGGER slow_delete ON idem_internal.idempotency_record});
$node->reload;
ok(defined wait_until($node, 'slow_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 30),
	'without the slow trigger and the short budget, slow_db is cleaned');

# --- schemas renamed between rounds: the worker keeps to the extension's own ---
# (from 1.13 idem's tables are in idem_internal, which only idem's owner may
# rename; the extension's schema is renamed here, with a look-alike put in
# its place)
$node->safe_psql('other_db', q{
	CREATE SCHEMA trap;
	CREATE TABLE trap.fired (what text, who name);
	CREATE FUNCTION trap.fire() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN INSERT INTO trap.fired VALUES (TG_OP || ' ' || TG_LEVEL, current_user); RETURN NULL; END $$;
	CREATE SCHEMA lookalike;
	CREATE TABLE lookalike.idempotency_record (LIKE idem_internal.idempotency_record INCLUDING ALL);
	INSERT INTO lookalike.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	VALUES (1, 'test', 'lookalike-1', repeat('0', 64), 'SUCCEEDED', now() - interval '1 hour');
	CREATE TRIGGER fire_stmt BEFORE DELETE ON lookalike.idempotency_record
		FOR EACH STATEMENT EXECUTE FUNCTION trap.fire();
	CREATE TRIGGER fire_row BEFORE DELETE ON lookalike.idempotency_record
		FOR EACH ROW EXECUTE FUNCTION trap.fire();
	ALTER SCHEMA public RENAME TO real_idem;
	ALTER SCHEMA lookalike RENAME TO public;});
$node->safe_psql('other_db', q{
	INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status, expires_at)
	SELECT 1, 'test', 'renamed-' || g, repeat('0', 64), 'SUCCEEDED', now() - interval '1 second'
	FROM generate_series(1, 100) g});
ok(defined wait_until($node, 'other_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 15),
	'after ALTER SCHEMA ... RENAME of the extension\'s schema the worker cleans idem_internal\'s table');
is($node->safe_psql('other_db', 'SELECT count(*) FROM trap.fired'), '0',
	'and never touches the look-alike renamed into the old name (its DELETE triggers never fired)');
is($node->safe_psql('other_db', 'SELECT count(*) FROM public.idempotency_record'), '1',
	'the look-alike keeps its expired row');
$node->safe_psql('other_db', q{
	ALTER SCHEMA public RENAME TO lookalike;
	ALTER SCHEMA real_idem RENAME TO public;});

# --- idem.cleanup_databases: an unquoted mixed-case name finds its database ---
$node->safe_psql('postgres', 'CREATE DATABASE "MixedCase"');
$node->safe_psql('MixedCase', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idem.cleanup_databases = 'MixedCase, "other_db"'});
my $other_runs = q{SELECT runs FROM idem_cleanup_status() WHERE datname = 'other_db'};
my $runs_at_reload = $node->safe_psql('other_db', $other_runs);
$node->reload;
# any round begun before the reload is over once other_db, named before and
# after, has been visited twice more
ok(defined wait_until($node, 'other_db', qq{SELECT ($other_runs) >= $runs_at_reload + 2}, 't'),
	'two more visits of other_db after the reload');
add_records($node, 'MixedCase', 'old', 50, '-1 second');
add_records($node, 'late_db', 'skipped', 50, '-1 second');
ok(defined wait_until($node, 'MixedCase',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 15),
	'idem.cleanup_databases = \'MixedCase, "other_db"\' cleans the database "MixedCase"');
# two more rounds reached other_db: late_db was left out of them
my $runs_cleaned = $node->safe_psql('other_db', $other_runs);
ok(defined wait_until($node, 'other_db', qq{SELECT ($other_runs) >= $runs_cleaned + 2}, 't'),
	'two more rounds after MixedCase was cleaned');
is(count_records($node, 'late_db'), '50', 'and not a database it does not name');
$node->safe_psql('postgres', q{ALTER SYSTEM RESET idem.cleanup_databases});
$node->reload;

$node->stop;
done_testing();
