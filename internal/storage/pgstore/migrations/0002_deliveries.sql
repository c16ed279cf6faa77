-- 0002: delivery state (leases, redeliveries, out-of-order acks) and dead-letter queues.
-- Owned by deliveries.go / dlq.go; see doc.go for the design.
SELECT 1;
