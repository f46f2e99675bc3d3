# Every idem setting given in postgresql.conf holds after a restart: SHOW
# in a new backend gives the configured value, the server log has no
# "invalid configuration parameter name" for any of them, and where a
# setting changes behaviour (a call, a task, the inbox, the cleanup
# worker), the behaviour follows it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IdemTest;

# a file of fingerprint secrets, the server's user's alone
my $keys = PostgreSQL::Test::Utils::tempdir() . '/fingerprint.keys';
open(my $kf, '>', $keys) or die "could not write $keys: $!";
print $kf "# idem fingerprint secrets\nv1:settings-secret-0123456789\n";
close($kf);
chmod(0600, $keys);

# Every idem GUC, each at a value that is not its default, as SHOW prints it.
my %settings = (
	'idem.ttl' => '2h',
	'idem.failure_ttl' => '20min',
	'idem.max_ttl' => '10d',
	'idem.wait_timeout' => '300ms',
	'idem.log_outcomes' => 'all',
	'idem.allowed_owners' => '1-1000',
	'idem.allowed_operations' => 'CREATE_ORDER,SHIP,PAY',
	'idem.inbox_ttl' => '3h',
	'idem.outbox_max_deliveries' => '7',
	'idem.retry_base' => '5ms',
	'idem.retry_max' => '40ms',
	'idem.max_attempts' => '3',
	'idem.cleanup_interval' => '2s',
	'idem.cleanup_batch_size' => '77',
	'idem.cleanup_max_batches' => '5',
	'idem.cleanup_batch_delay' => '7ms',
	'idem.cleanup_database_timeout' => '90s',
	'idem.cleanup_databases' => 'postgres',
	'idem.stats_max' => '500',
	'idem.stats_track' => 'off',
	'idem.audit_ttl' => '3d',
	'idem.operator_audit_ttl' => '30d',
	'idem.trace_context' => '00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01',
	'idem.reuse_after_expiry' => 'refuse',
	'idem.fingerprint_keys_file' => $keys,
);

my $node = PostgreSQL::Test::Cluster->new('settings');
$node->init;
$node->append_conf('postgresql.conf', join("\n",
	"shared_preload_libraries = 'idem'",
	map { "$_ = '$settings{$_}'" } sort keys %settings) . "\n");
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', 'CREATE DATABASE other');
$node->safe_psql('other', 'CREATE EXTENSION idem');
# a restart, as the issue was found: the values must survive it
$node->restart;

# the GUCs the server knows are exactly these: a new one must be added here
is($node->safe_psql('postgres',
		q{SELECT string_agg(name, ',' ORDER BY name) FROM pg_settings WHERE name LIKE 'idem.%'}),
	join(',', sort keys %settings), 'the test sets every idem GUC');
for my $name (sort keys %settings)
{
	is($node->safe_psql('postgres', "SHOW $name"), $settings{$name},
		"SHOW $name in a new backend gives postgresql.conf's value");
}
my $log = slurp_file($node->logfile);
unlike($log, qr/invalid configuration parameter name "idem\./,
	'the log has no "invalid configuration parameter name" for an idem setting');
unlike($log, qr/WARNING:.*idem\./, 'the log has no warning about an idem setting');

# --- the calls ---
is($node->safe_psql('postgres', q{
	SELECT replayed FROM idem_create_order(1, 'settings-key-0000001', 5, 1);
	SELECT (expires_at - created_at)::text FROM idem_internal.idempotency_record
	 WHERE idempotency_key = 'settings-key-0000001'}), "f\n02:00:00",
	'idem.ttl: a new record expires after 2 hours');
my ($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM idem_create_order(1001, 'settings-key-0000002', 5, 1)});
like($err, qr/owner 1001 is not one this session may act for/, 'idem.allowed_owners: owner 1001 is refused');
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM idem_begin(1, 'REFUND', 'settings-key-0000003', '{}')});
like($err, qr/operation "REFUND" is not one this session may act for/,
	'idem.allowed_operations: operation REFUND is refused');
($rc, $out, $err) = $node->psql('postgres',
	q{SELECT * FROM idem_begin(1, 'PAY', 'settings-key-0000004', '{}', ttl => '11 days')});
like($err, qr/idem\.max_ttl \(864000 seconds\)/, 'idem.max_ttl: a ttl of 11 days is refused');
like(slurp_file($node->logfile), qr/idem: owner 1 operation CREATE_ORDER key settings-key-0000001 resource \d+ outcome executed/,
	'idem.log_outcomes = all: the executed call is logged');
is($node->safe_psql('postgres', 'SELECT coalesce(sum(calls + executed), 0) FROM idem_stats'), '0',
	'idem.stats_track = off: nothing is counted');

# idem.wait_timeout: a duplicate of an original held open waits 300 ms, not 5 s
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN; SELECT replayed FROM idem_begin(1, 'PAY', 'settings-key-0000005', '{}')});
# the wait measured by the server, around the call alone
($rc, $out, $err) = $node->psql('postgres', q{
	SELECT clock_timestamp() AS t0 \gset
	SELECT * FROM idem_begin(1, 'PAY', 'settings-key-0000005', '{}');
	SELECT extract(epoch FROM clock_timestamp() - :'t0');}, on_error_stop => 0);
my $waited = $out;
like($err, qr/still being processed/, 'idem.wait_timeout: the duplicate is IK002');
ok($waited >= 0.25 && $waited < 5,
	sprintf('idem.wait_timeout: it waited %.2f s (300 ms configured; the default it must not use is 5 s)', $waited));
$holder->query_safe('ROLLBACK');
$holder->quit;

# idem.inbox_ttl
is($node->safe_psql('postgres', q{
	SELECT idem_consume('billing', 'settings-msg-1');
	SELECT (expires_at - consumed_at)::text FROM idem_internal.idem_inbox WHERE message_id = 'settings-msg-1'}),
	"t\n03:00:00", 'idem.inbox_ttl: an inbox entry expires after 3 hours');

# --- a task: idem.retry_base, idem.retry_max, idem.max_attempts, idem.failure_ttl ---
$node->safe_psql('postgres', q{SELECT task_id FROM idem_submit(1, 'SHIP', 'settings-task-000001', '{}')});
my @backoffs;
for my $attempt (1 .. 3)
{
	ok(defined wait_until($node, 'postgres', q{
		SELECT count(*) FROM (SELECT idem_fail(task_id, token, '{"carrier": "down"}')
		                        FROM idem_lease('SHIP', 'w')) s}, '1', 10),
		"attempt $attempt is leased and fails");
	push @backoffs, $node->safe_psql('postgres', q{
		SELECT status || ' ' || coalesce((task_due_at - updated_at <= interval '40 milliseconds')::text, 'not due')
		  FROM idem_internal.idempotency_record WHERE idempotency_key = 'settings-task-000001'});
}
is_deeply(\@backoffs, ['FAILED_RETRYABLE true', 'FAILED_RETRYABLE true', 'FAILED_FINAL not due'],
	'idem.retry_max: each backoff is at most 40 ms; idem.max_attempts = 3: the third failure is final');
is($node->safe_psql('postgres', q{
	SELECT task_attempts || ' ' || (expires_at - updated_at)::text FROM idem_internal.idempotency_record
	 WHERE idempotency_key = 'settings-task-000001'}), '3 00:20:00',
	'idem.failure_ttl: the final failure expires after 20 minutes');

# --- the cleanup worker: idem.cleanup_interval, _batch_size, _max_batches, _databases ---
add_records($node, $_, 'expired', 1000, '-1 second') for ('postgres', 'other');
ok(defined wait_until($node, 'postgres', q{
	SELECT last_run_deleted FROM idem_cleanup_status() WHERE datname = 'postgres'}, '385', 30),
	'a round deletes 5 batches of 77 rows (idem.cleanup_max_batches, idem.cleanup_batch_size)');
ok(defined wait_until($node, 'postgres',
	q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key LIKE 'expired-%'}, '0', 30),
	'rounds every 2 s (idem.cleanup_interval) delete the rest');
is(count_records($node, 'other'), '1000', 'idem.cleanup_databases: database "other" is not visited');

# idem.audit_ttl: the cleanup kept the audit fields of every record for 3 days
is($node->safe_psql('postgres', q{
	SELECT count(*) || ' ' || bool_and(audit_until = expires_at + interval '3 days')
	  FROM idem_internal.idem_history WHERE idempotency_key LIKE 'expired-%'}), '1000 true',
	'idem.audit_ttl: 1000 history rows, kept 3 days past their expiry');
# idem.operator_audit_ttl: an operator's action is kept 30 days
is($node->safe_psql('postgres', q{
	SELECT idem_task_cancel(task_id, 'settings test') FROM idem_submit(1, 'SHIP', 'settings-operator-0001', '{}');
	SELECT expires_at - acted_at FROM idem_internal.idem_operator_audit WHERE reason = 'settings test'}),
	"FAILED_FINAL\n30 days", 'idem.operator_audit_ttl: an audit row expires 30 days after its action');
# idem.trace_context: an emit carries it as its message's traceparent
is($node->safe_psql('postgres', q{
	SELECT idem_outbox_emit('settings.trace', '{}') > 0;
	SELECT headers->>'traceparent' FROM idem_internal.idem_outbox WHERE topic = 'settings.trace'}),
	"t\n00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	'idem.trace_context: an emit copies it into the message\'s headers');
# idem.reuse_after_expiry = refuse: an expired key in its audit period (its
# record expired, or archived by the worker meanwhile) is IK007
add_records($node, 'postgres', 'refused-expired-key', 1, '-1 second');
($rc, $out, $err) = $node->psql('postgres',
	q{SET idem.allowed_operations = ''; SELECT * FROM idem_begin(1, 'test', 'refused-expired-key-1', '{}')});
like($err, qr/idempotency key expired/, 'idem.reuse_after_expiry: a key in its audit period is refused');
# idem.fingerprint_keys_file: new records are keyed with its secret v1
is($node->safe_psql('postgres', q{
	SELECT fingerprint_version || ' ' || (request_hash <> idem_request_hash('{"qty": 1, "sku": 5}'))
	  FROM idem_internal.idempotency_record WHERE idempotency_key = 'settings-key-0000001'}), '1 true',
	'idem.fingerprint_keys_file: a new record is keyed with secret v1');
# request digests under a file secret (1.13): a generic record keyed with v1
# stores the digest of its request's bytes under a key derived from v1, and
# a replay of the same bytes is recognised by it: with the stored
# fingerprint spoiled, the same bytes still replay, other bytes of the same
# request do not
$node->safe_psql('postgres', q{
	SET idem.allowed_operations = '';
	BEGIN;
	SELECT idem_begin(1, 'keyed', 'keyed-digest-key-00001', '{"n": 1}');
	SELECT idem_finish(1, 'keyed', 'keyed-digest-key-00001', 201, '{}');
	COMMIT;
	UPDATE idem_internal.idempotency_record SET request_hash = repeat('0', 64)
	 WHERE idempotency_key = 'keyed-digest-key-00001'});
is($node->safe_psql('postgres', q{
	SELECT fingerprint_version || ' ' || length(request_digest)
	  FROM idem_internal.idempotency_record WHERE idempotency_key = 'keyed-digest-key-00001'}), '1 16',
	'idem.fingerprint_keys_file: a generic record stores its request digest, keyed with v1 too');
is($node->safe_psql('postgres', q{
	SET idem.allowed_operations = '';
	SELECT replayed FROM idem_begin(1, 'keyed', 'keyed-digest-key-00001', '{"n": 1}')}), 't',
	'idem.fingerprint_keys_file: the same bytes replay by their digest under v1');
is($node->safe_psql('postgres', q{
	SET idem.allowed_operations = '';
	SELECT replayed FROM idem_begin(1, 'keyed', 'keyed-digest-key-00001', '{"n": 1.0}')}), 't',
	'idem.fingerprint_keys_file: the same request respelled (1.0) replays by its digest under v1');
($rc, $out, $err) = $node->psql('postgres', q{
	SET idem.allowed_operations = '';
	SELECT replayed FROM idem_begin(1, 'keyed', 'keyed-digest-key-00001', '{"n": 2}')});
like($err, qr/already used with a different request/,
	'idem.fingerprint_keys_file: another request is compared by the (spoiled) fingerprint');

$node->stop;
done_testing();
