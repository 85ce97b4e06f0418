INSERT INTO ml.deployments (model_id)
SELECT max(id) FROM ml.models HAVING max(id) IS NOT NULL
ON CONFLICT (model_id) DO NOTHING
RETURNING model_id
