# Long flows across sessions and a server crash: a submit's commit wakes
# the workers that LISTEN idem_tasks; a bind_session lease lapses the moment
# its session ends (a disconnect, a server crash) while a plain lease holds
# until it expires; after an immediate stop with leased tasks every task is
# leased again and completes once.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use Time::HiRes qw(usleep);

my $node = idem_node('tasks', conf => ['idem.cleanup_interval = 0']);
$node->start;
$node->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	CREATE TABLE shipped (task_id bigint NOT NULL, attempt int NOT NULL);
});

# --- a submit's commit wakes the listening workers, a rollback does not ---
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN idem_tasks');
$node->safe_psql('postgres', q{
	SELECT idem_submit(1, 'SHIP', 'notify-key-000000001', '{}');
	SELECT idem_submit(1, 'SHIP', 'notify-key-000000001', '{}');
	BEGIN;
	SELECT idem_submit(1, 'REFUND', 'notify-key-000000002', '{}');
	ROLLBACK;
});
my $heard = '';
for (my $i = 0; $i < 50 && $heard !~ /payload "SHIP"/; $i++)
{
	usleep(100_000);
	$heard .= $listener->query_safe('SELECT 1');
}
my @payloads = sort($heard =~ /Asynchronous notification "idem_tasks" with payload "([^"]*)"/g);
is(join(',', @payloads), 'SHIP',
	'one notification for the committed submit (its repeat writes nothing), none for the rolled-back one');
$listener->quit;
$node->safe_psql('postgres', q{DELETE FROM idem_internal.idempotency_record});

# --- a bound lease lapses when its session ends; a plain one holds ---
$node->safe_psql('postgres', q{
	SELECT count(idem_submit(g, 'SHIP', 'bound-key-' || lpad(g::text, 10, '0'), jsonb_build_object('n', g)))
	FROM generate_series(1, 4) g});
my $worker = $node->background_psql('postgres');
is($worker->query_safe(q{SELECT count(*) FROM idem_lease('SHIP', 'bound', '1 hour', 2, bind_session => true)}),
	'2', 'a worker leases two tasks bound to its session');
is($worker->query_safe(q{SELECT count(*) FROM idem_lease('SHIP', 'plain', '1 hour', 2)}),
	'2', 'and two more without');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lease('SHIP', 'other', '1 hour', 10)}),
	'0', 'while it lives nobody else gets them');
$worker->quit;
my $taken = '';
for (my $i = 0; $i < 50 && $taken ne '2'; $i++)
{
	usleep(50_000);
	$taken = $node->safe_psql('postgres',
		q{SELECT count(*) FROM idem_lease('SHIP', 'other', '1 hour', 10) WHERE attempt = 2});
}
is($taken, '2', 'once its session ended, its two bound tasks are taken over (attempt 2); the plain leases hold');
is($node->safe_psql('postgres', q{
	SELECT string_agg(task_worker || ':' || task_attempts, ',' ORDER BY task_worker)
	FROM idem_internal.idempotency_record WHERE operation = 'SHIP'}),
	'other:2,other:2,plain:1,plain:1', 'the plain leases are still the first worker\'s');
$node->safe_psql('postgres', q{DELETE FROM idem_internal.idempotency_record});

# --- a crash with leased tasks ---
$node->safe_psql('postgres', q{
	SELECT count(idem_submit(g % 7, 'CRASH', 'crash-key-' || lpad(g::text, 10, '0'), jsonb_build_object('n', g)))
	FROM generate_series(1, 60) g});
my $holder = $node->background_psql('postgres');
$holder->query_safe(q{SELECT count(*) FROM idem_lease('CRASH', 'bound', '1 hour', 20, bind_session => true)});
$holder->query_safe(q{SELECT count(*) FROM idem_lease('CRASH', 'short', '3 seconds', 20)});
# one holder is in the middle of its business write when the server stops
$holder->query_safe(q{BEGIN});
$holder->query_safe(q{INSERT INTO shipped SELECT id, task_attempts FROM idem_internal.idempotency_record
                      WHERE task_worker = 'bound' LIMIT 5});
$holder->query_safe(q{SELECT idem_complete(id, task_token, 200, '{}') FROM idem_internal.idempotency_record
                      WHERE task_worker = 'bound' LIMIT 5});

$node->stop('immediate');
$node->start;
$holder->quit;

is($node->safe_psql('postgres', q{
	SELECT count(*) FILTER (WHERE status = 'PROCESSING') || '/' || count(*) FILTER (WHERE task_attempts = 1)
	FROM idem_internal.idempotency_record WHERE operation = 'CRASH'} ) . '/' .
   $node->safe_psql('postgres', q{SELECT count(*) FROM shipped}),
	'60/40/0', 'after the crash: 60 tasks PROCESSING, 40 of them leased before it, the open transaction gone');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_lease('CRASH', 'after', '1 hour', 100)}),
	'40', 'the 20 bound leases lapsed with the crash and are handed out at once with the 20 never leased');
ok(defined wait_until($node, 'postgres', q{SELECT count(*) FROM idem_internal.idempotency_record
	WHERE operation = 'CRASH' AND task_worker = 'short' AND task_lease_expires_at > now()}, '0'),
	'the short leases lapse');
# a worker drains the rest: the short leases lapse, then everything completes once
my $drained = $node->safe_psql('postgres', q{
	DO $$
	DECLARE t record;
	BEGIN
	    FOR t IN SELECT id, task_token, task_attempts FROM idem_internal.idempotency_record
	             WHERE operation = 'CRASH' AND task_worker = 'after' LOOP
	        INSERT INTO shipped VALUES (t.id, t.task_attempts);
	        PERFORM idem_complete(t.id, t.task_token, 201, '{}');
	    END LOOP;
	    FOR t IN SELECT * FROM idem_lease('CRASH', 'late', '1 hour', 100) LOOP
	        INSERT INTO shipped VALUES (t.task_id, t.attempt);
	        PERFORM idem_complete(t.task_id, t.token, 201, '{}');
	    END LOOP;
	END $$;
	SELECT count(*) || '/' || count(DISTINCT task_id) || '/' || count(*) FILTER (WHERE attempt = 2)
	FROM shipped});
is($drained, '60/60/40', 'every task completed once: the 40 leased at the crash on their second attempt');
is($node->safe_psql('postgres', q{
	SELECT count(*) FROM idem_internal.idempotency_record WHERE operation = 'CRASH' AND status = 'SUCCEEDED'
	   AND task_due_at IS NULL AND task_lease_expires_at IS NULL AND task_session IS NULL}),
	'60', 'all 60 SUCCEEDED, nothing left leased');

done_testing();
