"""An order service: ``POST /orders`` stores an order and enqueues its charge in one
transaction (app), and a worker charges it exactly once (tasks). See README.md."""
