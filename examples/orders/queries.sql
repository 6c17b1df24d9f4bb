-- The order service's named queries (loaded by db.py, as deadman loads its own).
-- Values are always parameters.

-- name: order_next_id
-- An order's id before its row: the row carries the ids of its jobs, enqueued first.
SELECT nextval(pg_get_serial_sequence('shop.orders', 'id')) AS id;

-- name: order_insert
-- No row back: the idempotency key is taken (a repeat, or a twin committed first:
-- ON CONFLICT waits for it). The caller then rolls back, jobs included.
INSERT INTO shop.orders
    (id, customer, email, amount_cents, charge_job_id, receipt_job_id, idempotency_key)
VALUES
    (%(id)s, %(customer)s, %(email)s, %(amount_cents)s, %(charge_job_id)s,
     %(receipt_job_id)s, %(idempotency_key)s)
ON CONFLICT (idempotency_key) DO NOTHING
RETURNING id;

-- name: order_by_key
SELECT id, customer, email, amount_cents, charge_job_id, receipt_job_id
FROM shop.orders WHERE idempotency_key = %(idempotency_key)s;

-- name: order_get
-- The order and its payment, if it has one.
SELECT o.id, o.customer, o.email, o.amount_cents, o.status, o.charge_job_id,
       o.receipt_job_id, o.created_at, p.id AS payment_id, p.created_at AS paid_at
FROM shop.orders o
LEFT JOIN shop.payments p ON p.order_id = o.id
WHERE o.id = %(id)s;

-- name: payment_insert
INSERT INTO shop.payments (order_id, amount_cents, provider_key, job_id)
VALUES (%(order_id)s, %(amount_cents)s, %(provider_key)s, %(job_id)s)
RETURNING id;

-- name: order_mark_paid
-- No row back: no such order, or it is paid already (never charge twice).
UPDATE shop.orders SET status = 'paid'
WHERE id = %(id)s AND status = 'pending'
RETURNING id;
