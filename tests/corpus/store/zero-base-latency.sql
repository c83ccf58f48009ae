-- a latency that divides: the report's relative latency is latency / base p50
UPDATE trials SET base_latency = json_set(base_latency, '$.p50', 0) WHERE base_latency IS NOT NULL;
