# idem_stats and prepared transactions: what a prepared transaction wrote
# counts at COMMIT PREPARED, in whichever session runs it, and never after
# ROLLBACK PREPARED; a restart in between drops the pending counts (they
# are kept in shared memory only).
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('prepared', conf => ['max_prepared_transactions = 5', 'idem.cleanup_interval = 0']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# the executed calls, and the failed_final ones (a 4xx)
my $executed = q{SELECT coalesce(sum(executed), 0) || ' ' || coalesce(sum(failed_final), 0)
	FROM idem_stats WHERE datname = 'postgres' AND operation = 'PREP'};
sub prepare
{
	my ($gid, $key) = @_;
	$node->safe_psql('postgres', qq{
		BEGIN;
		SELECT replayed FROM idem_begin(1, 'PREP', '$key', '{}');
		SELECT idem_finish(1, 'PREP', '$key', 200, '{}');
		SELECT replayed FROM idem_begin(1, 'PREP', '$key-4xx', '{}');
		SELECT idem_finish(1, 'PREP', '$key-4xx', 422, '{}');
		PREPARE TRANSACTION '$gid';});
}

prepare('p-rollback', 'prepared-key-000001');
is($node->safe_psql('postgres', $executed), '0 0', 'PREPARE TRANSACTION counts nothing yet');
$node->safe_psql('postgres', q{ROLLBACK PREPARED 'p-rollback'});
is($node->safe_psql('postgres', $executed), '0 0', 'ROLLBACK PREPARED: nothing counted, and no record');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'PREP'}),
	'0', 'the rolled back records are gone');

prepare('p-commit', 'prepared-key-000002');
is($node->safe_psql('postgres', $executed), '0 0', 'a second prepared transaction counts nothing yet');
# another session commits it
$node->safe_psql('postgres', q{COMMIT PREPARED 'p-commit'});
is($node->safe_psql('postgres', $executed), '2 1', 'COMMIT PREPARED in another session counts its calls: two executed, one of them a 4xx');

prepare('p-restart', 'prepared-key-000003');
$node->restart;
$node->safe_psql('postgres', q{COMMIT PREPARED 'p-restart'});
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'PREP'}),
	'4', 'the transaction prepared before the restart commits its records');
is($node->safe_psql('postgres', $executed), '0 0',
	'its counts were in shared memory: the restart dropped them (and the earlier ones)');

$node->stop;
done_testing();
