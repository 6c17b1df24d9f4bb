-- The order service's own tables, in their own schema (deadman's stay in `deadman`).
-- Run whole by db.migrate() at the app's start-up; every statement may run again.

-- Two apps starting at once would race on CREATE ... IF NOT EXISTS (the catalog's
-- unique index, not the IF, decides): one waits for the other here.
SELECT pg_advisory_xact_lock(hashtext('examples.orders.schema'));

CREATE SCHEMA IF NOT EXISTS shop;

CREATE TABLE IF NOT EXISTS shop.orders (
    id              bigserial   PRIMARY KEY,
    customer        text        NOT NULL,
    email           text        NOT NULL,
    -- The database's rule, whoever writes: an order above 10 000.00 is not taken
    -- online. The API does not repeat it, so it is refused here, after the enqueue.
    amount_cents    bigint      NOT NULL CONSTRAINT orders_amount_online
                                CHECK (amount_cents > 0 AND amount_cents <= 1000000),
    status          text        NOT NULL DEFAULT 'pending'
                                CHECK (status IN ('pending', 'paid')),
    -- Every order has its charge: the job is enqueued before the row is written.
    -- No foreign key: deadman's cleaner deletes finished jobs after a while.
    charge_job_id   bigint      NOT NULL,
    receipt_job_id  bigint      NOT NULL,
    idempotency_key text        UNIQUE,
    created_at      timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE IF NOT EXISTS shop.payments (
    id            bigserial   PRIMARY KEY,
    -- One payment per order: a second charge of the same order fails, whatever ran it.
    order_id      bigint      NOT NULL UNIQUE REFERENCES shop.orders (id),
    amount_cents  bigint      NOT NULL,
    -- What the payment provider was given to drop a repeated request (ctx.idempotency_key).
    provider_key  text        NOT NULL,
    job_id        bigint      NOT NULL,
    created_at    timestamptz NOT NULL DEFAULT now()
);
