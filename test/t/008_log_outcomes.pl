# idem.log_outcomes: one LOG line per call with owner, operation, key,
# resource id and outcome (executed, replayed, conflict, in_flight);
# "conflicts" logs only the refused ones, "off" nothing; an invalid key is
# never printed; only a superuser may change it.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('logs', conf => ['idem.cleanup_interval = 0', 'idem.log_outcomes = all']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# the lines idem logged since offset, as "owner operation key resource outcome"
sub outcome_lines
{
	my ($offset) = @_;
	my $log = slurp_file($node->logfile, $offset);
	return join("\n", map { /LOG:  idem: owner (\S+) operation (\S+) key (\S+) resource (\S+) outcome (\S+)/ ? "$1 $2 $3 $4 $5" : () }
		split /\n/, $log);
}

# --- all: executed, replayed, conflict, in_flight; orders and the generic API ---
my $offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	SELECT order_id FROM idem_create_order(7, 'log-key-000000000001', 1, 1);
	SELECT order_id FROM idem_create_order(7, 'log-key-000000000001', 1, 1);
	BEGIN;
	SELECT replayed FROM idem_begin(7, 'DEBIT', 'log-key-000000000002', '{"amount": 5}');
	SELECT idem_finish(7, 'DEBIT', 'log-key-000000000002', 201, '{}', 99);
	COMMIT;
	SELECT replayed FROM idem_begin(7, 'DEBIT', 'log-key-000000000002', '{"amount": 5}');
});
$node->psql('postgres', q{SELECT idem_create_order(7, 'log-key-000000000001', 1, 2)});
$node->psql('postgres', q{SELECT idem_create_order(7, 'bad key with spaces and a secret', 1, 1)});
$node->psql('postgres', q{SELECT idem_begin(7, 'DEBIT', E'log-key-\n000000003', '{}')});

# an in-flight original: a second session with wait_timeout = 0 gets IK002
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{SELECT replayed FROM idem_begin(8, 'PAY', 'log-key-000000000004', '{}')});
$node->psql('postgres', q{SET idem.wait_timeout = 0; SELECT idem_begin(8, 'PAY', 'log-key-000000000004', '{}')});
$holder->query_safe(q{ROLLBACK});
$holder->quit;

my $lines = outcome_lines($offset);
is($lines, join("\n",
	'7 CREATE_ORDER log-key-000000000001 1 executed',
	'7 CREATE_ORDER log-key-000000000001 1 replayed',
	'7 DEBIT log-key-000000000002 99 executed',
	'7 DEBIT log-key-000000000002 99 replayed',
	'7 CREATE_ORDER log-key-000000000001 - conflict',
	'8 PAY log-key-000000000004 - in_flight'),
	'idem.log_outcomes = all: one line per call, with owner, operation, key, resource and outcome');
# (the test cluster logs every statement; idem's own lines and the errors' must not hold it)
my $own = join("\n", grep { /LOG:  idem:|ERROR:|DETAIL:/ } split /\n/, slurp_file($node->logfile, $offset));
like($own, qr/idempotency key may contain only letters/, 'the invalid keys were refused');
unlike($own, qr/secret|000000003/, 'an invalid key is never printed');

# --- an execution is logged at its commit: one that rolls back never was (1.13) ---
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{
	BEGIN;
	SELECT order_id FROM idem_create_order(9, 'log-key-rolled-back1', 1, 1);
	ROLLBACK;
	BEGIN;
	SAVEPOINT s;
	SELECT order_id FROM idem_create_order(9, 'log-key-rolled-back2', 1, 1);
	ROLLBACK TO SAVEPOINT s;
	SAVEPOINT t;
	SELECT replayed FROM idem_begin(9, 'DEBIT', 'log-key-released-0001', '{}');
	SELECT idem_finish(9, 'DEBIT', 'log-key-released-0001', 201, '{}');
	RELEASE SAVEPOINT t;
	COMMIT;
});
is(outcome_lines($offset), '9 DEBIT log-key-released-0001 - executed',
	'an execution rolled back (by ROLLBACK or a savepoint) is not logged; one released and committed is, once');

# --- conflicts: only the refused keys ---
$node->append_conf('postgresql.conf', 'idem.log_outcomes = conflicts');
$node->reload;
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT order_id FROM idem_create_order(9, 'log-key-000000000005', 1, 1)});
$node->psql('postgres', q{SELECT idem_create_order(9, 'log-key-000000000005', 1, 3)});
is(outcome_lines($offset), '9 CREATE_ORDER log-key-000000000005 - conflict',
	'idem.log_outcomes = conflicts: only the conflict, not the execution');

# --- off: nothing ---
$node->append_conf('postgresql.conf', 'idem.log_outcomes = off');
$node->reload;
$offset = -s $node->logfile;
$node->safe_psql('postgres', q{SELECT order_id FROM idem_create_order(9, 'log-key-000000000006', 1, 1)});
$node->psql('postgres', q{SELECT idem_create_order(9, 'log-key-000000000006', 1, 3)});
is(outcome_lines($offset), '', 'idem.log_outcomes = off: no line');

# --- superuser only ---
$node->safe_psql('postgres', 'CREATE ROLE app LOGIN');
my ($ret, $out, $err) = $node->psql('postgres', q{SET idem.log_outcomes = 'all'}, extra_params => ['-U', 'app']);
like($err, qr/permission denied to set parameter "idem.log_outcomes"/, 'a non-superuser cannot turn it on');

done_testing();
