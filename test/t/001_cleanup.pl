# The cleanup worker deletes expired records in every database that has idem,
# keeps the others, follows its GUCs on reload, and is absent where it must be.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IdemTest;

my $interval = 2;
my $node = idem_node('main', conf => ["idem.cleanup_interval = $interval"]);
$node->start;

for my $db ('db_a', 'db_b', 'db_plain')
{
	$node->safe_psql('postgres', "CREATE DATABASE $db");
}
$node->safe_psql($_, 'CREATE EXTENSION idem') for ('postgres', 'db_a', 'db_b');

is(launcher_pid($node) ne '', 1, 'the launcher shows in pg_stat_activity as "idem cleanup launcher"');
is($node->safe_psql('postgres', q{
	SELECT datname IS NULL FROM pg_stat_activity WHERE backend_type = 'idem cleanup launcher'}),
	't', 'the launcher is connected to no database');

# --- expired rows go within 2 intervals in two databases, live rows stay ---
for my $db ('db_a', 'db_b')
{
	add_records($node, $db, 'old', 3000, '-1 second');
	add_records($node, $db, 'new', 50, '1 hour');
}
my $start = time;
my $waited;
for (;;)
{
	my $left = count_records($node, 'db_a') + count_records($node, 'db_b');
	if ($left == 0) { $waited = time - $start; last; }
	last if time - $start > 4 * $interval;
	usleep(50_000);
}
ok(defined $waited && $waited <= 2 * $interval,
	sprintf('expired records of both databases are gone within 2 intervals (%.2f s)', $waited // -1));
is(count_records($node, 'db_a', 'live') . '/' . count_records($node, 'db_b', 'live'),
	'50/50', 'records that have not expired stay');

my $status = $node->safe_psql('postgres', q{
	SELECT string_agg(datname || ':' || total_deleted || ':' || (last_error IS NULL), ',' ORDER BY datname)
	FROM idem_cleanup_status() WHERE datname LIKE 'db_%'});
is($status, 'db_a:3000:true,db_b:3000:true',
	'idem_cleanup_status() counts the deleted rows per database; a database without idem is not listed');

# --- the protocol end to end: a key whose record expired and was cleaned starts fresh ---
my $first = $node->safe_psql('postgres', q{
	SET idem.ttl = 1;
	SELECT order_id FROM idem_create_order(7, 'cleanup-key-0000001', 1, 1)});
is($node->safe_psql('postgres',
	q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = 'cleanup-key-0000001'}),
	'1', 'a call leaves its record');
ok(defined wait_until($node, 'postgres',
	q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = 'cleanup-key-0000001'},
	'0', 4 * $interval + 1), 'the worker deletes it once it has expired');
my $second = $node->safe_psql('postgres', q{
	SELECT order_id || ':' || replayed FROM idem_create_order(7, 'cleanup-key-0000001', 1, 1)});
is($second, ($first + 1) . ':false', 'the same key then executes afresh');
is($node->safe_psql('postgres', 'SELECT count(*) FROM idem_internal.purchase_order'), '2',
	'the first order stays: cleanup deletes records, never business rows');

# --- expired inbox entries go too; acknowledged outbox messages go at once ---
$node->safe_psql('db_b', q{
	SELECT idem_outbox_emit('t', jsonb_build_object('n', n), 'k' || n % 3) FROM generate_series(1, 1500) n;
	SELECT idem_outbox_ack(ARRAY(SELECT message_id FROM idem_internal.idem_outbox WHERE (payload->>'n')::int <= 1200));
	SELECT idem_consume('c', 'expired-' || n, '1 hour') FROM generate_series(1, 1200) n;
	SELECT idem_consume('c', 'live-' || n) FROM generate_series(1, 30) n;
	UPDATE idem_internal.idem_inbox SET expires_at = now() - interval '1 second' WHERE message_id LIKE 'expired-%';
});
is($node->safe_psql('db_b', q{
	SELECT count(*) || ' ' || string_agg(CASE WHEN ready THEN msg_key || ':' || (payload->>'n') END, ',' ORDER BY msg_key)
	FROM idem_internal.idem_outbox}),
	'300 k0:1203,k1:1201,k2:1202',
	'an acknowledgement deletes its messages at once (1.12), and each key\'s first message left is its head');
ok(defined wait_until($node, 'db_b',
	q{SELECT (SELECT count(*) FROM idem_internal.idem_outbox) || '/' || (SELECT count(*) FROM idem_internal.idem_inbox)},
	'300/30', 4 * $interval + 1),
	'the worker deletes expired inbox entries, in batches; unacknowledged messages and live entries stay');
is($node->safe_psql('db_b', q{
	SELECT string_agg(operation || ' ' || cleanup_deleted, ', ' ORDER BY operation)
	FROM idem_stats WHERE datname = 'db_b' AND cleanup_deleted > 0}),
	'c 1200, test 3000',
	'idem_stats counts what the worker deleted, per operation and consumer');

# --- an operation refusing reused keys without an audit period: a WARNING a round (1.13) ---
my $log_offset = -s $node->logfile;
$node->safe_psql('db_b', q{SET client_min_messages = error; SELECT idem_set_policy('NOAUDIT', reuse_after_expiry => 'refuse')});
ok($node->wait_for_log(qr/WARNING:  idem: operation NOAUDIT refuses reused keys but keeps no audit period: its expired keys execute again/,
		$log_offset),
	'the cleanup worker warns of an operation refusing reused keys with no audit period');
$node->safe_psql('db_b', q{SELECT idem_drop_policy('NOAUDIT')});

# --- ALTER SYSTEM + reload changes the pace without a restart ---
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 3600');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
# let a round that was already running end
wait_until($node, 'postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker'}, '0', 10);
usleep(500_000);
add_records($node, 'db_a', 'slow', 100, '-1 second');
sleep(2 * $interval + 1);
is(count_records($node, 'db_a'), '100', 'with idem.cleanup_interval = 1h nothing is deleted for 2 old intervals');
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 1');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
$waited = wait_until($node, 'db_a',
	q{SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()}, '0', 10);
# (with the hour's interval still in force they would stay an hour)
ok(defined $waited,
	sprintf('back to 1 s after a reload, the records go (%.2f s)', $waited // -1));

# --- idem.cleanup_interval = 0 turns the worker off; idem.cleanup_databases limits it ---
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 0');
$node->safe_psql('postgres', q{ALTER SYSTEM SET idem.cleanup_databases = 'db_b, postgres'});
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
wait_until($node, 'postgres',
	q{SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker'}, '0', 10);
add_records($node, $_, 'off', 10, '-1 second') for ('db_a', 'db_b');
sleep(3);
is(count_records($node, 'db_a') . '/' . count_records($node, 'db_b'), '10/10',
	'idem.cleanup_interval = 0: nothing is deleted');
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 1');
$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
ok(defined wait_until($node, 'db_b',
	q{SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()}, '0', 10),
	'turned on again, it cleans a listed database');
# two more visits of db_b: a whole round went by after db_b was cleaned
my $runs_b = $node->safe_psql('db_b', q{SELECT runs FROM idem_cleanup_status() WHERE datname = 'db_b'});
ok(defined wait_until($node, 'db_b',
	qq{SELECT (SELECT runs FROM idem_cleanup_status() WHERE datname = 'db_b') >= $runs_b + 2}, 't'),
	'two more rounds visited db_b');
is(count_records($node, 'db_a'), '10', 'and leaves a database not in idem.cleanup_databases alone');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_cleanup_status() WHERE datname = 'db_a'}),
	'0', 'a database no longer visited leaves idem_cleanup_status()');
my ($rc, $out, $err) = $node->psql('postgres', q{ALTER SYSTEM SET idem.cleanup_databases = 'a,,b'});
like($err, qr/invalid value for parameter "idem.cleanup_databases"/, 'a malformed database list is refused');

# --- privileges of idem_cleanup_status() ---
$node->safe_psql('postgres', 'CREATE ROLE watcher LOGIN; CREATE ROLE nobody LOGIN; GRANT pg_monitor TO watcher');
($rc, $out, $err) = $node->psql('postgres', 'SELECT count(*) FROM idem_cleanup_status()', extra_params => ['-U', 'nobody']);
like($err, qr/permission denied for function idem_cleanup_status/, 'PUBLIC may not read the status');
($rc, $out, $err) = $node->psql('postgres', 'SELECT count(*) >= 1 FROM idem_cleanup_status()', extra_params => ['-U', 'watcher']);
is($out, 't', 'pg_monitor may');

$node->stop;

# --- under pg_upgrade (binary-upgrade mode) the launcher does not start ---
command_ok([ 'pg_ctl', '-D', $node->data_dir, '-l', $node->logfile, '-o', '-b', '-w', 'start' ],
	'the server starts in binary-upgrade mode');
sleep(1);
is(launcher_pid($node), '', 'no launcher under pg_upgrade');
command_ok([ 'pg_ctl', '-D', $node->data_dir, '-m', 'fast', '-w', 'stop' ], 'and stops');

# --- without shared_preload_libraries: a NOTICE, every function works, no worker ---
my $plain = PostgreSQL::Test::Cluster->new('plain');
$plain->init;
$plain->start;
($rc, $out, $err) = $plain->psql('postgres', 'CREATE EXTENSION idem');
is($rc, 0, 'CREATE EXTENSION works without shared_preload_libraries');
like($err, qr/NOTICE:  idem is not in shared_preload_libraries, so its cleanup worker is not running/,
	'and says in a NOTICE that the cleanup worker is absent');
is($plain->safe_psql('postgres', q{
	SELECT replayed FROM idem_create_order(1, 'no-preload-key-001', 5, 1);
	SELECT replayed FROM idem_create_order(1, 'no-preload-key-001', 5, 1);
	SELECT idem_cleanup_expired();
	SELECT count(*) FROM idem_cleanup_status()}), "f\nt\n0\n0",
	'idem_create_order, idem_cleanup_expired and idem_cleanup_status work; the status is empty');
is(launcher_pid($plain), '', 'no launcher runs');
($rc, $out, $err) = $plain->psql('postgres', 'SELECT * FROM idem_stats');
like($err, qr/ERROR:  idem's statistics need idem in shared_preload_libraries/,
	'idem_stats says it needs shared_preload_libraries');
is($plain->safe_psql('postgres', q{
	SELECT idem_outbox_emit('plain', '{}') > 0;
	SELECT count(*) FROM idem_outbox_fetch('plain')}), "t
1",
	'the outbox works without the notifier (each transaction notifies itself)');
$plain->stop;

# --- idem.stats_max: operations beyond it count in one (other) row ---
my $small = idem_node('small', conf => ['idem.cleanup_interval = 0', 'idem.stats_max = 3']);
$small->start;
$small->safe_psql('postgres', 'CREATE EXTENSION idem');
$small->safe_psql('postgres', q{
	SELECT count(*) FROM generate_series(1, 5) g,
	       LATERAL idem_create_order(g, 'stats-max-key-' || lpad(g::text, 6, '0'), 1, 1);
	SELECT idem_outbox_emit('topic_' || g, '{}') FROM generate_series(1, 5) g;
});
is($small->safe_psql('postgres', q{
	SELECT string_agg(coalesce(datname, '-') || ' ' || operation || ' ' || calls || ' ' || executed || ' ' || outbox_emitted,
	                  ', ' ORDER BY operation)
	FROM idem_stats}),
	'- (other) 0 0 3, postgres CREATE_ORDER 5 5 0, postgres topic_1 0 0 1, postgres topic_2 0 0 1',
	'3 rows, and the operations beyond idem.stats_max count in the (other) row');
$small->stop;

done_testing();
