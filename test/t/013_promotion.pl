# A standby promoted after it stopped replaying (asynchronous replication's
# loss) never hands out again a value the old primary drew: outbox message
# ids, fencing tokens, order ids and numbers, record ids.  The first draw
# on the new timeline moves every idem sequence 2^36 ahead (sequence.c);
# a restart on the same timeline moves nothing.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $reserve = 68719476736;	# 2^36

my $primary = idem_node('primary', init => { allows_streaming => 1 },
	conf => ['idem.cleanup_interval = 0']);
$primary->start;
$primary->safe_psql('postgres', q{
	CREATE EXTENSION idem;
	SELECT count(idem_outbox_emit('t', jsonb_build_object('n', n), 'k')) FROM generate_series(1, 10) n;
	SELECT count(*) FROM (SELECT idem_submit(1, 'JOB', 'promotion-job-' || lpad(g::text, 4, '0'), '{}') FROM generate_series(1, 300) g) s;
	SELECT count(*) FROM (SELECT idem_create_order(1, 'promotion-ord-' || lpad(g::text, 4, '0'), 1, 1) FROM generate_series(1, 10) g) s;
});
$primary->backup('base');
my $standby = PostgreSQL::Test::Cluster->new('standby');
$standby->init_from_backup($primary, 'base', has_streaming => 1);
$standby->start;
$primary->wait_for_catchup($standby);
$standby->stop;

# what only the old primary has: more than the 32 values a sequence logs ahead
$primary->safe_psql('postgres', q{
	SELECT count(idem_outbox_emit('t', jsonb_build_object('n', n), 'k')) FROM generate_series(11, 210) n;
	SELECT count(*) FROM idem_lease('JOB', 'old-primary-worker', '1 hour', 200);
	SELECT count(*) FROM (SELECT idem_create_order(1, 'promotion-ord-' || lpad(g::text, 4, '0'), 1, 1) FROM generate_series(11, 210) g) s;
});
my ($msg_max, $token_max, $order_max) = split /\|/, $primary->safe_psql('postgres', q{
	SELECT (SELECT max(message_id) FROM idem_internal.idem_outbox), (SELECT max(task_token) FROM idem_internal.idempotency_record),
	       (SELECT max(id) FROM idem_internal.purchase_order)});
my $timeline = $primary->safe_psql('postgres', 'SELECT timeline_id FROM pg_control_checkpoint()');
$primary->stop('immediate');

$standby->start;
$standby->promote;
$standby->poll_query_until('postgres', 'SELECT NOT pg_is_in_recovery()');
my ($replayed_msg) = $standby->safe_psql('postgres', 'SELECT last_value FROM idem_internal.idem_outbox_message_id_seq');
cmp_ok($replayed_msg, '<', $msg_max,
	'the promoted standby replayed less of the message id sequence than the old primary drew (the loss this guards against)');

my $msg = $standby->safe_psql('postgres', q{SELECT idem_outbox_emit('t', '{"after": true}', 'k')});
my $token = $standby->safe_psql('postgres', q{SELECT token FROM idem_lease('JOB', 'new-primary-worker', '1 hour', 1)});
my $order = $standby->safe_psql('postgres', q{SELECT order_id FROM idem_create_order(1, 'promotion-ord-after-01', 1, 1)});
cmp_ok($msg, '>', $msg_max, "a message id drawn after the promotion ($msg) is past every one the old primary drew ($msg_max)");
cmp_ok($token, '>', $token_max, "a fencing token after the promotion ($token) is past the old primary's ($token_max)");
cmp_ok($order, '>', $order_max, "an order id after the promotion ($order) is past the old primary's ($order_max)");
cmp_ok($msg - $replayed_msg, '>=', $reserve, 'the sequences moved 2^36 ahead');
is($standby->safe_psql('postgres', 'SELECT last_value FROM idem_internal.idem_timeline_seq'), $timeline + 1,
	'idem_timeline_seq records the new timeline');
like(slurp_file($standby->logfile), qr/idem: sequences moved 68719476736 ahead for timeline @{[$timeline + 1]}/,
	'the move is logged');

# a restart on the same timeline moves nothing (a crash never reissues)
$standby->restart;
my $again = $standby->safe_psql('postgres', q{SELECT idem_outbox_emit('t', '{"after": 2}', 'k')});
cmp_ok($again - $msg, '<', 100, 'after a restart on the same timeline the ids go on (no second move)');

done_testing();
