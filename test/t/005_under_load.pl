# A 1M-row cleanup while pgbench runs idem_create_order with 8 clients: how
# much the foreground throughput drops, and how fast the worker deletes.
# Windows with the worker off and on alternate over one backlog, off-on-off-
# on-off-on-off (idem.cleanup_interval = 0 stops a round between two
# batches); each on window is compared with the mean of the off windows on
# either side, which cancels the drift of a table that grows as it runs.
# The figures are printed and quoted in the README; the assertions are about
# correctness only, since these machines are noisy.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IPC::Run;
use IdemTest;

my $rows = 1_000_000;
my $seconds = 6;

my $node = idem_node('main', conf => [
	'idem.cleanup_interval = 0',
	'shared_buffers = 1GB',
	'synchronous_commit = off',
	'max_wal_size = 8GB',
	'checkpoint_timeout = 30min',
	# vacuuming the deleted rows is autovacuum's cost, not the worker's;
	# left on it would land in some windows and not others
	'autovacuum = off',
	'log_statement = none']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

my $script = $node->basedir . '/fresh.sql';
open(my $fh, '>', $script) or die;
print $fh q{\set k random(1, 9000000000000000)
SELECT order_id FROM idem_create_order(:client_id + 1, 'load-' || lpad(:k::text, 16, '0'), 42, 1);
};
close $fh;

# pgbench -M prepared -c 8 -j 2 for $seconds; returns (tps, failed transactions).
sub pgbench
{
	my ($out, $err) = ('', '');
	IPC::Run::run([ 'pgbench', '-n', '-M', 'prepared', '-c', '8', '-j', '2',
		'-T', $seconds, '-f', $script, '-h', $node->host, '-p', $node->port, 'postgres' ],
		'>', \$out, '2>', \$err);
	my ($tps) = $out =~ /tps = ([\d.]+) \(without initial connection time\)/;
	my ($failed) = $out =~ /number of failed transactions: (\d+)/;
	diag("pgbench: $err") unless defined $tps;
	return ($tps // 0, $failed // 0);
}

sub set_interval
{
	$node->safe_psql('postgres', "ALTER SYSTEM SET idem.cleanup_interval = $_[0]");
	$node->safe_psql('postgres', 'SELECT pg_reload_conf()');
}

sub deleted_so_far
{
	return $node->safe_psql('postgres', q{
		SELECT coalesce(sum(total_deleted), 0) FROM idem_cleanup_status() WHERE datname = 'postgres'});
}

sub median { my @s = sort { $a <=> $b } @_; return $s[int(@s / 2)]; }

$node->safe_psql('postgres', qq{
	INSERT INTO idem_internal.idempotency_record
		(owner_id, operation, idempotency_key, request_hash, status, http_status,
		 response_json, resource_id, expires_at)
	SELECT g % 1000, 'create_order', 'expired-' || lpad(g::text, 12, '0'), repeat('0', 64),
	       'SUCCEEDED', 201, jsonb_build_object('orderId', g, 'orderNo', 'ORD-' || g, 'status', 'CREATED'),
	       g, now() - interval '1 minute' - g * interval '1 millisecond'
	FROM generate_series(1, $rows) g});
$node->safe_psql('postgres', 'VACUUM ANALYZE idem_internal.idempotency_record');

my (@off, @on, $failed, $on_rows, $on_secs, $worker_seen);
($failed, $on_rows, $on_secs, $worker_seen) = (0, 0, 0, 0);
for my $round (1 .. 3)
{
	my ($tps, $f) = pgbench();
	push @off, $tps;
	$failed += $f;

	set_interval(1);
	$worker_seen++ if defined wait_until($node, 'postgres', q{
		SELECT count(*) > 0 FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker'}, 't', 10);
	my ($d0, $t0) = (deleted_so_far(), time);
	($tps, $f) = pgbench();
	push @on, $tps;
	$failed += $f;
	$on_rows += deleted_so_far() - $d0;
	$on_secs += time - $t0;
	set_interval(0);
	wait_until($node, 'postgres', q{
		SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'idem cleanup worker'}, '0', 10);
}
{
	my ($tps, $f) = pgbench();
	push @off, $tps;
	$failed += $f;
}
is($worker_seen, 3, 'the worker ran in each of the 3 windows');
ok(count_records($node, 'postgres') > 0, 'the backlog outlasted the windows: the worker was busy in each');

set_interval(1);
ok(defined wait_until($node, 'postgres', q{
	SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()}, '0', 600),
	"the worker deletes all $rows expired rows");
is(deleted_so_far(), $rows, 'idem_cleanup_status() counts them');
is($failed, 0, 'pgbench counted no failed transaction');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_internal.idempotency_record r JOIN idem_internal.purchase_order o ON o.id = r.resource_id
	WHERE r.idempotency_key LIKE 'load-%'}),
	$node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.purchase_order}),
	'every order made under load still has its record');

my @ratios = map { $on[$_] / (($off[$_] + $off[$_ + 1]) / 2) } 0 .. $#on;
my $ratio = median(@ratios);
diag(sprintf('idem_create_order, 8 clients, TPS with the worker off: %s; on: %s',
	join(' ', map { sprintf('%.0f', $_) } @off), join(' ', map { sprintf('%.0f', $_) } @on)));
diag(sprintf('TPS during the cleanup / the mean of the windows around it: %s; median %.3f (a drop of %.1f %%)',
	join(' ', map { sprintf('%.3f', $_) } @ratios), $ratio, 100 * (1 - $ratio)));
diag(sprintf('cleanup under that load: %d rows in %.1f s = %.0f rows/s',
	$on_rows, $on_secs, $on_rows / $on_secs));

$node->stop;
done_testing();
