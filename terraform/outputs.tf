output "drain_url" {
  description = "Base URL of the drain; the ontology service calls <url>/api/internal/v1/workspaces/<id>/ontology/replication/drain through the gateway."
  value       = google_cloud_run_v2_service.drain.uri
}

output "verify_url" {
  description = "URL of the private verifier, called by Cloud Scheduler."
  value       = google_cloud_run_v2_service.verify.uri
}

output "job_name" {
  description = "Cloud Run job to run with `gcloud run jobs execute`."
  value       = google_cloud_run_v2_job.replication.name
}

output "topics" {
  description = "Per workspace: the events topic and its dead-letter topic."
  value       = { for id, ws in module.workspace : id => { topic = ws.topic_name, dead_letter_topic = ws.dead_letter_topic_name } }
}

output "database_users" {
  description = "IAM database users to create and grant on each workspace's Cloud SQL database (see terraform/README.md)."
  value       = local.db_users
}
