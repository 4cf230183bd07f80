# The APIs the deployment uses, enabled in the project that runs it. Other
# projects a workspace names (Pub/Sub, BigQuery, Cloud SQL) must have theirs
# enabled already: terraform/README.md lists them.
locals {
  services = toset([
    "artifactregistry.googleapis.com",
    "bigquery.googleapis.com",
    "cloudbuild.googleapis.com",
    "cloudresourcemanager.googleapis.com",
    "cloudscheduler.googleapis.com",
    "iam.googleapis.com",
    "logging.googleapis.com",
    "monitoring.googleapis.com",
    "pubsub.googleapis.com",
    "run.googleapis.com",
    "secretmanager.googleapis.com",
    "sqladmin.googleapis.com",
    "storage.googleapis.com",
  ])
}

resource "google_project_service" "enabled" {
  for_each = local.services
  project  = var.project
  service  = each.key
  # Other things in the project may use them.
  disable_on_destroy = false
}
