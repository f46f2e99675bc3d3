# Retention and privacy (1.11) on a running server:
#
#  - keyed fingerprints: idem.fingerprint_keys_file set and reloaded, then
#    rotated (the file changed, no reload), then a version removed; plain
#    and keyed records compared at each step; the file's checks;
#  - the cleanup worker's snapshot-only cleanup over 1,000,000 records of
#    an operation with an audit period: every record deleted in batches,
#    every execution's audit fields kept in idem_internal.idem_history; the tables' sizes
#    before, after, and after a VACUUM.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time);
use IdemTest;

my $dir = PostgreSQL::Test::Utils::tempdir();
my $keys = "$dir/fingerprint.keys";

sub write_keys
{
	my ($mode, @lines) = @_;
	open(my $f, '>', $keys) or die "could not write $keys: $!";
	print $f join("\n", @lines) . "\n";
	close($f);
	chmod($mode, $keys);
}

my $node = idem_node('retention', conf => [
	'idem.cleanup_interval = 0',
	'idem.cleanup_batch_size = 10000',
	'idem.cleanup_max_batches = 1000',
	'idem.cleanup_batch_delay = 0',
	'max_wal_size = 4GB',
]);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
$node->safe_psql('postgres', q{SELECT count(*) FROM idem_grant('app', 'app')});

# a request and its call: owner 1, operation PAY, run by a handler
$node->safe_psql('postgres', q{
	CREATE FUNCTION ok_handler(request jsonb) RETURNS idem_result LANGUAGE sql
	AS $$ SELECT (201, '{"ok": true}'::json, NULL::jsonb, NULL::bigint)::idem_result $$});

sub begin_finish
{
	my ($key, $amount) = @_;
	return $node->psql('postgres', qq{
		SELECT replayed FROM idem_run(1, 'PAY', '$key', '{"amount": $amount}', 'ok_handler(jsonb)')});
}

sub replays
{
	my ($key, $amount) = @_;
	my ($rc, $out, $err) = $node->psql('postgres',
		qq{SELECT replayed FROM idem_begin(1, 'PAY', '$key', '{"amount": $amount}')});
	return $rc == 0 ? $out : $err;
}

sub stored
{
	my ($key) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT coalesce(fingerprint_version::text, 'plain') || ' ' ||
		       (request_hash = idem_request_hash(jsonb_build_object('amount', 5)))::text
		  FROM idem_internal.idempotency_record WHERE idempotency_key = '$key'});
}

sub reload_and_wait
{
	my ($value) = @_;
	$node->reload;
	ok(defined wait_until($node, 'postgres', 'SHOW idem.fingerprint_keys_file', $value, 30),
		"the reload set idem.fingerprint_keys_file to '$value'");
}

# --- keyed fingerprints ---
begin_finish('fp-plain-0000000001', 5);
is(stored('fp-plain-0000000001'), 'plain true', 'without a keys file: plain SHA-256, no version');

write_keys(0600, '# secrets of idem', 'v1:first-secret-0123456789abcdef');
$node->append_conf('postgresql.conf', "idem.fingerprint_keys_file = '$keys'\n");
reload_and_wait($keys);
begin_finish('fp-keyed-0000000001', 5);
is(stored('fp-keyed-0000000001'), '1 false', 'with the file: keyed (version 1), not the plain digest');
is($node->safe_psql('postgres', qq{
	SELECT request_hash = encode(hmac(idem_request_hash('{"amount": 5}'),
	                                  split_part(split_part(pg_read_file('$keys'), 'v1:', 2), E'\n', 1), 'sha256'), 'hex')
	  FROM idem_internal.idempotency_record WHERE idempotency_key = 'fp-keyed-0000000001'}), 't',
	'the keyed fingerprint is HMAC-SHA-256(secret, plain hex fingerprint), as pgcrypto computes it')
  if $node->safe_psql('postgres', q{SELECT count(*) FROM pg_available_extensions WHERE name = 'pgcrypto'}) eq '1'
  && $node->safe_psql('postgres', 'CREATE EXTENSION IF NOT EXISTS pgcrypto; SELECT 1') eq '1';
is(replays('fp-plain-0000000001', 5), 't', 'a plain record written before the file still replays');
is(replays('fp-keyed-0000000001', 5), 't', 'the keyed record replays');
like(replays('fp-keyed-0000000001', 6), qr/already used with a different request/,
	'the keyed record refuses another request (IK001)');
like(replays('fp-plain-0000000001', 6), qr/already used with a different request/,
	'the plain record refuses another request (IK001)');

# rotation: v2 signs from the next transaction on, without a reload
write_keys(0600, 'v1:first-secret-0123456789abcdef', 'v2:second-secret-0123456789abcdef');
begin_finish('fp-keyed-0000000002', 5);
is(stored('fp-keyed-0000000002'), '2 false', 'after the rotation new records are keyed with v2');
is(replays('fp-keyed-0000000001', 5), 't', 'a v1 record still replays (v1 verifies)');
is(replays('fp-keyed-0000000002', 5), 't', 'the v2 record replays');
is($node->safe_psql('postgres', q{
	SELECT count(DISTINCT request_hash) FROM idem_internal.idempotency_record
	 WHERE idempotency_key IN ('fp-plain-0000000001', 'fp-keyed-0000000001', 'fp-keyed-0000000002')}), '3',
	'one request, three stored fingerprints: plain, v1, v2');

# a version gone from the file: its records cannot be compared (55000)
write_keys(0600, 'v2:second-secret-0123456789abcdef');
like(replays('fp-keyed-0000000001', 5), qr/keyed with secret v1, which idem.fingerprint_keys_file does not hold/,
	'a record of a removed version is refused with a clear error');
is(replays('fp-keyed-0000000002', 5), 't', 'v2 records still replay');

# the file's own checks, on the next call that signs
write_keys(0644, 'v2:second-secret-0123456789abcdef');
my ($rc, $out, $err) = begin_finish('fp-keyed-0000000003', 5);
like($err, qr/Its group or others may access it/, 'a file others may read is refused');
write_keys(0600, 'v2:short');
($rc, $out, $err) = begin_finish('fp-keyed-0000000003', 5);
like($err, qr/Line 1: its secret is shorter than 16 bytes/, 'a short secret is refused');
write_keys(0600, 'v2:second-secret-0123456789abcdef', 'v2:third-secret-0123456789abcdef');
($rc, $out, $err) = begin_finish('fp-keyed-0000000003', 5);
like($err, qr/Line 2: its version appears twice/, 'a version given twice is refused');
write_keys(0600, 'x2:second-secret-0123456789abcdef');
($rc, $out, $err) = begin_finish('fp-keyed-0000000003', 5);
like($err, qr/Line 1: it does not start with "v<version>:"/, 'a line without a version is refused');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = 'fp-keyed-0000000003'}),
	'0', 'nothing was written by the refused calls');
write_keys(0600, 'v2:second-secret-0123456789abcdef');
($rc, $out, $err) = begin_finish('fp-keyed-0000000003', 5);
is($rc, 0, 'a good file again: the call goes through');

# a line over 1023 bytes is refused, never split into a second secret (1.13)
write_keys(0600, 'v2:second-secret-0123456789abcdef', 'v3:' . ('x' x 1020) . 'TAIL-SECRET-0123456789');
($rc, $out, $err) = begin_finish('fp-keyed-0000000004', 5);
like($err, qr/Line 2: it is longer than 1023 bytes/, 'a line over 1023 bytes refuses the file (F0000)');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE idempotency_key = 'fp-keyed-0000000004'}),
	'0', 'and nothing is written');

# a version's secret never changes (1.13): a session that read v2 and a new
# one both refuse a file whose v2 was rewritten, even at the same size
# within the same second; rotation is adding a version
write_keys(0600, 'v2:second-secret-0123456789abcdef');
my $reader = $node->background_psql('postgres', on_error_stop => 0);
is($reader->query_safe(q{SELECT replayed FROM idem_begin(1, 'PAY', 'fp-keyed-0000000002', '{"amount": 5}')}), 't',
	'a session reads v2 and replays a v2 record');
write_keys(0600, 'v2:second-secret-0123456789abcdeX');
$reader->query(q{SELECT replayed FROM idem_begin(1, 'PAY', 'fp-keyed-0000000002', '{"amount": 5}')});
like($reader->{stderr}, qr/changed the secret of version v2/,
	'that session refuses the same-size rewrite of v2 in its next transaction (55000), instead of IK001');
$reader->quit;
($rc, $out, $err) = $node->psql('postgres', q{SELECT replayed FROM idem_begin(1, 'PAY', 'fp-keyed-0000000002', '{"amount": 5}')});
like($err, qr/changed the secret of version v2.*\n.*\n?HINT:  A version's secret never changes/s,
	'a new session refuses it too, with the hint to add a new version');
write_keys(0600, 'v2:second-secret-0123456789abcdef', 'v3:third-secret-0123456789abcdef');
is(replays('fp-keyed-0000000002', 5), 't', 'v2 as it was, and a new v3: the v2 record replays again');
begin_finish('fp-keyed-0000000005', 5);
is(stored('fp-keyed-0000000005'), '3 false', 'and v3 signs new records');
write_keys(0600, 'v2:second-secret-0123456789abcdef');

# no secret is visible through a setting: the path is the superuser's
($rc, $out, $err) = $node->psql('postgres', 'SHOW idem.fingerprint_keys_file',
	extra_params => [ '-U', 'app' ]);
like($err, qr/must be superuser|permission denied|pg_read_all_settings/,
	'SHOW idem.fingerprint_keys_file is refused to another role');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM pg_settings WHERE name = 'idem.fingerprint_keys_file' AND setting IS NOT NULL}, extra_params => [ '-U', 'app' ]),
	'0', 'pg_settings shows the path to no other role');
unlike(slurp_file($node->logfile), qr/second-secret|first-secret/, 'no secret is in the server log');

# --- the worker's snapshot-only cleanup over 1,000,000 records ---
my $n = 1_000_000;
$node->safe_psql('postgres', q{
	SELECT operation FROM idem_set_policy('AUDITED', audit_ttl => '30 days')});
my $t0 = time;
$node->safe_psql('postgres', qq{
	INSERT INTO idem_internal.idempotency_record (owner_id, operation, idempotency_key, request_hash, status,
	                                http_status, response_body, response_headers, task_request, resource_id,
	                                expires_at)
	SELECT g % 1000, 'AUDITED', 'audit-' || lpad(g::text, 12, '0'), repeat('a', 64), 'SUCCEEDED', 201,
	       json_build_object('order', g, 'note', repeat('x', 100)), '{"Location": "/o"}',
	       jsonb_build_object('card', repeat('4', 16)), g, now() - interval '1 minute'
	FROM generate_series(1, $n) g});
$node->safe_psql('postgres', 'VACUUM ANALYZE idem_internal.idempotency_record');
# each table's size: its data (heap and TOAST), its indexes
my $sizes = q{SELECT string_agg((pg_table_size(t) || ' ' || pg_indexes_size(t)), ' ' ORDER BY t::text)
	FROM unnest(ARRAY['idem_internal.idem_history', 'idem_internal.idempotency_record']::regclass[]) t};
sub mb { return sprintf('%.1f MB', $_[0] / 1048576) }
my ($hist_before, $hist_index_before, $rec_before, $rec_index_before) = split / /, $node->safe_psql('postgres', $sizes);
note(sprintf('inserted %d expired records in %.1f s: idem_internal.idempotency_record %s of data, %s of indexes',
	$n, time - $t0, mb($rec_before), mb($rec_index_before)));

$t0 = time;
$node->safe_psql('postgres', 'ALTER SYSTEM SET idem.cleanup_interval = 1');
$node->reload;
ok(defined wait_until($node, 'postgres', 'SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = \'AUDITED\'', '0', 600),
	'the worker deleted every expired record');
my $took = time - $t0;
is($node->safe_psql('postgres', q{
	SELECT count(*) || ' ' || count(DISTINCT record_id) || ' ' || bool_and(audit_until = expires_at + interval '30 days')
	       || ' ' || bool_and(http_status = 201 AND resource_id IS NOT NULL AND status = 'SUCCEEDED')
	  FROM idem_internal.idem_history WHERE operation = 'AUDITED'}), "$n $n true true",
	'every execution\'s audit fields are in idem_internal.idem_history, once, until 30 days past its expiry');
# in batches: each commits on its own, its rows archived at its own start
is($node->safe_psql('postgres', q{
	SELECT (count(*) >= 100)::text || ' ' || (max(n) <= 10000)::text
	  FROM (SELECT archived_at, count(*) AS n FROM idem_internal.idem_history WHERE operation = 'AUDITED' GROUP BY 1) b}),
	'true true', 'the worker archived in batches of at most 10000 rows, each its own transaction');
my ($hist_after, $hist_index_after, $rec_after, $rec_index_after) = split / /, $node->safe_psql('postgres', $sizes);
$node->safe_psql('postgres', 'VACUUM idem_internal.idempotency_record');
$node->safe_psql('postgres', 'VACUUM idem_internal.idem_history');
my ($hist_vacuumed, $hist_index_vacuumed, $rec_vacuumed, $rec_index_vacuumed) = split / /, $node->safe_psql('postgres', $sizes);
note(sprintf('the worker archived and deleted %d records in %.1f s (%.0f records/s)', $n, $took, $n / $took));
note(sprintf('idempotency_record data: %s before, %s after the cleanup, %s after VACUUM (indexes %s, %s, %s)',
	mb($rec_before), mb($rec_after), mb($rec_vacuumed), mb($rec_index_before), mb($rec_index_after), mb($rec_index_vacuumed)));
note(sprintf('idem_history data: %s before, %s after the cleanup, %s after VACUUM (indexes %s, %s, %s)',
	mb($hist_before), mb($hist_after), mb($hist_vacuumed), mb($hist_index_before), mb($hist_index_after), mb($hist_index_vacuumed)));
ok($rec_vacuumed < $rec_before / 100, 'VACUUM gives the records\' data back (the table is truncated)');
ok($hist_vacuumed < $rec_before / 2, 'the audit fields take less than half the data the records did');

$node->stop;
done_testing();
