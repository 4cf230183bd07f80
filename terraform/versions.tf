terraform {
  # 1.11: mock_provider's override_during in terraform/tests.
  required_version = ">= 1.11"
  required_providers {
    google = {
      source = "hashicorp/google"
      # The floor is the version tested (terraform/tests, and the Go test
      # that checks every resource against the 7.46 schema): an older
      # provider may lack an argument this module sets. 8.0 may rename.
      version = ">= 7.45, < 8.0"
    }
    # For google_project_service_identity alone (the Pub/Sub service agent
    # made before its grants), which only the beta provider has.
    google-beta = {
      source  = "hashicorp/google-beta"
      version = ">= 7.45, < 8.0"
    }
    # time_sleep: the wait for IAM grants to propagate on a first apply.
    time = {
      source  = "hashicorp/time"
      version = ">= 0.9, < 1.0"
    }
  }
}

provider "google" {
  project = var.project
  region  = var.region
}

provider "google-beta" {
  project = var.project
  region  = var.region
}
