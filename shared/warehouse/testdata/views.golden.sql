-- customer
SELECT JSON_VALUE(payload, '$.id') AS `id`, SAFE_CAST(JSON_VALUE(payload, '$.created_at') AS TIMESTAMP) AS `created_at`, SAFE_CAST(JSON_VALUE(payload, '$.updated_at') AS TIMESTAMP) AS `updated_at`, JSON_VALUE(payload, '$.name') AS `name`, SAFE_CAST(JSON_VALUE(payload, '$.age') AS INT64) AS `age`, SAFE_CAST(JSON_VALUE(payload, '$.score') AS FLOAT64) AS `score`, SAFE_CAST(JSON_VALUE(payload, '$.active') AS BOOL) AS `active`, SAFE_CAST(JSON_VALUE(payload, '$.birthday') AS DATE) AS `birthday`, SAFE_CAST(JSON_VALUE(payload, '$.signed_up_at') AS TIMESTAMP) AS `signed_up_at`, JSON_QUERY(payload, '$.attributes') AS `attributes` FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM `p1.ontology_internal.events`
      WHERE generation = '0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b' AND source_id = '6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84'
        AND entity_id = 'ent_customer' AND record_kind = 'entity'
    ) WHERE position = 1 AND NOT deleted

-- product
SELECT JSON_VALUE(payload, '$.id') AS `id`, SAFE_CAST(JSON_VALUE(payload, '$.created_at') AS TIMESTAMP) AS `created_at`, SAFE_CAST(JSON_VALUE(payload, '$.updated_at') AS TIMESTAMP) AS `updated_at`, JSON_VALUE(payload, '$.title') AS `title`, SAFE_CAST(JSON_VALUE(payload, '$.price') AS FLOAT64) AS `price`, SAFE_CAST(JSON_VALUE(payload, '$.stock') AS INT64) AS `stock` FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM `p1.ontology_internal.events`
      WHERE generation = '0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b' AND source_id = '6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84'
        AND entity_id = 'ent_product' AND record_kind = 'entity'
    ) WHERE position = 1 AND NOT deleted

-- order
SELECT JSON_VALUE(payload, '$.id') AS `id`, SAFE_CAST(JSON_VALUE(payload, '$.created_at') AS TIMESTAMP) AS `created_at`, SAFE_CAST(JSON_VALUE(payload, '$.updated_at') AS TIMESTAMP) AS `updated_at`, JSON_VALUE(payload, '$.reference') AS `reference`, SAFE_CAST(JSON_VALUE(payload, '$.total') AS FLOAT64) AS `total`, SAFE_CAST(JSON_VALUE(payload, '$.quantity') AS INT64) AS `quantity`, SAFE_CAST(JSON_VALUE(payload, '$.paid') AS BOOL) AS `paid`, SAFE_CAST(JSON_VALUE(payload, '$.placed_at') AS TIMESTAMP) AS `placed_at`, JSON_QUERY(payload, '$.details') AS `details`, JSON_VALUE(payload, '$.customer_id') AS `customer_id` FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM `p1.ontology_internal.events`
      WHERE generation = '0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b' AND source_id = '6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84'
        AND entity_id = 'ent_order' AND record_kind = 'entity'
    ) WHERE position = 1 AND NOT deleted

-- order_products
SELECT JSON_VALUE(payload, '$.source_id') AS source_id, JSON_VALUE(payload, '$.target_id') AS target_id FROM (
      SELECT *, ROW_NUMBER() OVER (PARTITION BY record_key ORDER BY revision DESC, event_id DESC) AS position
      FROM `p1.ontology_internal.events`
      WHERE generation = '0d9e8c7b-6a5f-4e3d-8c2b-1a0f9e8d7c6b' AND source_id = '6f1c2a52-8b0e-4d7a-9a51-3c2b1d0e9f84'
        AND entity_id = 'ent_order' AND record_kind = 'edge:products'
    ) WHERE position = 1 AND NOT deleted

