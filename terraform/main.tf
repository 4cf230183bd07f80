locals {
  components = ["drain", "verify", "job"]

  # The IAM database user of a service account is its email without
  # ".gserviceaccount.com".
  db_users = { for c in local.components : c => trimsuffix(google_service_account.component[c].email, ".gserviceaccount.com") }

  # The workspace registry each component reads (REPLICATION_WORKSPACES):
  # the same workspaces, each logging in to Cloud SQL as the component.
  registry = {
    for c in local.components : c => jsonencode({
      identity = var.identity
      workspaces = [for id, ws in var.workspaces : {
        id              = id
        organization_id = ws.organization_id
        runtime_subject = ws.runtime_subject
        database = {
          instance   = ws.database.instance
          name       = ws.database.name
          user       = local.db_users[c]
          iam_auth   = true
          private_ip = ws.database.private_ip
        }
        pubsub   = { project = module.workspace[id].pubsub_project, topic = module.workspace[id].topic_id }
        bigquery = { project = module.workspace[id].bigquery_project, dataset = module.workspace[id].dataset_id, table = module.workspace[id].table_id, location = ws.bigquery_location }
      }]
    })
  }

  vpc = var.vpc_network == "" ? [] : [1]
}

resource "google_service_account" "component" {
  for_each     = toset(local.components)
  account_id   = "replication-${each.key}"
  display_name = "Ontology replication ${each.key}"
}

resource "google_service_account" "scheduler" {
  account_id   = "replication-scheduler"
  display_name = "Ontology replication verifier schedule"
}

# Cloud SQL: connect (client) and log in with IAM (instanceUser), for every
# component. The database GRANTs are in terraform/README.md.
resource "google_project_iam_member" "cloudsql" {
  for_each = { for pair in setproduct(local.components, ["roles/cloudsql.client", "roles/cloudsql.instanceUser"]) : "${pair[0]} ${pair[1]}" => pair }
  project  = var.project
  role     = each.value[1]
  member   = "serviceAccount:${google_service_account.component[each.value[0]].email}"
}

# BigQuery jobs: the verifier's lookups and the job's view statements.
resource "google_project_iam_member" "bigquery_jobs" {
  for_each = toset(["verify", "job"])
  project  = var.project
  role     = "roles/bigquery.jobUser"
  member   = "serviceAccount:${google_service_account.component[each.key].email}"
}

module "workspace" {
  source   = "./modules/workspace"
  for_each = var.workspaces

  workspace_id                      = each.key
  pubsub_project                    = coalesce(each.value.pubsub_project, var.project)
  topic_id                          = coalesce(each.value.topic, "ontology-replication-${each.key}")
  bigquery_project                  = coalesce(each.value.bigquery_project, var.project)
  dataset_id                        = each.value.dataset
  table_id                          = each.value.table
  location                          = each.value.bigquery_location
  dead_letter_max_delivery_attempts = var.dead_letter_max_delivery_attempts
  publishers                        = [for c in local.components : "serviceAccount:${google_service_account.component[c].email}"]
  verifier                          = "serviceAccount:${google_service_account.component["verify"].email}"
  job                               = "serviceAccount:${google_service_account.component["job"].email}"
}

resource "google_cloud_run_v2_service" "drain" {
  name     = "replication-drain"
  location = var.region
  ingress  = "INGRESS_TRAFFIC_ALL"

  template {
    service_account = google_service_account.component["drain"].email
    timeout         = "60s"
    # Each instance keeps at most 4 connections per workspace database; more
    # concurrent drains per instance would only queue for them.
    max_instance_request_concurrency = 8
    scaling {
      max_instance_count = 20
    }
    containers {
      image = var.functions_image
      env {
        name  = "FUNCTION_TARGET"
        value = "Drain"
      }
      env {
        name  = "REPLICATION_WORKSPACES"
        value = local.registry["drain"]
      }
      env {
        name  = "LOG_LEVEL"
        value = var.log_level
      }
    }
    dynamic "vpc_access" {
      for_each = local.vpc
      content {
        egress = "PRIVATE_RANGES_ONLY"
        network_interfaces {
          network    = var.vpc_network
          subnetwork = var.vpc_subnetwork
        }
      }
    }
  }
}

resource "google_cloud_run_v2_service_iam_member" "drain_invoker" {
  for_each = toset(var.drain_invokers)
  name     = google_cloud_run_v2_service.drain.name
  location = var.region
  role     = "roles/run.invoker"
  member   = each.value
}

resource "google_cloud_run_v2_service" "verify" {
  name     = "replication-verify"
  location = var.region
  ingress  = "INGRESS_TRAFFIC_ALL"

  template {
    service_account = google_service_account.component["verify"].email
    timeout         = "120s"
    scaling {
      max_instance_count = 1
    }
    containers {
      image = var.functions_image
      env {
        name  = "FUNCTION_TARGET"
        value = "Verify"
      }
      env {
        name  = "REPLICATION_WORKSPACES"
        value = local.registry["verify"]
      }
      env {
        name  = "VERIFY_TIME_BUDGET"
        value = var.verify_time_budget
      }
      env {
        name  = "VERIFY_WORKERS"
        value = tostring(var.verify_workers)
      }
      env {
        name  = "LOG_LEVEL"
        value = var.log_level
      }
    }
    dynamic "vpc_access" {
      for_each = local.vpc
      content {
        egress = "PRIVATE_RANGES_ONLY"
        network_interfaces {
          network    = var.vpc_network
          subnetwork = var.vpc_subnetwork
        }
      }
    }
  }
}

# The verifier is private: only the scheduler's identity may invoke it.
resource "google_cloud_run_v2_service_iam_member" "verify_invoker" {
  name     = google_cloud_run_v2_service.verify.name
  location = var.region
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.scheduler.email}"
}

# One scheduler job per verifier shard: each names its shard of the
# registry, so that a fleet too large for one pass is verified by several
# (the workspaces whose position in id order is the shard modulo the count).
resource "google_cloud_scheduler_job" "verify" {
  for_each         = { for shard in range(var.verifier_shards) : tostring(shard) => shard }
  name             = var.verifier_shards == 1 ? "replication-verify" : "replication-verify-${each.key}"
  region           = var.region
  schedule         = var.verify_schedule
  attempt_deadline = "120s"

  http_target {
    uri         = google_cloud_run_v2_service.verify.uri
    http_method = "POST"
    body        = base64encode(var.verifier_shards == 1 ? "{}" : jsonencode({ shard = each.value, shards = var.verifier_shards }))
    headers     = { "Content-Type" = "application/json" }
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = google_cloud_run_v2_service.verify.uri
    }
  }
}

moved {
  from = google_cloud_scheduler_job.verify
  to   = google_cloud_scheduler_job.verify["0"]
}

resource "google_cloud_run_v2_job" "replication" {
  name     = "replication-job"
  location = var.region

  template {
    task_count = 1
    template {
      service_account = google_service_account.component["job"].email
      timeout         = var.job_task_timeout
      max_retries     = var.job_max_retries
      containers {
        image = var.job_image
        args  = ["status"]
        env {
          name  = "REPLICATION_WORKSPACES"
          value = local.registry["job"]
        }
        env {
          name  = "LOG_LEVEL"
          value = var.log_level
        }
      }
      dynamic "vpc_access" {
        for_each = local.vpc
        content {
          egress = "PRIVATE_RANGES_ONLY"
          network_interfaces {
            network    = var.vpc_network
            subnetwork = var.vpc_subnetwork
          }
        }
      }
    }
  }
}
