# What cloudbuild.yaml needs: a repository for the images, a bucket for the
# uploaded sources, and an account of its own that may push images, roll the
# services and the job forward, and nothing else.

resource "google_artifact_registry_repository" "images" {
  project       = var.project
  location      = var.region
  repository_id = "replication"
  format        = "DOCKER"
  description   = "Ontology replication images (functions, job)."
  labels        = var.labels
  # Every build pushes two images: keep the newest ten versions of each
  # (those the services and job can roll back to) and delete the rest once
  # a month old, so that the repository does not grow forever.
  cleanup_policy_dry_run = false
  cleanup_policies {
    id     = "keep-recent"
    action = "KEEP"
    most_recent_versions {
      keep_count = 10
    }
  }
  cleanup_policies {
    id     = "delete-old"
    action = "DELETE"
    condition {
      older_than = "2592000s"
    }
  }
  depends_on = [google_project_service.enabled]
}

resource "google_storage_bucket" "build_sources" {
  project  = var.project
  name     = "${var.project}-replication-build"
  location = var.region
  # Every build leaves its source archive and the Go cache here: a destroy
  # removes them with the bucket (nothing in it is the only copy of
  # anything).
  force_destroy               = true
  uniform_bucket_level_access = true
  public_access_prevention    = "enforced"
  labels                      = var.labels
  lifecycle_rule {
    condition {
      age = 30
    }
    action {
      type = "Delete"
    }
  }
  depends_on = [google_project_service.enabled]
}

resource "google_service_account" "build" {
  project      = var.project
  account_id   = "replication-build"
  display_name = "Ontology replication build (Cloud Build)"
  depends_on   = [google_project_service.enabled]
}

locals {
  build_member = "serviceAccount:${google_service_account.build.email}"
}

resource "google_artifact_registry_repository_iam_member" "build_writer" {
  project    = var.project
  location   = google_artifact_registry_repository.images.location
  repository = google_artifact_registry_repository.images.name
  role       = "roles/artifactregistry.writer"
  member     = local.build_member
}

resource "google_storage_bucket_iam_member" "build_sources" {
  bucket = google_storage_bucket.build_sources.name
  role   = "roles/storage.objectUser"
  member = local.build_member
}

# Roll the services and the job forward (run.developer), deploying
# revisions that run as the components' accounts (serviceAccountUser on
# those three only), and write the build's logs.
resource "google_project_iam_member" "build" {
  for_each = toset(["roles/run.developer", "roles/logging.logWriter"])
  project  = var.project
  role     = each.key
  member   = local.build_member
}

resource "google_service_account_iam_member" "build_acts_as" {
  for_each           = local.components
  service_account_id = google_service_account.component[each.key].name
  role               = "roles/iam.serviceAccountUser"
  member             = local.build_member
}
