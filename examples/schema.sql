-- The examples' database: idem, and the business of the debit endpoint.
-- psql -d DB -f examples/schema.sql  (as a superuser, once)
CREATE EXTENSION IF NOT EXISTS idem;

CREATE TABLE IF NOT EXISTS public.account (id bigint PRIMARY KEY, balance numeric NOT NULL);
CREATE TABLE IF NOT EXISTS public.debit (
    id bigserial PRIMARY KEY,
    account_id bigint NOT NULL REFERENCES public.account,
    amount numeric NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now());

-- POST /api/accounts/{id}/debit: the work of one debit, run by idem_run
-- once per idempotency key.  Insufficient funds is a deterministic failure:
-- a 422 result, stored and replayed.  An unknown account raises: nothing is
-- stored, and a retry with the same key executes afresh.
CREATE OR REPLACE FUNCTION public.debit_handler(request jsonb) RETURNS idem_result
LANGUAGE plpgsql AS $$
DECLARE
    acct bigint := (request->>'account')::bigint;
    amt numeric := (request->>'amount')::numeric;
    bal numeric;
    debit_id bigint;
BEGIN
    IF amt IS NULL OR amt <= 0 THEN
        RETURN ROW(422, json_build_object('error', 'amount must be positive'), NULL, NULL)::idem_result;
    END IF;
    UPDATE public.account SET balance = balance - amt WHERE id = acct AND balance >= amt
    RETURNING balance INTO bal;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM public.account WHERE id = acct) THEN
            RAISE EXCEPTION 'account % does not exist', acct;
        END IF;
        RETURN ROW(422, json_build_object('error', 'insufficient funds'), NULL, NULL)::idem_result;
    END IF;
    INSERT INTO public.debit (account_id, amount) VALUES (acct, amt) RETURNING id INTO debit_id;
    RETURN ROW(201, json_build_object('debitId', debit_id, 'accountId', acct, 'amount', amt, 'balance', bal),
               jsonb_build_object('Location', '/api/debits/' || debit_id), debit_id)::idem_result;
END $$;

-- POST /api/orders in the examples on the client libraries (clients/): the
-- order is the application's own row, written by the route's handler in
-- the transaction of the middleware's claim.
CREATE TABLE IF NOT EXISTS public.shop_order (
    id bigserial PRIMARY KEY,
    owner_id bigint NOT NULL,
    sku_id bigint NOT NULL,
    quantity integer NOT NULL CHECK (quantity BETWEEN 1 AND 100),
    created_at timestamptz NOT NULL DEFAULT now());

-- POST /api/accounts/{id}/debit on the libraries: one debit, or NULL when
-- the funds are short; an unknown account raises (a 500: nothing stored,
-- the retry executes afresh).
CREATE OR REPLACE FUNCTION public.debit_account(acct bigint, amt numeric,
    OUT debit_id bigint, OUT balance numeric)
LANGUAGE plpgsql AS $$
BEGIN
    UPDATE public.account a SET balance = a.balance - amt WHERE a.id = acct AND a.balance >= amt
    RETURNING a.balance INTO balance;
    IF NOT FOUND THEN
        IF NOT EXISTS (SELECT 1 FROM public.account WHERE id = acct) THEN
            RAISE EXCEPTION 'account % does not exist', acct;
        END IF;
        RETURN;
    END IF;
    INSERT INTO public.debit (account_id, amount) VALUES (acct, amt) RETURNING id INTO debit_id;
END $$;
