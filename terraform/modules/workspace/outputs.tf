output "pubsub_project" {
  description = "Project of the topics."
  value       = var.pubsub_project
}

output "topic_id" {
  description = "Events topic id."
  value       = google_pubsub_topic.events.name
}

output "topic_name" {
  description = "Events topic full name."
  value       = google_pubsub_topic.events.id
}

output "dead_letter_topic_name" {
  description = "Dead-letter topic full name."
  value       = google_pubsub_topic.dead_letter.id
}

output "bigquery_project" {
  description = "Project of the dataset."
  value       = var.bigquery_project
}

output "dataset_id" {
  description = "Dataset id."
  value       = google_bigquery_dataset.internal.dataset_id
}

output "table_id" {
  description = "Events table id."
  value       = google_bigquery_table.events.table_id
}

output "pubsub_agent_made" {
  description = "The service whose agent the module makes before granting it (pubsub.googleapis.com), for the plan tests."
  value       = google_project_service_identity.pubsub.service
}
