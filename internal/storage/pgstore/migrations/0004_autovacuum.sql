-- 0004: autovacuum for the tables whose rows churn with every claim and ack batch. The defaults
-- (20 % of the table, checked every autovacuum_naptime) let dead versions of spool.deliveries pile
-- up while its live rows stay few; vacuum and analyze them after a fixed number of changes instead,
-- without cost-based throttling (the tables are small).
ALTER TABLE spool.deliveries SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_analyze_scale_factor = 0,
    autovacuum_analyze_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE spool.sub_partitions SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
ALTER TABLE spool.partitions SET (
    autovacuum_vacuum_scale_factor = 0,
    autovacuum_vacuum_threshold = 2000,
    autovacuum_vacuum_cost_delay = 0
);
