"""idem_pg's API against a real server (the libpq variables name it; a
database with examples/schema.sql, as test/clients/run.sh makes it)."""
import datetime
import json
import threading
import uuid

import psycopg
import pytest

import idem_pg
from idem_pg import errors


def new_key():
    return "py-" + uuid.uuid4().hex


@pytest.fixture
def conn():
    with psycopg.connect() as c:
        yield c


def test_claim_then_replay(conn):
    k = new_key()
    with conn.transaction(), idem_pg.claim(conn, 1, "DEBIT", k, {"account": 7, "amount": 100}) as c:
        assert not c.replayed
        assert c.outcome.expires_at > datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=23)
        c.finish(201, idem_pg.RawJson('{"b":1,  "a":2}'), resource_id=9, headers={"Location": "/debits/9"})
    # another spelling of the same request replays, byte for byte
    with conn.transaction(), idem_pg.claim(conn, 1, "DEBIT", k, {"amount": 100, "account": 7.0}) as c:
        assert c.replayed
        o = c.outcome
    assert (o.http_status, o.body, o.headers, o.resource_id) == (201, '{"b":1,  "a":2}', {"Location": "/debits/9"}, 9)


def test_claim_not_finished_raises_and_rolls_back(conn):
    k = new_key()
    with pytest.raises(idem_pg.NoClaim):
        with conn.transaction(), idem_pg.claim(conn, 1, "DEBIT", k, {}):
            pass
    assert not idem_pg.begin(conn, 1, "DEBIT", k, {}).replayed     # nothing was stored
    conn.rollback()


def test_exceptions_per_sqlstate(conn):
    k = new_key()
    with conn.transaction():
        idem_pg.begin(conn, 1, "DEBIT", k, {"n": 1})
        idem_pg.finish(conn, 1, "DEBIT", k, 200, {})
    cases = [
        (idem_pg.KeyReused, "IK001", lambda: idem_pg.begin(conn, 1, "DEBIT", k, {"n": 2})),
        (idem_pg.NoClaim, "IK003", lambda: idem_pg.finish(conn, 1, "DEBIT", new_key(), 200, {})),
        (idem_pg.InvalidRequest, "22023", lambda: idem_pg.begin(conn, 1, "DEBIT", "short", {})),
        (idem_pg.InvalidRequest, "22023", lambda: idem_pg.begin(conn, 1, "DEBIT", new_key(), {}, ttl=-5)),
        (idem_pg.InvalidRequest, "22004", lambda: idem_pg.begin(conn, 1, "DEBIT", new_key(), None)),
    ]
    for cls, state, call in cases:
        with pytest.raises(cls) as info:
            call()
        assert info.value.sqlstate == state
        assert isinstance(info.value.__cause__, psycopg.Error)
        conn.rollback()


def test_expired_refused_key_is_ik007(conn):
    # an expired key of an operation that refuses reuse (1.11)
    k = new_key()
    conn.execute("SELECT public.idem_set_policy('EXPIRING'::pg_catalog.text, audit_ttl => '30 days'::pg_catalog.interval,"
                 " reuse_after_expiry => 'refuse'::pg_catalog.text)")
    with conn.transaction():
        idem_pg.begin(conn, 1, "EXPIRING", k, {})
        idem_pg.finish(conn, 1, "EXPIRING", k, 201, {})
    conn.execute("UPDATE idem_internal.idempotency_record SET expires_at = now() - interval '1 minute' WHERE idempotency_key = %s",
                 (k,))
    conn.commit()
    try:
        with pytest.raises(idem_pg.KeyExpired) as info:
            idem_pg.begin(conn, 1, "EXPIRING", k, {})
        assert info.value.sqlstate == "IK007"
        conn.rollback()
    finally:
        conn.execute("SELECT public.idem_drop_policy('EXPIRING'::pg_catalog.text)")
        conn.commit()


def test_in_flight_is_ik002():
    k = new_key()
    with psycopg.connect() as holder, psycopg.connect() as other:
        idem_pg.begin(holder, 1, "DEBIT", k, {})
        other.execute("SET idem.wait_timeout = 0")
        with pytest.raises(idem_pg.InFlight):
            idem_pg.begin(other, 1, "DEBIT", k, {})
        holder.rollback()


def test_read_only_is_25006():
    with psycopg.connect(options="-c default_transaction_read_only=on") as c:
        k = new_key()
        assert not idem_pg.begin(c, 1, "DEBIT", k, {}).replayed    # a claim writes nothing yet
        with pytest.raises(idem_pg.ReadOnly):
            idem_pg.finish(c, 1, "DEBIT", k, 201, {})


def test_not_allowed_is_42501():
    # the examples' role is bound to owners 1-999999 (test/clients/run.sh)
    with psycopg.connect(user="shop_app") as c:
        with pytest.raises(idem_pg.NotAllowed):
            idem_pg.begin(c, 5000000, "DEBIT", new_key(), {})


def test_run_with_a_sql_handler(conn):
    conn.execute("INSERT INTO account VALUES (9001, 100) ON CONFLICT (id) DO UPDATE SET balance = 100")
    conn.commit()
    k = new_key()
    first = idem_pg.run(conn, 1, "DEBIT", k, {"account": 9001, "amount": 10}, "debit_handler(jsonb)")
    again = idem_pg.run(conn, 1, "DEBIT", k, {"account": 9001, "amount": 10}, "debit_handler(jsonb)")
    conn.commit()
    assert (first.replayed, again.replayed, first.http_status, first.body) == (False, True, 201, again.body)
    assert first.expires_at == again.expires_at
    assert conn.execute("SELECT balance FROM account WHERE id = 9001").fetchone()[0] == 90


def test_serialization_failure_and_retry_helper():
    """Two SERIALIZABLE transactions of one key: the loser gets 40001 as
    SerializationFailure, and retry_serializable's retry replays."""
    k = new_key()
    a, b = psycopg.connect(), psycopg.connect()
    try:
        for c in (a, b):
            c.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
            c.execute("SELECT 1")          # the snapshot: taken before the other commits
        idem_pg.begin(a, 1, "DEBIT", k, {})
        idem_pg.finish(a, 1, "DEBIT", k, 201, {"ok": True})
        a.commit()
        with pytest.raises(idem_pg.SerializationFailure):
            idem_pg.begin(b, 1, "DEBIT", k, {})
        b.rollback()
        # retry_serializable: the first attempt races a real commit of
        # another key (40001), the second replays it
        k2 = new_key()
        attempts = []

        def transaction():
            attempts.append(1)
            with b.transaction():
                b.execute("SET TRANSACTION ISOLATION LEVEL SERIALIZABLE")
                b.execute("SELECT 1")
                if len(attempts) == 1:
                    with a.transaction():
                        idem_pg.begin(a, 1, "DEBIT", k2, {})
                        idem_pg.finish(a, 1, "DEBIT", k2, 201, {"ok": True})
                return idem_pg.begin(b, 1, "DEBIT", k2, {})
        outcome = idem_pg.retry_serializable(transaction)
        assert outcome.replayed and len(attempts) == 2
    finally:
        a.close()
        b.close()


def test_submit_lease_heartbeat_complete_and_fencing(conn):
    conn.autocommit = True
    op = "SHIP_" + uuid.uuid4().hex[:8]
    k = new_key()
    s = idem_pg.submit(conn, 1, op, k, {"order": 7}, payload={"priority": "high"})
    assert (s.replayed, s.status, s.http_status) == (False, "PROCESSING", 202) and s.task_id
    worker = idem_pg.TaskWorker(op, "w1", lease=30)
    (task,) = worker.lease(conn, batch=10)
    assert (task.key, task.request, task.payload, task.attempt) == (k, {"order": 7}, {"priority": "high"}, 1)
    assert task.heartbeat(conn) > datetime.datetime.now(datetime.timezone.utc)
    # a transient failure, then a takeover after the lease lapses: the old token is fenced off
    assert task.fail(conn, {"carrier": "timeout"}) == "FAILED_RETRYABLE"
    conn.execute("UPDATE idem_internal.idempotency_record SET task_due_at = now() - interval '1 second' WHERE id = %s",
                 (task.task_id,))
    (second,) = idem_pg.TaskWorker(op, "w2", lease=30).lease(conn)
    assert second.token > task.token and second.attempt == 2
    with pytest.raises(idem_pg.LeaseLost):
        task.complete(conn, 201, {"tracking": "stale"})
    with conn.transaction():
        second.complete(conn, 201, {"tracking": "JD0123"}, resource_id=7)
    done = idem_pg.submit(conn, 1, op, k, {"order": 7})
    assert (done.replayed, done.status, done.http_status, done.body) == (True, "SUCCEEDED", 201,
                                                                       '{"tracking":"JD0123"}')


def test_uncertain_outcome_is_reconciled_before_any_retry(conn):
    conn.autocommit = True
    op = "PAY_" + uuid.uuid4().hex[:8]
    conn.execute("SELECT public.idem_set_policy(%s::pg_catalog.text, uncertain => 'reconcile'::pg_catalog.text,"
                 " redact => ARRAY['/card']::pg_catalog.text[])", (op,))
    try:
        k = new_key()
        idem_pg.submit(conn, 1, op, k, {"amount": 500})
        worker = idem_pg.TaskWorker(op, "w1", lease=30)
        (task,) = worker.lease(conn)
        assert task.fail_unknown(conn, {"provider": "timeout", "card": "4242"}) == "PROCESSING"
        assert worker.lease(conn, batch=10) == []          # a plain lease never gets it again
        again = idem_pg.submit(conn, 1, op, k, {"amount": 500})
        assert (again.http_status, again.reconciling) == (202, True)
        assert json.loads(again.body)["type"] == "urn:idem:task:reconciling"
        (rec,) = worker.lease_reconcile(conn)
        assert isinstance(rec, idem_pg.ReconcileTask) and rec.token > task.token and rec.uncertain_since
        assert [(a["outcome"], a["error"]) for a in rec.attempts] == [("unknown", {"provider": "timeout"})]
        assert rec.not_charged(conn) == "FAILED_RETRYABLE"
        conn.execute("UPDATE idem_internal.idempotency_record SET task_due_at = now() WHERE id = %s", (task.task_id,))
        (second,) = worker.lease(conn)
        assert second.attempt == 2
        with conn.transaction():
            second.complete(conn, 201, {"charge": "ch_1"})
        assert not idem_pg.submit(conn, 1, op, k, {"amount": 500}).reconciling
    finally:
        conn.execute("SELECT public.idem_drop_policy(%s::pg_catalog.text)", (op,))


def test_operator_actions_and_their_errors(conn):
    from idem_pg import operator
    conn.autocommit = True
    op = "OPS_" + uuid.uuid4().hex[:8]
    conn.execute("SELECT public.idem_set_policy(%s::pg_catalog.text, uncertain => 'reconcile'::pg_catalog.text)", (op,))
    try:
        k1, k2 = new_key(), new_key()
        idem_pg.submit(conn, 1, op, k1, {"amount": 1})
        idem_pg.submit(conn, 1, op, k2, {"amount": 2})
        worker = idem_pg.TaskWorker(op, "w1")
        t1, t2 = sorted(worker.lease(conn, batch=2), key=lambda t: t.key == k2)
        assert t1.fail_unknown(conn, {"provider": "timeout"}) == "PROCESSING"
        assert operator.settle_task(conn, t1.task_id, True, "found at the provider", 201, {"charge": "ch_1"}) == "SUCCEEDED"
        assert idem_pg.submit(conn, 1, op, k1, {"amount": 1}).body == '{"charge":"ch_1"}'
        assert operator.cancel_task(conn, t2.task_id, "the customer asked") == "FAILED_FINAL"
        with pytest.raises(idem_pg.StaleToken):
            t2.complete(conn, 201, {"late": True})
        with pytest.raises(idem_pg.TaskStateConflict) as e:
            operator.retry_task(conn, t2.task_id, "too late")
        assert e.value.http_status == 409
        with pytest.raises(idem_pg.InvalidRequest):
            operator.cancel_task(conn, t2.task_id, "")
        reasons = conn.execute("SELECT string_agg(reason, ',' ORDER BY id) FROM public.idem_operator_actions"
                               " WHERE operation = %s", (op,)).fetchone()[0]
        assert reasons == "found at the provider,the customer asked"
    finally:
        conn.execute("SELECT public.idem_drop_policy(%s::pg_catalog.text)", (op,))


def test_worker_wait_wakes_on_submit():
    op = "WAKE_" + uuid.uuid4().hex[:8]
    with psycopg.connect(autocommit=True) as listener, psycopg.connect(autocommit=True) as app:
        worker = idem_pg.TaskWorker(op, "w1")
        assert worker.wait(listener, 0.05) is False
        timer = threading.Timer(0.2, lambda: idem_pg.submit(app, 1, op, new_key(), {}))
        timer.start()
        assert worker.wait(listener, 5) is True
        timer.join()
        assert len(worker.lease(listener)) == 1


def test_outbox_emit_and_inbox_consume(conn):
    topic = "py-" + uuid.uuid4().hex[:8]
    with conn.transaction():
        mid = idem_pg.emit(conn, topic, {"order": 1}, key="order-1", headers={"kind": "created"})
    assert mid > 0
    consumer = "billing-" + uuid.uuid4().hex[:6]
    with conn.transaction():
        assert idem_pg.consume(conn, consumer, "%s-%d" % (topic, mid)) is True
    with conn.transaction():
        assert idem_pg.consume(conn, consumer, "%s-%d" % (topic, mid)) is False
    # an owner's entry (1.11): idem_forget_owner removes it
    owner = 700000 + mid % 1000
    with conn.transaction():
        assert idem_pg.consume(conn, consumer, "%s-%d-owned" % (topic, mid), owner=owner) is True
    assert conn.execute("SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = %s", (owner,)).fetchone()[0] == 1
    conn.execute("SELECT public.idem_forget_owner(%s::pg_catalog.int8)", (owner,))
    assert conn.execute("SELECT count(*) FROM idem_internal.idem_inbox WHERE owner_id = %s", (owner,)).fetchone()[0] == 0
    conn.commit()


def test_prepare_off_never_prepares(conn):
    """prepare=False (behind a transaction pooler): no server-side
    statement, where psycopg's default prepares after 5 executions."""
    def calls(prepare):
        for _ in range(8):
            with conn.transaction():
                k = new_key()
                idem_pg.begin(conn, 1, "DEBIT", k, {}, prepare=prepare)
                idem_pg.finish(conn, 1, "DEBIT", k, 201, {}, prepare=prepare)
        return conn.execute("SELECT count(*) FROM pg_prepared_statements").fetchone()[0]
    assert calls(False) == 0
    assert calls(None) >= 1


def test_sqlstate_of_a_wrapped_error():
    """Django wraps the driver's error: its cause's SQLSTATE counts."""
    driver = type("DriverError", (Exception,), {"pgcode": "IK002"})("in flight")
    wrapped = RuntimeError("wrapped")
    wrapped.__cause__ = driver
    assert errors.sqlstate_of(wrapped) == "IK002"
    assert isinstance(errors.translate(wrapped), idem_pg.InFlight)


def test_http_helpers():
    """The contract's pure parts: key forms, what a route fingerprints, the stored headers."""
    from idem_pg.http import Problem, Route, Settings, parse_key, resolve, stored_headers
    by_tenant = Route(lambda req: None if req == "static" else "PAY_" + req)
    assert resolve(by_tenant, "eu").operation == "PAY_eu" and resolve(by_tenant, "static") is None
    assert resolve(Route("SHIP"), "any").operation == "SHIP"
    k = "8e03978e-40d5-43e8-bc93-6894a57f9324"
    assert parse_key(['"%s"' % k]) == parse_key([k]) == k and parse_key([]) is None
    for bad in (['"%s' % k], ["short"], [k, k], ['"a\\x"']):
        with pytest.raises(Problem):
            parse_key(bad)
    body = {"skuId": 1, "quantity": 2, "note": "x"}
    assert Route("OP").request_of(body, {}) == body                                  # the whole body by default
    assert Route("OP", ["skuId", "quantity", "gift"]).request_of(body, {}) == {"skuId": 1, "quantity": 2, "gift": None}
    assert Route("OP", lambda b, p: {"id": p["id"]}).request_of(body, {"id": "7"}) == {"id": "7"}
    with pytest.raises(Problem):
        Route("OP", ["skuId"]).request_of([1, 2], {})
    headers = [("Content-Type", "application/json"), ("Location", "/x"), ("Date", "now"), ("Content-Length", "2"),
               ("Connection", "keep-alive, X-Hop"), ("X-Hop", "1"), ("Set-Cookie", "a=1"), ("Set-Cookie", "b=2"),
               ("Vary", "Accept"), ("Vary", "Origin"), ("Transfer-Encoding", "chunked")]
    assert stored_headers(headers, Settings(owner=None)) == {"content-type": "application/json", "location": "/x",
                                                             "vary": "Accept, Origin"}
    assert stored_headers(headers, Settings(owner=None, replay_set_cookie=True))["set-cookie"] == "a=1\x1fb=2"


def test_replayed_set_cookie_lines_and_finish_stored(conn):
    # replay_set_cookie: two Set-Cookie lines stored in one value (idem 1.13
    # refuses a newline in a stored header) and replayed as two fields; the
    # answer as stored is what finish_stored returns
    from idem_pg import http
    settings = http.Settings(owner=lambda _: 1, replay_set_cookie=True)
    kept = http.stored_headers([("Set-Cookie", "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT"),
                                ("Set-Cookie", "b=2"), ("Location", "/x")], settings)
    k = new_key()
    with conn.transaction():
        assert not idem_pg.begin(conn, 1, "COOKIES", k, {}).replayed
        stored = idem_pg.finish_stored(conn, 1, "COOKIES", k, 201, {"ok": True}, headers=kept)
    assert (stored.replayed, stored.http_status, json.loads(stored.body)) == (False, 201, {"ok": True})
    with conn.transaction():
        o = idem_pg.begin(conn, 1, "COOKIES", k, {})
    assert o.replayed and o.headers == stored.headers
    assert sorted(http.replayed_headers(o.headers)) == [
        ("location", "/x"), ("set-cookie", "a=1; Expires=Wed, 21 Oct 2026 07:28:00 GMT"), ("set-cookie", "b=2")]
    # a newline in a stored header is refused (22023): it would split a replay
    k2 = new_key()
    with pytest.raises(idem_pg.InvalidRequest):
        with conn.transaction():
            idem_pg.begin(conn, 1, "COOKIES", k2, {})
            idem_pg.finish(conn, 1, "COOKIES", k2, 201, {}, headers={"location": "/x\r\nSet-Cookie: evil=1"})


def test_async_api_covers_the_sync_one():
    """idem_pg.aio: every call of the synchronous API, awaited on an AsyncConnection."""
    import asyncio
    from idem_pg import aio

    sync_calls = {"begin", "finish", "finish_stored", "run", "submit", "consume", "emit", "claim",
                  "retry_serializable", "TaskWorker"}
    assert sync_calls <= set(aio.__all__), sync_calls - set(aio.__all__)

    async def main():
        k, tk, mid = new_key(), new_key(), "py-async-" + uuid.uuid4().hex
        async with await psycopg.AsyncConnection.connect() as conn:
            async with conn.transaction():
                async with aio.claim(conn, 1, "DEBIT", k, {"account": 7, "amount": 5}) as c:
                    assert not c.replayed
                    message_id = await aio.emit(conn, "async.debits", {"account": 7}, key="7", owner=1)
                    stored = await c.finish(201, {"debited": 5}, resource_id=3)
            assert (stored.http_status, json.loads(stored.body), stored.resource_id) == (201, {"debited": 5}, 3)
            async with conn.transaction():
                again = await aio.begin(conn, 1, "DEBIT", k, {"amount": 5, "account": 7})
            assert again.replayed and again.body == stored.body
            async with conn.transaction():
                first = await aio.consume(conn, "py-async", mid, owner=1)
                second = await aio.consume(conn, "py-async", mid, owner=1)
            assert (first, second) == (True, False)
            async with conn.transaction():
                sub = await aio.submit(conn, 1, "ASYNC_SHIP", tk, {"order": 1})
            assert not sub.replayed and sub.status == "PROCESSING"
            await conn.set_autocommit(True)
            worker = aio.TaskWorker("ASYNC_SHIP", "py-async-worker", lease=30)
            tasks = [t for t in await worker.lease(conn, batch=10) if t.key == tk]
            assert len(tasks) == 1
            await aio.TaskWorker.heartbeat(conn, tasks[0])
            await aio.TaskWorker.complete(conn, tasks[0], 201, {"shipped": True})
            again = await aio.submit(conn, 1, "ASYNC_SHIP", tk, {"order": 1})
            assert (again.replayed, again.status, again.http_status) == (True, "SUCCEEDED", 201)
            owner_of = await (await conn.execute(
                "SELECT owner_id FROM idem_internal.idem_outbox WHERE message_id = %s", (message_id,))).fetchone()
            assert owner_of == (1,)
            attempts = []

            async def once():
                attempts.append(1)
                return "done"
            assert await aio.retry_serializable(once) == "done" and attempts == [1]

    asyncio.run(main())
