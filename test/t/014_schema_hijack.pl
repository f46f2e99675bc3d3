# No idem code resolves a name in a schema another role can own, rename or
# create in (issue 34).  Up to 1.12 the owner of a database could become
# superuser: rename public (where idem was installed), create a new public,
# plant a look-alike idem_outbox_guard() there, and wait for a publisher's
# idem_outbox_fetch (SECURITY DEFINER) to run it as idem's owner.
#
# Every attacker the issue names plants look-alikes of every idem function
# (same name and arguments), of every table, sequence and view (tables with
# triggers and a rule, views that call a function), operators, and types
# with casts: in every schema on every caller's search_path, under the
# renamed schema's old name, in the callers' own pg_temp, and (overloads)
# in idem's own schema.  Each plant records current_user when it runs.
# Then every entry point of the extension (enumerated from pg_depend: a
# function added later is covered, and one this test calls nowhere fails it)
# is called by the role of its kind, the exporter's queries run, a superuser
# runs idem_grant, idem_revoke, idem_forget_owner and idem_set_policy, the
# cleanup worker does a round, and a database attacked at 1.12 is updated.
# Nothing planted may run, and no role may gain a right.  The same attack
# on a database left at 1.12 runs a plant: the control that shows the test
# can fail.
use strict;
use warnings;

use FindBin;
use lib $FindBin::RealBin;

use PostgreSQL::Test::Cluster;
use PostgreSQL::Test::Utils;
use Test::More;
use IdemTest;

my $node = idem_node('hijack', conf => ['track_functions = all', "log_line_prefix = '[%d] '"]);
$node->start;

my $current = $node->safe_psql('postgres',
	q{SELECT default_version FROM pg_available_extensions WHERE name = 'idem'});

# --- roles -----------------------------------------------------------------
# evil_owner owns the attacked databases; evil_home owns the schema idem is
# installed into in one of them; evil_creator has CREATE on every database
# (it creates schemas named after the callers: their "$user"); evil_public
# has CREATE on idem's own schema, as a public carried over from
# PostgreSQL 14 by pg_upgrade has for everyone.
my @attackers = qw(evil_owner evil_home evil_creator evil_public);
my %kind_role = (app => 'h_app', worker => 'h_worker', publisher => 'h_publisher',
	consumer => 'h_consumer', monitor => 'h_monitor', operator => 'h_operator');
# the kinds each version has (operator: 1.16)
my %kind_since = (operator => '1.16');
$node->safe_psql('postgres', join(";\n",
	(map { "CREATE ROLE $_ LOGIN" } @attackers, values %kind_role),
	'CREATE ROLE h_exporter LOGIN IN ROLE pg_monitor'));

# what roles may do, before and after: attributes and memberships
my $rights_query = q{
	SELECT string_agg(r.rolname || ':' || r.rolsuper || r.rolcreaterole || r.rolcreatedb
	                  || r.rolreplication || r.rolbypassrls || ':'
	                  || coalesce((SELECT string_agg(g.rolname, ',' ORDER BY g.rolname)
	                                 FROM pg_auth_members m JOIN pg_roles g ON g.oid = m.roleid
	                                WHERE m.member = r.oid), ''), ' ' ORDER BY r.rolname)
	FROM pg_roles r WHERE r.rolname !~ '^pg_'};
my $rights_before = $node->safe_psql('postgres', $rights_query);

# --- the record of plants that ran, and the plant factory -------------------
# hijack_log belongs to the superuser; everyone may add a row (a plant runs
# with the rights of whoever it runs as, and records who that is).
my $log_sql = slurp_file("$FindBin::RealBin/../hijack.sql");

# Functions only Citus can run (they read its metadata and change idem's
# keys); test/citus/run.sh calls them on a cluster.
my %citus_only = map { $_ => 1 } qw(idem_distribute_node);

# --- one attacked database -------------------------------------------------
# Create database db owned by evil_owner with idem VERSION version in schema
# home (public, or a schema evil_home owns); plant as every attacker.
sub attacked_database
{
	my (%o) = @_;
	my ($db, $home, $version) = @o{qw(db home version)};
	$node->safe_psql('postgres', "CREATE DATABASE $db OWNER evil_owner");
	$node->safe_psql('postgres', "GRANT CREATE ON DATABASE $db TO evil_creator");
	$node->safe_psql($db, $log_sql);
	if ($home ne 'public')
	{
		# its owner may rename it, too
		$node->safe_psql($db, "CREATE SCHEMA $home AUTHORIZATION evil_home");
		$node->safe_psql('postgres', "GRANT CREATE ON DATABASE $db TO evil_home");
	}
	$node->safe_psql($db, "CREATE EXTENSION idem VERSION '$version' SCHEMA $home");
	$node->safe_psql($db, join(";\n",
		(map { "SELECT * FROM $home.idem_grant('$kind_role{$_}', '$_')" }
		 grep { !$kind_since{$_} || $version eq $current } sort keys %kind_role),
		# a public carried over from PostgreSQL 14: everyone may create in it
		"GRANT CREATE ON SCHEMA $home TO evil_public",
		"GRANT USAGE ON SCHEMA $home TO h_exporter"));
	return attack($db, $home);
}

# The attack on database db whose idem is in schema home: returns the name
# the schema has after it (renamed when its owner is an attacker).
sub attack
{
	my ($db, $home) = @_;
	my $owner = $node->safe_psql($db,
		"SELECT nspowner::regrole FROM pg_namespace WHERE nspname = '$home'");
	my $now_home = $home;
	my @sql;
	if ($owner eq 'evil_owner' || $owner eq 'pg_database_owner' || $owner eq 'evil_home')
	{
		# the schema's owner renames it and plants under its old name
		my $role = $owner eq 'evil_home' ? 'evil_home' : 'evil_owner';
		$now_home = "${home}_renamed";
		push @sql, "SET ROLE $role", "ALTER SCHEMA $home RENAME TO $now_home",
		  "CREATE SCHEMA $home", "GRANT USAGE, CREATE ON SCHEMA $home TO PUBLIC",
		  "SELECT hijack_log.plant('$home')", "SELECT hijack_log.plant('$now_home')", 'RESET ROLE';
	}
	# schemas named after every caller (their "$user"), the superuser's too
	push @sql, 'SET ROLE evil_creator',
	  (map { "CREATE SCHEMA $_; GRANT USAGE ON SCHEMA $_ TO PUBLIC; SELECT hijack_log.plant('$_')" }
		  'postgres', 'h_exporter', values %kind_role),
	  'RESET ROLE';
	# overloads in idem's own schema, by a role that may create there
	push @sql, 'SET ROLE evil_public', "SELECT hijack_log.plant('$now_home')", 'RESET ROLE';
	$node->safe_psql($db, join(";\n", @sql));
	return $now_home;
}

# The calls of each kind, as that role, in sessions that planted in their
# own pg_temp first.  h is the schema idem is in now.
sub call_everything
{
	my ($db, $h) = @_;
	my %sql = (
		h_app => qq{
			CREATE FUNCTION pg_temp.h_handler(request jsonb) RETURNS $h.idem_result
			LANGUAGE sql AS 'SELECT ROW(201, ''{"ok": true}''::json, NULL, 7)::$h.idem_result';
			SELECT order_no IS NOT NULL FROM $h.idem_create_order(1, 'hijack-order-00000001', 1, 2);
			SELECT replayed FROM $h.idem_create_order(1, 'hijack-order-00000001', 1, 2);
			BEGIN;
			SELECT replayed FROM $h.idem_begin(1, 'PAY', 'hijack-begin-00000001', '{"a": 1}');
			SELECT $h.idem_finish(1, 'PAY', 'hijack-begin-00000001', 200, '{"paid": true}');
			COMMIT;
			BEGIN;
			SELECT replayed FROM $h.idem_begin(1, 'PAY', 'hijack-begin-00000002', '{"a": 1}');
			SELECT http_status FROM $h.idem_finish_stored(1, 'PAY', 'hijack-begin-00000002', 200, '{"paid": true}');
			COMMIT;
			SELECT replayed FROM $h.idem_begin(1, 'PAY', 'hijack-begin-00000001', '{"a": 1}');
			SELECT replayed FROM $h.idem_run(1, 'PAY', 'hijack-run-000000001', '{}', 'pg_temp.h_handler(jsonb)');
			SELECT task_id IS NOT NULL FROM $h.idem_submit(1, 'SHIP', 'hijack-task-00000001', '{}');
			SELECT task_id IS NOT NULL FROM $h.idem_submit(1, 'SHIP', 'hijack-task-00000002', '{}');
			SELECT task_id IS NOT NULL FROM $h.idem_submit(1, 'SHIP', 'hijack-task-00000003', '{}');
			SELECT task_id IS NOT NULL FROM $h.idem_submit(1, 'SHIP', 'hijack-task-00000004', '{}');
			SELECT task_id IS NOT NULL FROM $h.idem_submit(1, 'SHIP', 'hijack-task-00000005', '{}');
			SELECT $h.idem_outbox_emit('orders', '{"n": 1}', 'k1', '{"h": "1"}');
			SELECT $h.idem_outbox_emit('orders', '{"n": 2}', 'k2');
			SELECT $h.idem_request_hash('{"a": 1}') IS NOT NULL, $h.idem_canonical_json('{"b": 1, "a": 2}');
		},
		h_worker => qq{
			SELECT $h.idem_heartbeat(task_id, token) IS NOT NULL,
			       $h.idem_task_trace_context(task_id, token) IS NULL,
			       $h.idem_complete(task_id, token, 200, '{"shipped": true}') IS NOT NULL
			  FROM $h.idem_lease('SHIP', 'w1', interval '1 minute');
			SELECT $h.idem_fail(task_id, token, '{"why": "test"}', false) IS NOT NULL
			  FROM $h.idem_lease('SHIP', 'w1', interval '1 minute');
			SELECT $h.idem_fail_unknown(task_id, token, '{"why": "timeout"}') IS NOT NULL
			  FROM $h.idem_lease('SHIP', 'w1', interval '1 minute');
			SELECT count(*) >= 0 FROM $h.idem_lease_reconcile('SHIP', 'w1', interval '1 minute');
		},
		h_publisher => qq{
			SELECT $h.idem_outbox_nack(ARRAY(SELECT message_id FROM $h.idem_outbox_fetch('orders', 10, interval '1 minute')),
			                           'the broker said: try again') >= 0;
			SELECT $h.idem_outbox_ack(ARRAY(SELECT message_id FROM $h.idem_outbox_fetch('orders', 10, interval '1 minute')));
		},
		h_consumer => qq{
			SELECT $h.idem_consume('billing', 'msg-00000001');
			SELECT $h.idem_consume('billing', 'msg-00000001');
			SELECT verdict FROM $h.idem_consume_check('billing', 'msg-00000002', 'k1');
			SELECT dead FROM $h.idem_consume_failed('billing', 'msg-00000003', 'ValueError: boom', 'k1', 'orders');
		},
		h_monitor => qq{
			SELECT count(*) >= 0 FROM $h.idem_stats;
			SELECT count(*) >= 0 FROM $h.idem_audit;
			SELECT count(*) >= 0 FROM $h.idem_audit_entries(1);
			SELECT count(*) >= 0 FROM $h.idem_task_attempts;
			SELECT count(*) >= 0 FROM $h.idem_task_attempt_entries(1);
			SELECT count(*) >= 0 FROM $h.idem_stats_entries();
			SELECT records >= 0 FROM $h.idem_health();
			SELECT count(*) >= 0 FROM $h.idem_cleanup_status();
		},
		postgres => qq{
			CREATE ROLE h_granted;
			SELECT count(*) > 0 FROM $h.idem_grant('h_granted', 'app');
			SELECT count(*) > 0 FROM $h.idem_revoke('h_granted', 'app');
			DROP OWNED BY h_granted;
			DROP ROLE h_granted;
			SELECT count(*) > 0 FROM $h.idem_privileges('monitor');
			SELECT operation FROM $h.idem_set_policy('PAY', ttl => interval '2 hours');
			SELECT operation FROM $h.idem_set_policy('SHIP');
			SELECT count(*) > 0 FROM $h.idem_policies;
			SELECT $h.idem_drop_policy('SHIP');
			SELECT pg_catalog.set_config(pg_catalog.concat('h.t', pg_catalog.right(r.idempotency_key::pg_catalog.text, 1)),
			                             r.id::pg_catalog.text, false) IS NOT NULL
			  FROM idem_internal.idempotency_record r
			 WHERE pg_catalog.starts_with(r.idempotency_key::pg_catalog.text, 'hijack-task-');
			UPDATE idem_internal.idempotency_record
			   SET task_uncertain_since = pg_catalog.now(), task_reconcile_at = pg_catalog.now(), task_due_at = NULL
			 WHERE id OPERATOR(pg_catalog.=) pg_catalog.current_setting('h.t5')::pg_catalog.int8;
			SET ROLE h_operator;
			SELECT $h.idem_task_retry(pg_catalog.current_setting('h.t3')::pg_catalog.int8, 'hijack test');
			SELECT $h.idem_task_resolve(pg_catalog.current_setting('h.t3')::pg_catalog.int8, 200, '{"by": "operator"}', 'hijack test');
			SELECT $h.idem_task_cancel(pg_catalog.current_setting('h.t4')::pg_catalog.int8, 'hijack test');
			SELECT $h.idem_task_settle(pg_catalog.current_setting('h.t5')::pg_catalog.int8, false, 'hijack test');
			SELECT pg_catalog.count(*) FROM $h.idem_operator_actions;
			RESET ROLE;
			UPDATE idem_internal.idem_operator_audit SET reason = reason;
			SELECT $h.idem_forget_owner(99);
			SELECT $h.idem_outbox_set_topic('orders', 5, 'block');
			SELECT $h.idem_outbox_redrive('{}');
			SELECT $h.idem_outbox_discard('{}');
			SELECT $h.idem_inbox_redrive('billing');
			SELECT $h.idem_cleanup_expired(100, 1) >= 0;
			SELECT $h.idem_stats_reset();
		},
	);
	my %ok;
	for my $role (sort keys %sql)
	{
		my ($rc, $out, $err) = $node->psql($db,
			"SELECT hijack_log.plant_temp() > 0; $sql{$role}",
			extra_params => [ '-U', $role, '-v', 'ON_ERROR_STOP=1' ]);
		$ok{$role} = $rc == 0 ? 'ok' : "failed: $err";
	}
	# the internal helpers idem's own code calls only under conditions this
	# test does not make (a Citus worker node, an acknowledgement that locks
	# keys, a counter only the C code bumps), called directly
	my $internal = $node->safe_psql($db, q{
		SELECT string_agg(p.oid::regprocedure::text, ' ' ORDER BY 1)
		  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
		 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
		   AND p.pronamespace = 'idem_internal'::regnamespace});
	my ($rc, $out, $err) = $node->psql($db, qq{
		SELECT idem_internal.idem_cleanup_node(100, 1) >= 0;
		SELECT count(*) > 0 FROM idem_internal.idem_delegated_functions();
		SELECT idem_internal.idem_outbox_lock_keys(ARRAY['orders'], ARRAY['k1']);
		SELECT idem_internal.idem_outbox_lock_dead('test', '{}');
		SELECT idem_internal.idem_stats_add('PAY', 'outbox_acked', 0);
		SELECT idem_internal.idem_timeline_mark();
		SELECT idem_internal.idem_cleanup_worker_notice();
		SELECT idem_internal.idem_owner_visible(1);
		SELECT count(*) FROM idem_internal.idem_dead_letters_acted('{}', '{}');
	}, extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
	$ok{internal} = $rc == 0 ? 'ok' : "failed: $err";
	# Citus is not here: refused before it reads anything (0A000)
	($rc, $out, $err) = $node->psql($db, "SELECT $h.idem_distribute()");
	$ok{distribute} = $err =~ /needs the Citus extension/ ? 'ok' : "unexpected: $err";
	# the exporter's queries, as a pg_monitor role whose search_path names
	# idem's schema after pg_catalog (docs/operations.md)
	open(my $fh, '<', "$FindBin::RealBin/../../contrib/postgres_exporter/idem.yaml") or die $!;
	my @queries = map { /^\s+query:\s*"(.*)"\s*$/ ? ($1) : () } <$fh>;
	close $fh;
	for my $q (@queries)
	{
		($rc, $out, $err) = $node->psql($db, "SET search_path = pg_catalog, $h; $q",
			extra_params => [ '-U', 'h_exporter', '-v', 'ON_ERROR_STOP=1' ]);
		$ok{exporter} .= $rc == 0 ? '' : "failed: $err ";
	}
	$ok{exporter} = scalar(@queries) >= 3 && !$ok{exporter} ? 'ok' : 'failed: ' . ($ok{exporter} // scalar(@queries) . ' queries');
	return \%ok;
}

# Every member function of idem was called at least once in db (or is one
# only Citus runs, or refused before doing anything): '' or those missed.
sub uncalled
{
	my ($db) = @_;
	$node->safe_psql($db, 'SELECT pg_stat_force_next_flush()');
	my $missed = $node->safe_psql($db, q{
		SELECT string_agg(p.proname, ' ' ORDER BY p.proname)
		  FROM pg_proc p JOIN pg_depend d ON d.objid = p.oid AND d.deptype = 'e'
		       AND d.classid = 'pg_proc'::regclass
		 WHERE d.refobjid = (SELECT oid FROM pg_extension WHERE extname = 'idem')
		   AND coalesce((SELECT s.calls FROM pg_stat_user_functions s WHERE s.funcid = p.oid), 0) = 0});
	return join(' ', grep { !$citus_only{$_} && $_ ne 'idem_distribute' } split / /, $missed);
}

# The plants that ran in db since the log's offset from: '' when none did.
sub hits
{
	my ($db, $from) = @_;
	my $log = slurp_file($node->logfile, $from // 0);
	my %seen = map { $_ => 1 } ($log =~ /^\[\Q$db\E\] WARNING:  hijack: plant (.*)$/mg);
	return join('; ', sort keys %seen);
}

# --- the control: the attack on 1.12 runs a plant ----------------------------
my $h = attacked_database(db => 'control_112', home => 'public', version => '1.12');
$node->psql('control_112', "SELECT * FROM $h.idem_outbox_fetch('orders', 1, interval '1 minute')",
	extra_params => [ '-U', 'h_publisher' ]);
like(hits('control_112'), qr/function public\.idem_outbox_guard ran as postgres/,
	'control: on 1.12, the renamed public lets idem_outbox_fetch run a plant as idem\'s owner');

# --- 1.13 in public, renamed by the database's owner ---------------------------
for my $case (
	[ 'h_public', 'public', $current, "idem $current in public, the database owner's" ],
	[ 'h_home', 'idem_app', $current, "idem $current in a schema another role owns" ],
	[ 'h_update', 'public', '1.12', "idem 1.12 in public, attacked, then updated to $current" ])
{
	my ($db, $home, $version, $what) = @$case;
	my $now = attacked_database(db => $db, home => $home, version => $version);
	my $planted = $node->safe_psql($db, 'SELECT count(*) FROM pg_proc WHERE proname ~ \'^idem_\' AND prosrc ~ \'hijack_log.hit\'');
	cmp_ok($planted, '>=', 60, "$what: the attackers planted $planted look-alike functions");
	if ($version ne $current)
	{
		# as the upgrade note says: the grants again, in the update's
		# transaction (1.13 adds idem_finish_stored and replaces
		# idem_outbox_emit and idem_health: EXECUTE on the old ones does not
		# pass to the new ones)
		my ($rc, $out, $err) = $node->psql($db, join(";\n", 'BEGIN', 'ALTER EXTENSION idem UPDATE',
				(map { "SELECT count(*) FROM $now.idem_grant('$kind_role{$_}', '$_')" } sort keys %kind_role),
				'COMMIT'),
			extra_params => [ '-v', 'ON_ERROR_STOP=1' ]);
		is($rc, 0, "$what: ALTER EXTENSION idem UPDATE succeeds in the attacked database") or diag $err;
		is($node->safe_psql($db, q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}), $current,
			"$what: the update reached $current");
	}
	is($node->safe_psql($db, q{SELECT nspowner::regrole FROM pg_namespace WHERE nspname = 'idem_internal'}),
		'postgres', "$what: idem_internal belongs to the extension's owner");
	is($node->safe_psql($db, q{SELECT nspacl IS NULL OR NOT aclcontains(nspacl, makeaclitem(0, nspowner, 'USAGE', false))
		FROM pg_namespace WHERE nspname = 'idem_internal'}), 't', "$what: PUBLIC has no right on idem_internal");
	my $ok = call_everything($db, $now);
	is($ok->{$_}, 'ok', "$what: the calls of $_ succeed") for sort keys %$ok;
	is(uncalled($db), '', "$what: every function of the extension (pg_depend) was called");
	is(hits($db), '', "$what: no plant ran");
}

# --- a round of the cleanup worker in every attacked database ------------------
for my $db (qw(h_public h_home h_update))
{
	my $start = $node->safe_psql($db, 'SELECT now()');
	my $home = $db eq 'h_home' ? 'idem_app_renamed' : 'public_renamed';
	ok(defined wait_until($node, $db, qq{
		SELECT last_run_finished > '$start' FROM $home.idem_cleanup_status()
		 WHERE datname = current_database()}, 't', 120),
		"$db: the cleanup worker finished a round after the plants");
	is(hits($db), '', "$db: the cleanup worker ran no plant");
}

# --- a role with CREATE on the database takes the name idem_internal first ----
$node->safe_psql('postgres', 'CREATE DATABASE h_squat OWNER evil_owner');
$node->safe_psql('postgres', 'GRANT CREATE ON DATABASE h_squat TO evil_creator');
$node->safe_psql('h_squat', 'SET ROLE evil_creator; CREATE SCHEMA idem_internal; GRANT ALL ON SCHEMA idem_internal TO PUBLIC');
my ($rc, $out, $err) = $node->psql('h_squat', 'CREATE EXTENSION idem');
like($err, qr/ERROR:  schema "idem_internal" already exists/, 'a pre-made idem_internal: CREATE EXTENSION fails, saying why');
is($node->safe_psql('h_squat', q{SELECT count(*) FROM pg_extension WHERE extname = 'idem'}), '0',
	'a pre-made idem_internal: nothing was installed');
$node->safe_psql('h_squat', "CREATE EXTENSION idem VERSION '1.12'");
($rc, $out, $err) = $node->psql('h_squat', 'ALTER EXTENSION idem UPDATE');
like($err, qr/schema "idem_internal" already exists/, 'a pre-made idem_internal: the update fails too');
is($node->safe_psql('h_squat', q{SELECT extversion FROM pg_extension WHERE extname = 'idem'}), '1.12',
	'a pre-made idem_internal: the extension stays at 1.12');

# --- a database with tables of idem's names of its own installs idem --------
$node->safe_psql('postgres', 'CREATE DATABASE h_own_tables');
$node->safe_psql('h_own_tables', q{
	CREATE TABLE purchase_order (id int, what text);
	CREATE TABLE idempotency_record (id int);
	INSERT INTO purchase_order VALUES (1, 'mine')});
($rc, $out, $err) = $node->psql('h_own_tables', 'CREATE EXTENSION idem');
is($rc, 0, 'a database with a purchase_order and an idempotency_record of its own installs idem') or diag $err;
is($node->safe_psql('h_own_tables', q{
	SELECT order_no IS NOT NULL FROM idem_create_order(1, 'own-tables-key-00001', 1, 1);
	SELECT (SELECT what FROM public.purchase_order), (SELECT count(*) FROM idem_internal.purchase_order)}),
	"t\nmine|1", '... and idem writes its own, leaving the database\'s alone');

# --- the mitigation for a 1.12 install that cannot update yet (CHANGELOG) ------
$node->safe_psql('postgres', 'CREATE DATABASE h_mitigated OWNER evil_owner');
$node->safe_psql('h_mitigated', $log_sql);
$node->safe_psql('h_mitigated', join(";\n", "CREATE EXTENSION idem VERSION '1.12'",
	"SELECT * FROM idem_grant('h_publisher', 'publisher')",
	'ALTER SCHEMA public OWNER TO postgres', 'GRANT USAGE, CREATE ON SCHEMA public TO evil_owner'));
($rc, $out, $err) = $node->psql('h_mitigated', 'SET ROLE evil_owner; ALTER SCHEMA public RENAME TO idem_home');
like($err, qr/must be owner of schema public/, 'mitigation: the database owner can no longer rename public');
$node->safe_psql('h_mitigated', q{SET ROLE evil_owner; SELECT hijack_log.plant('public')});
$node->safe_psql('h_mitigated', q{SELECT public.idem_outbox_emit('orders', '{}', 'k')});
$node->psql('h_mitigated', q{SELECT * FROM public.idem_outbox_fetch('orders', 1, interval '1 minute')},
	extra_params => [ '-U', 'h_publisher' ]);
is(hits('h_mitigated'), '', 'mitigation: its plants in public do not run');
# the update to the current version warns of the CREATE that mitigation
# left to the database's owner, and idem_health() reports it until revoked
($rc, $out, $err) = $node->psql('h_mitigated', 'ALTER EXTENSION idem UPDATE');
is($rc, 0, 'mitigation: ALTER EXTENSION idem UPDATE from 1.12 succeeds') or diag $err;
like($err, qr/WARNING:  schema "public" lets other roles create objects in it\nDETAIL:  CREATE on the schema is granted to evil_owner\./,
	'... and warns that the database\'s owner may create in public');
is($node->safe_psql('h_mitigated', 'SELECT schema_creators FROM public.idem_health()'), '{evil_owner}',
	'... which idem_health() reports');
$node->safe_psql('h_mitigated', 'REVOKE CREATE ON SCHEMA public FROM evil_owner');
is($node->safe_psql('h_mitigated', 'SELECT schema_creators IS NULL FROM public.idem_health()'), 't',
	'... until it is revoked');
is(hits('h_mitigated'), '', 'mitigation: the update ran none of the plants');

is($node->safe_psql('postgres', $rights_query), $rights_before, 'no role gained a right');

done_testing();
