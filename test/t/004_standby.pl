# On a hot standby the cleanup writes nothing and logs no error; once the
# standby is promoted it cleans by itself.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use Time::HiRes qw(time usleep);
use IdemTest;

my $interval = 3;

# the primary keeps its expired rows (worker off) so the standby has some
my $primary = idem_node('primary', init => { allows_streaming => 1 },
	conf => ['idem.cleanup_interval = 0']);
$primary->start;
$primary->safe_psql('postgres', 'CREATE EXTENSION idem');
add_records($primary, 'postgres', 'old', 5000, '-1 second');
add_records($primary, 'postgres', 'new', 10, '1 hour');

$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->append_conf('postgresql.conf', "idem.cleanup_interval = $interval\n");
$standby->start;
$primary->wait_for_catchup($standby);

is($standby->safe_psql('postgres', 'SELECT pg_is_in_recovery()'), 't', 'the standby is in recovery');
sleep(2 * $interval);
is(count_records($standby, 'postgres'), '5000', 'after 2 intervals the standby still has every expired row');
is(launcher_pid($standby), '', 'no cleanup process runs on the standby');
is($standby->safe_psql('postgres', 'SELECT count(*) FROM idem_cleanup_status()'), '0',
	'idem_cleanup_status() is empty: no run was attempted');
my $log = slurp_file($standby->logfile);
unlike($log, qr/ERROR|FATAL/, 'the standby logged no error');

my $start = time;
$standby->promote;
my $waited = wait_until($standby, 'postgres',
	'SELECT count(*) FROM idem_internal.idempotency_record WHERE expires_at < now()', '0', 4 * $interval);
ok(defined $waited,
	sprintf('promoted, it cleans (%.2f s after promotion began)', time - $start));
is(count_records($standby, 'postgres', 'live'), '10', 'live records stay');

$standby->stop;
$primary->stop;
done_testing();
