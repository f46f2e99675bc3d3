# DROP DATABASE, CREATE DATABASE ... TEMPLATE, DROP EXTENSION, CREATE EXTENSION
# and a table's ACCESS EXCLUSIVE lock never wait long on the cleanup worker.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use List::Util qw(max);
use IdemTest;

# small batches with a pause after each: a round over the 20,000 rows each
# database gets takes at least $round seconds (400 pauses of 50 ms), longer
# on a busy machine.  Each command below must not wait for the worker's
# round: it waits at most one batch, so it must end before half a round
# would have passed.  A bound against what it guards against, not a speed.
my $node = idem_node('main', conf => [
	'idem.cleanup_batch_size = 50',
	'idem.cleanup_batch_delay = 50ms']);
my $round = 20000 / 50 * 0.050;
$node->start;

# Wait until the worker is connected to db; false if it does not come.
sub worker_in
{
	my ($db) = @_;
	return defined wait_until($node, 'postgres', qq{
		SELECT count(*) > 0 FROM pg_stat_activity
		WHERE backend_type = 'idem cleanup worker' AND datname = '$db'}, 't', 10);
}

# Run SQL and return the seconds it took.
sub timed
{
	my ($db, $sql) = @_;
	my $start = time;
	$node->safe_psql($db, $sql);
	return time - $start;
}

# --- DROP DATABASE while the worker is in it, 20 times ---
my @drop;
my ($present, $failed_drops) = (0, 0);
for my $i (1 .. 20)
{
	$node->safe_psql('postgres', "CREATE DATABASE drop_me_$i");
	$node->safe_psql("drop_me_$i", 'CREATE EXTENSION idem');
	add_records($node, "drop_me_$i", 'old', 20000, '-1 second');
	# odd rounds: drop as soon as the worker is in; even ones: at a random moment
	if ($i % 2) { $present++ if worker_in("drop_me_$i"); }
	else { usleep(int(rand(1_500_000))); }
	my $start = time;
	my ($rc, $out, $err) = $node->psql('postgres', "DROP DATABASE drop_me_$i");
	push @drop, time - $start;
	$failed_drops++ if $rc != 0;
	diag("DROP DATABASE failed: $err") if $rc != 0;
}
is($failed_drops, 0, 'every DROP DATABASE succeeded');
is($present, 10, 'in 10 of them the worker was connected to the database at the DROP');
ok(max(@drop) < $round / 2, sprintf('DROP DATABASE took at most %.3f s (median %.3f s), less than half a round',
	max(@drop), (sort { $a <=> $b } @drop)[10]));
note(sprintf('DROP DATABASE seconds: %s', join(' ', map { sprintf('%.3f', $_) } @drop)));

# --- CREATE DATABASE ... TEMPLATE of a database the worker is in ---
$node->safe_psql('postgres', 'CREATE DATABASE source_db');
$node->safe_psql('source_db', 'CREATE EXTENSION idem');
my @copy;
for my $i (1 .. 5)
{
	add_records($node, 'source_db', "old$i", 20000, '-1 second');
	ok(worker_in('source_db'), "copy $i: the worker is in the template database");
	my $start = time;
	my ($rc, $out, $err) = $node->psql('postgres', "CREATE DATABASE copy_$i TEMPLATE source_db");
	push @copy, time - $start;
	is($rc, 0, "copy $i: CREATE DATABASE ... TEMPLATE succeeded") or diag($err);
	# the copy has a backlog of its own; it would hold up the rounds
	$node->safe_psql('postgres', "DROP DATABASE copy_$i");
}
ok(max(@copy) < $round / 2, sprintf('CREATE DATABASE ... TEMPLATE took at most %.3f s, less than half a round', max(@copy)));
# its backlog would hold up the next rounds
$node->safe_psql('postgres', 'DROP DATABASE source_db');

# --- DROP EXTENSION and CREATE EXTENSION while the worker is in the database ---
$node->safe_psql('postgres', 'CREATE DATABASE ext_db');
my (@drop_ext, @create_ext);
for my $i (1 .. 5)
{
	push @create_ext, timed('ext_db', 'CREATE EXTENSION idem');
	add_records($node, 'ext_db', 'old', 20000, '-1 second');
	ok(worker_in('ext_db'), "extension $i: the worker is in the database");
	push @drop_ext, timed('ext_db', 'DROP EXTENSION idem');
}
ok(max(@drop_ext) < $round / 2, sprintf('DROP EXTENSION took at most %.3f s, less than half a round', max(@drop_ext)));
ok(max(@create_ext) < $round / 2, sprintf('CREATE EXTENSION took at most %.3f s, less than half a round', max(@create_ext)));

# --- DROP EXTENSION committed while the worker waits for idem's table: the
# worker finds the table gone and ends its round without an ERROR.  The drop
# holds its locks until the worker waits for one (pg_locks), then commits at
# once, within the worker's 100 ms lock_timeout ---
$node->safe_psql('postgres', 'CREATE DATABASE drop_wait_db');
my $waits_met = 0;
my $drop_log = -s $node->logfile;
for my $i (1 .. 5)
{
	$node->safe_psql('drop_wait_db', 'CREATE EXTENSION idem');
	add_records($node, 'drop_wait_db', 'old', 20000, '-1 second');
	ok(worker_in('drop_wait_db'), "drop $i: the worker is in the database");
	my $dropper = $node->background_psql('drop_wait_db');
	$dropper->query_safe('BEGIN; DROP EXTENSION idem');
	# a generous cap on the polling (one round at least); the commit follows
	# the first poll that sees the worker waiting
	my $met = $dropper->query_safe(q{
		DO $$ BEGIN
			FOR i IN 1 .. 60000 LOOP
				IF EXISTS (SELECT FROM pg_catalog.pg_locks l JOIN pg_catalog.pg_stat_activity a USING (pid)
				            WHERE a.backend_type = 'idem cleanup worker' AND a.datname = 'drop_wait_db'
				              AND NOT l.granted) THEN
					PERFORM pg_catalog.set_config('idem_test.met', 'waiting', false);
					EXIT;
				END IF;
				PERFORM pg_catalog.pg_sleep(0.001);
			END LOOP;
		END $$;
		COMMIT;
		SELECT pg_catalog.current_setting('idem_test.met', true)});
	$waits_met++ if $met =~ /waiting/;
	$dropper->quit;
}
ok($waits_met == 5, "each drop committed while the worker waited for a lock it held ($waits_met of 5)");
# the worker's next round: the database has no idem any more
ok(defined wait_until($node, 'postgres', q{
	SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker' AND datname = 'drop_wait_db'},
	'0', 10), 'the worker left the database');
my $drop_errors = slurp_file($node->logfile, $drop_log);
unlike($drop_errors, qr/could not open relation with OID/, 'no worker failed to open a relation the drop removed');
is(join("\n", grep { /ERROR/ && !/canceling statement due to lock timeout/ } split /\n/, $drop_errors), '',
	'no ERROR but lock timeouts while the drops committed');
$node->safe_psql('postgres', 'DROP DATABASE drop_wait_db');

# --- a table held by ACCESS EXCLUSIVE delays the worker, never the reverse ---
$node->safe_psql('postgres', 'CREATE DATABASE locked_db');
$node->safe_psql('postgres', 'CREATE DATABASE free_db');
$node->safe_psql($_, 'CREATE EXTENSION idem') for ('locked_db', 'free_db');
add_records($node, 'locked_db', 'old', 20000, '-1 second');
ok(worker_in('locked_db'), 'the worker is busy in locked_db');
my $holder = $node->background_psql('locked_db');
my $start = time;
$holder->query_safe('BEGIN; LOCK TABLE idem_internal.idempotency_record IN ACCESS EXCLUSIVE MODE');
my $lock_wait = time - $start;
ok($lock_wait < $round / 2, sprintf('LOCK TABLE ... ACCESS EXCLUSIVE waited %.3f s for the busy worker, less than half a round', $lock_wait));
my $log_offset = -s $node->logfile;
add_records($node, 'free_db', 'old', 500, '-1 second');
ok(defined wait_until($node, 'free_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 10),
	'another database is still cleaned while locked_db is held');
ok(defined wait_until($node, 'free_db', q{
	SELECT last_error FROM idem_cleanup_status() WHERE datname = 'locked_db'},
	'canceling statement due to lock timeout', 10),
	'idem_cleanup_status() shows the lock timeout in locked_db');
# once per round: the log lines of a window against the rounds the worker
# counted in it (a round may straddle either end of the window), not against
# the clock, which a slow or busy machine stretches
my $runs_sql = q{SELECT runs FROM idem_cleanup_status() WHERE datname = 'locked_db'};
my $runs_before = $node->safe_psql('free_db', $runs_sql);
$log_offset = -s $node->logfile;
wait_until($node, 'free_db', "SELECT ($runs_sql) >= $runs_before + 3", 't');
my $runs = $node->safe_psql('free_db', $runs_sql) - $runs_before;
my $log = slurp_file($node->logfile, $log_offset);
my $errors = () = $log =~ /ERROR:  canceling statement due to lock timeout/g;
ok($runs >= 1 && $errors >= $runs - 1 && $errors <= $runs + 1,
	"the lock timeout is logged once per round ($errors times in $runs rounds)");
$holder->query_safe('COMMIT');
$holder->quit;
ok(defined wait_until($node, 'locked_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 30),
	'once the lock is gone, locked_db is cleaned');
# (the rows are gone before the round that deleted them has finished: wait
# for its end, not for a moment)
ok(defined wait_until($node, 'free_db', q{
	SELECT last_error IS NOT NULL AND last_run_finished > last_error_at
	FROM idem_cleanup_status() WHERE datname = 'locked_db'}, 't', 60),
	'the status keeps the last error and shows a later successful run');

# --- the worker deletes with the extension owner's rights: a permission error ---
$node->safe_psql('postgres', 'CREATE DATABASE perm_db');
$node->safe_psql('perm_db', 'CREATE EXTENSION idem');
$node->safe_psql('perm_db', q{
	CREATE ROLE plain_owner NOLOGIN;
	UPDATE pg_extension SET extowner = 'plain_owner'::regrole WHERE extname = 'idem'});
add_records($node, 'perm_db', 'old', 100, '-1 second');
add_records($node, 'free_db', 'again', 100, '-1 second');
ok(defined wait_until($node, 'free_db', q{
	SELECT last_error FROM idem_cleanup_status() WHERE datname = 'perm_db'},
	'permission denied for table idempotency_record', 10),
	'an owner without DELETE rights: the worker gets a permission error, shown in the status');
is(count_records($node, 'perm_db'), '100', 'and deleted nothing there');
ok(defined wait_until($node, 'free_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 10),
	'another database is still cleaned');
$node->safe_psql('perm_db', q{
	UPDATE pg_extension SET extowner = (SELECT relowner FROM pg_class WHERE relname = 'idempotency_record')
	WHERE extname = 'idem'});
ok(defined wait_until($node, 'perm_db',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 10),
	'with the owner back, perm_db is cleaned');

$node->stop;
done_testing();
