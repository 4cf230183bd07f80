output "drain_url" {
  description = "Base URL of the drain (null before the services are deployed); the gateway forwards <url>/api/internal/v1/workspaces/<id>/ontology/replication/drain to it."
  value       = one(google_cloud_run_v2_service.drain[*].uri)
}

output "verify_url" {
  description = "URL of the private verifier, called by Cloud Scheduler (null before the services are deployed)."
  value       = one(google_cloud_run_v2_service.verify[*].uri)
}

output "job_name" {
  description = "Cloud Run job to run with `gcloud run jobs execute` (null before it is deployed)."
  value       = try(google_cloud_run_v2_job.replication["replication-job"].name, null)
}

output "image_repository" {
  description = "Artifact Registry repository the build pushes to (cloudbuild.yaml's _REPOSITORY)."
  value       = "${var.region}-docker.pkg.dev/${var.project}/${google_artifact_registry_repository.images.repository_id}"
}

output "build_service_account" {
  description = "The account to run cloudbuild.yaml as (gcloud builds submit --service-account)."
  value       = google_service_account.build.id
}

output "build_sources_bucket" {
  description = "Bucket for the build's uploaded sources (gcloud builds submit --gcs-source-staging-dir=gs://<bucket>/source)."
  value       = google_storage_bucket.build_sources.name
}

output "topics" {
  description = "Per workspace: the events topic and its dead-letter topic."
  value       = { for id, ws in module.workspace : id => { topic = ws.topic_name, dead_letter_topic = ws.dead_letter_topic_name } }
}

output "database_users" {
  description = "The components' IAM database users, created on each workspace's instance; grant them as terraform/README.md says."
  value       = local.db_users
}

output "worst_case_connections" {
  description = "The most connections the deployment can hold on one workspace database."
  value       = local.worst_case_connections
}
