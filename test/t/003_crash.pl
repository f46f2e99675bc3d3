# The cleanup worker comes back by itself after a termination or a crash,
# and a fast shutdown does not wait for it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IdemTest;

my $node = idem_node('main', conf => [
	'idem.cleanup_batch_size = 100',
	'idem.cleanup_batch_delay = 5ms',
	'restart_after_crash = on']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $expired = q{SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()};

# Wait for the per-database worker of postgres; returns its pid or ''.  One
# pid: on a busy machine the worker of a round that is ending may still be
# listed beside the next round's, and the newest is the busy one.
sub busy_worker
{
	wait_until($node, 'postgres', q{
		SELECT count(*) > 0 FROM pg_stat_activity
		WHERE backend_type = 'idem cleanup worker' AND datname = 'postgres'}, 't', 10);
	return $node->safe_psql('postgres', q{
		SELECT pid FROM pg_stat_activity
		WHERE backend_type = 'idem cleanup worker' AND datname = 'postgres'
		ORDER BY backend_start DESC LIMIT 1});
}

# --- pg_terminate_backend of the per-database worker ---
add_records($node, 'postgres', 'a', 30000, '-1 second');
my $pid = busy_worker();
ok($pid ne '', 'the worker is busy');
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($pid)"), 't', 'pg_terminate_backend of the worker');
ok(defined wait_until($node, 'postgres', $expired, '0', 60), 'cleaning resumes by itself and ends');
my $launcher = launcher_pid($node);
ok($launcher ne '', 'the launcher is still there');

# --- pg_terminate_backend of the launcher: back within a minute (bgw_restart_time) ---
is($node->safe_psql('postgres', "SELECT pg_terminate_backend($launcher)"), 't', 'pg_terminate_backend of the launcher');
wait_until($node, 'postgres', qq{
	SELECT count(*) FROM pg_stat_activity WHERE pid = $launcher}, '0', 10);
add_records($node, 'postgres', 'b', 500, '-1 second');
my $waited = wait_until($node, 'postgres', $expired, '0', 60);
ok(defined $waited, sprintf('a new launcher cleans again after %.1f s', $waited // -1));
isnt(launcher_pid($node), $launcher, 'it is a new process');

# --- kill -9 of the worker: the server restarts after a crash, and so does the cleanup ---
add_records($node, 'postgres', 'c', 30000, '-1 second');
$pid = busy_worker();
ok($pid ne '', 'the worker is busy again');
my $log_offset = -s $node->logfile;
kill 'KILL', $pid;
ok(defined wait_until($node, 'postgres', q{SELECT 1}, '1', 60), 'the server is back after the crash');
like(slurp_file($node->logfile, $log_offset), qr/terminated by signal 9/, 'the log shows the crash');
$waited = wait_until($node, 'postgres', $expired, '0', 90);
ok(defined $waited, sprintf('cleaning resumes by itself after the crash restart (%.1f s)', $waited // -1));
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_cleanup_status() WHERE datname = 'postgres'}),
	'1', 'the status table was rebuilt');

# --- pg_ctl stop -m fast with the worker inside an uncommitted batch of 100k rows ---
# The batch's AFTER DELETE row triggers fire when its deletes are done, before
# it commits (rowwrite.c): one of them waits for an advisory lock this test
# holds, so that the stop provably reaches the worker with all 100k rows
# deleted and nothing committed, however fast or slow the machine is.
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_batch_size = 200000');
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 3600');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
wait_until($node, 'postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker'}, '0', 30);
add_records($node, 'postgres', 'd', 100000, '-1 second');
$node->safe_psql('postgres', q{
	CREATE FUNCTION public.hold_batch() RETURNS trigger LANGUAGE plpgsql AS $$
	BEGIN PERFORM pg_catalog.pg_advisory_xact_lock_shared(4242); RETURN NULL; END $$;
	CREATE TRIGGER hold_batch AFTER DELETE ON idem_internal.idempotency_record
	FOR EACH ROW WHEN (OLD.idempotency_key = 'd-1') EXECUTE FUNCTION public.hold_batch()});
my $holder = $node->background_psql('postgres');
$holder->query_safe('SELECT pg_advisory_lock(4242)');
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 1');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(defined wait_until($node, 'postgres', q{
	SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a USING (pid)
	WHERE a.backend_type = 'idem cleanup worker' AND a.backend_xid IS NOT NULL
	  AND l.locktype = 'advisory' AND l.objid = 4242 AND NOT l.granted}, '1', 30),
	'the worker has deleted its batch of 100k rows and waits, uncommitted, in the batch');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'd-%'}),
	'100000', 'the batch is not committed');
my $start = time;
$node->stop('fast');
my $took = time - $start;
# (a worker that ignored the shutdown would hold pg_ctl until its timeout)
ok($took < $PostgreSQL::Test::Utils::timeout_default / 2,
	sprintf('pg_ctl stop -m fast took %.2f s, less than half its timeout', $took));
eval { $holder->quit };
$node->start;
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'd-%'}),
	'100000', 'the interrupted batch rolled back whole');
$node->safe_psql('postgres', 'DROP TRIGGER hold_batch ON idem_internal.idempotency_record');
ok(defined wait_until($node, 'postgres', $expired, '0', 60), 'the next rounds delete the batch');
$node->stop;
done_testing();
