"""What the library does when the database is not set up for it: a role
without idem's grants (a 500 and one ERROR, not the owner binding's 403),
an overload that makes idem's functions ambiguous (an error naming it),
and idem's schema named in every statement (use_schema)."""
import io
import json
import logging
import uuid
from contextlib import contextmanager

import psycopg
import pytest

import idem_pg
from idem_pg import http
from idem_pg.http import Routes, Settings
from idem_pg.wsgi import IdempotencyMiddleware


def new_key():
    return "py-" + uuid.uuid4().hex


@pytest.fixture
def su():
    with psycopg.connect(autocommit=True) as c:
        yield c


@pytest.fixture
def role(su):
    """A login role of its own, dropped afterwards."""
    name = "idem_py_" + uuid.uuid4().hex[:8]
    su.execute('CREATE ROLE "%s" LOGIN' % name)
    yield name
    su.execute('DROP OWNED BY "%s"' % name)
    su.execute('DROP ROLE "%s"' % name)


def post(role, owner=7):
    """One POST through the WSGI middleware, connected as role."""
    @contextmanager
    def connection():
        with psycopg.connect(user=role) as c:
            yield c

    def app(environ, start_response):
        start_response("201 Created", [("Content-Type", "application/json")])
        return [b'{"ok": true}']

    mw = IdempotencyMiddleware(app, Routes().add("POST", "/things", "SETUP_TEST"),
                               Settings(owner=lambda environ: owner, connection=connection))
    body = b'{"n": 1}'
    environ = {"REQUEST_METHOD": "POST", "PATH_INFO": "/things", "CONTENT_LENGTH": str(len(body)),
               "CONTENT_TYPE": "application/json", "HTTP_IDEMPOTENCY_KEY": new_key(), "wsgi.input": io.BytesIO(body)}
    status = []
    out = b"".join(mw(environ, lambda s, h, *a: status.append(s)))
    return int(status[0].split()[0]), json.loads(out)


def test_role_without_grants_is_a_500_logged_once(su, role, caplog):
    http._missing_grant_logged = False
    with caplog.at_level(logging.ERROR, logger="idem_pg"):
        first = post(role)
        second = post(role)
    assert first[0] == 500 and second[0] == 500, (first, second)
    assert first[1]["type"].endswith("internal")
    named = [r for r in caplog.records if "idem_grant('%s', 'app')" % role in r.getMessage()]
    assert len(named) == 1, [r.getMessage() for r in caplog.records]


def test_owner_outside_the_binding_is_a_403(su, role):
    su.execute("SELECT count(*) FROM public.idem_grant(%s::pg_catalog.regrole, 'app'::pg_catalog.text)", (role,))
    su.execute('ALTER ROLE "%s" SET idem.allowed_owners = \'1-5\'' % role)
    assert post(role, owner=7)[0] == 403
    assert post(role, owner=3)[0] == 201


def test_ambiguous_overload_names_the_function(su):
    schema = su.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idem'").fetchone()[0]
    su.execute("CREATE FUNCTION %s.idem_begin(bigint, text, text, jsonb, interval DEFAULT NULL, extra int DEFAULT 0)"
               " RETURNS boolean LANGUAGE sql AS 'SELECT false'" % schema)
    try:
        shadowing = su.execute("SELECT shadowing_functions FROM public.idem_health()").fetchone()[0]
        assert shadowing and any("idem_begin" in f for f in shadowing), shadowing
        with pytest.raises(idem_pg.Misconfigured) as info:
            with su.transaction():
                idem_pg.begin(su, 1, "DEBIT", new_key(), {})
        assert "idem_begin" in str(info.value) and "not unique" in str(info.value)
    finally:
        su.execute("DROP FUNCTION %s.idem_begin(bigint, text, text, jsonb, interval, int)" % schema)


def test_use_schema_names_the_schema(su):
    schema = su.execute("SELECT extnamespace::regnamespace::text FROM pg_extension WHERE extname = 'idem'").fetchone()[0]
    idem_pg.use_schema("no_such_schema")
    try:
        with pytest.raises(idem_pg.Misconfigured):
            with su.transaction():
                idem_pg.begin(su, 1, "DEBIT", new_key(), {})
    finally:
        idem_pg.use_schema(None)
    idem_pg.use_schema(schema)
    try:
        with su.transaction():
            assert not idem_pg.begin(su, 1, "DEBIT", k := new_key(), {}).replayed
            idem_pg.finish(su, 1, "DEBIT", k, 201, {})
    finally:
        idem_pg.use_schema(None)
