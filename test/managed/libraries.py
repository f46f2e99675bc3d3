"""The Python library (from the source tree) against the SQL edition: the
wait for an in-flight original ends in 55P03 from the claim, which the
library raises as InFlight (IK002); an application's own lock timeout
stays 55P03.  Prints "ok - ..." / "not ok - ..." lines.

    python3 libraries.py DSN
"""
import sys

import psycopg

import idem_pg

dsn = sys.argv[1]
idem_pg.use_schema("idem")


def check(name, ok, got):
    print(("ok - " if ok else "not ok - ") + name + ("" if ok else " (got %r)" % (got,)))


first = psycopg.connect(dsn)
second = psycopg.connect(dsn)
try:
    with first.transaction():
        out = idem_pg.begin(first, 7, "PAY", "lib-key-000000000001", {"amount": 10})
        check("the SQL edition claims a key through idem_pg.begin", out.replayed is False, out)
        second.execute("SET idem_sql.wait_timeout = 0")
        try:
            with second.transaction():
                idem_pg.begin(second, 7, "PAY", "lib-key-000000000001", {"amount": 10})
            got = None
        except Exception as e:  # noqa: BLE001 - what was raised is the check
            got = e
        check("a duplicate of a claim in flight raises InFlight with SQLSTATE IK002 (55P03 from idem_sql_claim)",
              isinstance(got, idem_pg.InFlight) and got.sqlstate == "IK002", got)
        idem_pg.finish(first, 7, "PAY", "lib-key-000000000001", 201, {"paid": 10})
    with second.transaction():
        out = idem_pg.begin(second, 7, "PAY", "lib-key-000000000001", {"amount": 10})
    check("after the original's commit the duplicate replays it", out.replayed and out.http_status == 201, out)

    first.execute("CREATE TABLE IF NOT EXISTS public.lib_row (id int PRIMARY KEY)")
    first.execute("INSERT INTO public.lib_row VALUES (1) ON CONFLICT DO NOTHING")
    first.commit()
    with first.transaction():
        first.execute("SELECT * FROM public.lib_row FOR UPDATE")
        try:
            with second.transaction():
                second.execute("SET LOCAL lock_timeout = '10ms'")
                second.execute("UPDATE public.lib_row SET id = 1")
            got = None
        except psycopg.Error as e:
            got = idem_pg.translate(e)
        check("an application's own lock timeout stays 55P03, not InFlight",
              not isinstance(got, idem_pg.InFlight) and getattr(got, "sqlstate", None) == "55P03", got)
finally:
    first.close()
    second.close()
