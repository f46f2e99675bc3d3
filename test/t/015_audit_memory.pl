# idem_audit within work_mem (1.13): the view's function reads the trail
# through a cursor, a batch at a time, into a tuplestore that spills to
# disk past work_mem, and a role bound by idem.allowed_owners reads only its
# owners' rows.  The backend's peak RssAnon while it reads 30,000 and then
# 300,000 records must not grow with the count (1.12 read the whole trail
# into memory: about 1 GB for 3 million records).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(usleep);
use IdemTest;

my $node = idem_node('audit', conf => ['idem.cleanup_interval = 0', 'work_mem = 4MB']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');
$node->safe_psql('postgres', 'CREATE ROLE bound_reader LOGIN; GRANT USAGE ON SCHEMA public TO bound_reader');
$node->safe_psql('postgres', q{SELECT count(*) FROM idem_grant('bound_reader', 'monitor')});
$node->safe_psql('postgres', q{ALTER ROLE bound_reader SET idem.allowed_owners = '7'});

# records of 100 owners, up to n in all (as the executions would leave them)
sub fill_to
{
	my ($n) = @_;
	$node->safe_psql('postgres', qq{
		INSERT INTO idem_internal.idempotency_record
		       (owner_id, operation, idempotency_key, request_hash, status, http_status, created_at, updated_at, expires_at)
		SELECT i % 100, 'AUDIT', 'audit-key-' || lpad(i::text, 12, '0'), repeat('a', 64), 'SUCCEEDED', 200,
		       now(), now(), now() + interval '1 day'
		  FROM generate_series((SELECT count(*) FROM idem_internal.idempotency_record) + 1, $n) i});
}

# the highest RssAnon (kB) of the backend while it answers query, and the answer
sub peak_rss_anon
{
	my ($query, @connect) = @_;
	my $session = $node->background_psql('postgres', @connect ? (extra_params => \@connect) : ());
	my $pid = $session->query_safe('SELECT pg_backend_pid()');
	my $peak = 0;
	$session->{stdin} .= "$query;\n\\echo AUDIT-DONE\n";
	my $cap = time + $PostgreSQL::Test::Utils::timeout_default;
	while ($session->{stdout} !~ /AUDIT-DONE/ && time < $cap)
	{
		$session->{run}->pump_nb;
		if (open(my $f, '<', "/proc/$pid/status"))
		{
			while (<$f>) { $peak = $1 if /^RssAnon:\s+(\d+) kB/ && $1 > $peak; }
			close($f);
		}
		usleep(2000);
	}
	my ($answer) = $session->{stdout} =~ /(\d+)\s*\n?AUDIT-DONE/;
	$session->quit;
	return ($peak, $answer);
}

my $all = 'SELECT count(*) FROM idem_audit';
fill_to(30000);
my ($small, $n_small) = peak_rss_anon($all);
is($n_small, '30000', 'idem_audit returns the 30,000 records');
my ($small_bound, $n_small_bound) = peak_rss_anon($all, '-U', 'bound_reader');
is($n_small_bound, '300', 'a role bound to owner 7 sees its 300');
fill_to(300000);
my ($large, $n_large) = peak_rss_anon($all);
is($n_large, '300000', 'idem_audit returns the 300,000 records');
my ($large_bound, $n_large_bound) = peak_rss_anon($all, '-U', 'bound_reader');
is($n_large_bound, '3000', 'the bound role sees its 3,000');
note("peak RssAnon: 30,000 records $small kB, 300,000 records $large kB; bound role: $small_bound kB, $large_bound kB");
# ten times the records: the same memory, give or take what the backend's
# caches grow by (8 MB); 1.12 took 74 MB more here (15.9 MB, then 89.7 MB)
ok($large < $small + 8192, "the peak RssAnon does not grow with the trail ($small kB at 30,000, $large kB at 300,000)");
ok($large_bound < $small_bound + 8192,
	"nor for a role bound by idem.allowed_owners ($small_bound kB, $large_bound kB)");

done_testing();
