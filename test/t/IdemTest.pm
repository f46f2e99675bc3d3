# t/IdemTest.pm: helpers shared by idem's TAP tests.
package IdemTest;

use strict;
use warnings;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);

use Exporter 'import';
our @EXPORT = qw(idem_node add_records count_records wait_until worker_pids
  launcher_pid elapsed_since);

# A new cluster with idem preloaded and a cleanup round every second; not
# started.  Options: init => { options of init() }, conf => [ more lines ].
sub idem_node
{
	my ($name, %opt) = @_;
	my $node = PostgreSQL::Test::Cluster->new($name);
	$node->init(%{ $opt{init} // {} });
	$node->append_conf('postgresql.conf', join("\n",
		"shared_preload_libraries = 'idem'",
		"idem.cleanup_interval = 1",
		@{ $opt{conf} // [] }) . "\n");
	return $node;
}

# Insert n records into database db, expiring at now() + the given interval
# (negative: already expired).  Keys start with the tag.
sub add_records
{
	my ($node, $db, $tag, $n, $expires_in) = @_;
	$node->safe_psql($db, qq{
		INSERT INTO idem_internal.idempotency_record
			(owner_id, operation, idempotency_key, request_hash, status, expires_at)
		SELECT 1, 'test', '$tag-' || g, repeat('0', 64), 'SUCCEEDED',
		       now() + interval '$expires_in'
		FROM generate_series(1, $n) g});
}

# How many records of database db have expired (or, with 'live', have not).
sub count_records
{
	my ($node, $db, $which) = @_;
	my $op = ($which // 'expired') eq 'live' ? '>=' : '<';
	return $node->safe_psql($db,
		"SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at $op now()");
}

# Poll a query until it returns the expected value or the timeout (seconds)
# passes; returns the seconds waited, or undef on timeout.  A failing query
# (the server restarting, say) counts as not yet.
sub wait_until
{
	my ($node, $db, $query, $expected, $timeout) = @_;
	my $start = time;

	# a wait for progress, never a bound on speed: the cap is at least
	# PostgreSQL's test timeout (PG_TEST_TIMEOUT_DEFAULT, 180 s unless set),
	# so a busy machine only makes the wait longer
	$timeout = $PostgreSQL::Test::Utils::timeout_default
	  if !defined $timeout || $timeout < $PostgreSQL::Test::Utils::timeout_default;
	while (time - $start < $timeout)
	{
		my ($rc, $got) = $node->psql($db, $query);
		return time - $start if $rc == 0 && $got eq $expected;
		usleep(50_000);
	}
	return undef;
}

# PIDs of the per-database workers connected to database db.
sub worker_pids
{
	my ($node, $db) = @_;
	return $node->safe_psql('postgres', qq{
		SELECT string_agg(pid::text, ',') FROM pg_stat_activity
		WHERE backend_type = 'idem cleanup worker' AND datname = '$db'});
}

# PID of the launcher, or '' when it is not running.
sub launcher_pid
{
	my ($node) = @_;
	return $node->safe_psql('postgres', q{
		SELECT coalesce(string_agg(pid::text, ','), '') FROM pg_stat_activity
		WHERE backend_type = 'idem cleanup launcher'});
}

sub elapsed_since { return time - $_[0]; }

1;
