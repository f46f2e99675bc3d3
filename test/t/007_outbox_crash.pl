# The outbox and the inbox across PREPARE TRANSACTION and a server crash:
# a message exists if and only if its transaction commits, also when that
# commit happens just before an immediate stop; a
# lease held at the crash lapses and the message is fetched again; an inbox
# entry committed before the crash still makes the redelivery false.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;
use Time::HiRes qw(usleep);

my $node = idem_node('outbox', conf => ['idem.cleanup_interval = 0', 'max_prepared_transactions = 4']);
$node->start;
$node->safe_psql('postgres', 'CREATE EXTENSION idem');

# --- notifications: after the commit, one per topic, from the notifier ---
my $listener = $node->background_psql('postgres');
$listener->query_safe('LISTEN idem_outbox');
$node->safe_psql('postgres', q{
	SELECT idem_outbox_emit('orders', '{}', 'k1'), idem_outbox_emit('orders', '{}', 'k2'),
	       idem_outbox_emit('payments', '{}');
	BEGIN;
	SELECT idem_outbox_emit('rolled-back', '{}');
	ROLLBACK;
});
my $heard = '';
for (my $i = 0; $i < 50 && ($heard =~ tr/\n//) < 2; $i++)
{
	usleep(100_000);
	$heard .= $listener->query_safe('SELECT 1');
}
my @payloads = sort($heard =~ /Asynchronous notification "idem_outbox" with payload "([^"]*)"/g);
is(join(',', @payloads), 'orders,payments',
	'a listener hears one notification per topic of the committed transaction, none for the rolled-back one');
# a burst of emitting transactions: the notifier sends on their behalf
$node->pgbench('-n -c 4 -j 2 -t 200', 0, [qr/processed: 800\/800/], [qr/^$/],
	'800 emitting transactions', { 'emit' => q{SELECT idem_outbox_emit('burst', '{}');} });
$heard = '';
for (my $i = 0; $i < 50 && $heard !~ /payload "burst"/; $i++)
{
	usleep(100_000);
	$heard .= $listener->query_safe('SELECT 1');
}
like($heard, qr/payload "burst"/, 'the burst is announced');
my $notifications = () = $heard =~ /payload "burst"/g;
ok($notifications >= 1 && $notifications < 800,
	"commits in a burst share notifications ($notifications for 800 transactions)");
$listener->quit;
$node->safe_psql('postgres', 'TRUNCATE idem_internal.idem_outbox');

# --- two-phase commit: PostgreSQL refuses to prepare a transaction that
# notified (idem_outbox_emit queues NOTIFY idem_outbox); nothing is written ---
my ($ret, $out, $err) = $node->psql('postgres', q{
	BEGIN;
	SELECT idem_outbox_emit('tpc', '{"n": 1}', 'k');
	PREPARE TRANSACTION 'emit_prepared';
});
like($err, qr/cannot PREPARE a transaction that has executed LISTEN, UNLISTEN, or NOTIFY/,
	'PREPARE TRANSACTION after an emit fails with PostgreSQL\'s own error');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idem_outbox}) . '/' .
   $node->safe_psql('postgres', q{SELECT count(*) FROM pg_prepared_xacts}),
	'0/0', 'and neither a message nor a prepared transaction is left');

# --- a crash: committed messages and inbox entries survive, an open transaction's do not ---
$node->safe_psql('postgres', q{
	TRUNCATE idem_internal.idem_outbox;
	SELECT idem_outbox_emit('crash', jsonb_build_object('n', n), 'k' || n % 5) FROM generate_series(1, 100) n;
	SELECT idem_consume('billing', 'before-crash');
});
my $leased = $node->safe_psql('postgres',
	q{SELECT count(*) FROM idem_outbox_fetch('crash', 100, '2 seconds')});
is($leased, '5', 'a fetch leases the head of each of the 5 keys');

my $open = $node->background_psql('postgres');
$open->query_safe(q{BEGIN});
$open->query_safe(q{SELECT idem_outbox_emit('crash', '{"uncommitted": true}', 'k0')});
$open->query_safe(q{SELECT idem_consume('billing', 'in-flight-at-crash')});

$node->stop('immediate');
$node->start;
$open->quit;

is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'crash'}),
	'100', 'after the crash: the 100 committed messages, not the open transaction\'s');
is($node->safe_psql('postgres',
	q{SELECT idem_consume('billing', 'before-crash') || ',' || idem_consume('billing', 'in-flight-at-crash')}),
	'false,true', 'an entry committed before the crash stays; the open one is gone');
is($node->safe_psql('postgres', q{SELECT count(*) FROM idem_outbox_fetch('crash', 100)}),
	'0', 'the leases taken before the crash still hold');
ok(defined wait_until($node, 'postgres',
	q{SELECT count(*) FROM idem_internal.idem_outbox WHERE topic = 'crash' AND leased_until > now()}, '0'),
	'then they lapse');

# drain: every message once, per key in commit order
my $order = $node->safe_psql('postgres', q{
	CREATE TABLE drained (k text, n int, attempt int, pos serial);
	DO $$
	DECLARE ids bigint[];
	BEGIN
	    LOOP
	        WITH f AS (SELECT * FROM idem_outbox_fetch('crash', 100)),
	             d AS (INSERT INTO drained (k, n, attempt)
	                   SELECT f.msg_key, (f.payload->>'n')::int, f.attempt FROM f)
	        SELECT array_agg(message_id) INTO ids FROM f;
	        EXIT WHEN ids IS NULL;
	        PERFORM idem_outbox_ack(ids);
	    END LOOP;
	END $$;
	SELECT count(*) || '/' || count(DISTINCT n) || '/' ||
	       (SELECT count(*) FROM drained WHERE attempt = 2) || '/' ||
	       (SELECT count(*) FROM (SELECT k, n, lag(n) OVER (PARTITION BY k ORDER BY pos) AS prev
	                              FROM drained) s WHERE prev > n)
	FROM drained});
is($order, '100/100/5/0',
	'after the leases lapse every message is fetched once more (the 5 leased at the crash: attempt 2), in key order');

done_testing();
