# The drain and verify services, the verifier's schedule and the job.
#
# Who owns the running image: terraform sets it when it creates a service or
# the job (var.functions_image, var.job_image: digests, from the first
# build); from then on Cloud Build's deploy steps roll them forward, and
# terraform ignores the image (and the client fields gcloud writes), so the
# next apply does not roll them back.

locals {
  drain_ingress = {
    load_balancer = "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER"
    invoker       = "INGRESS_TRAFFIC_ALL"
    public        = "INGRESS_TRAFFIC_ALL"
  }
}

moved {
  from = google_cloud_run_v2_service.drain
  to   = google_cloud_run_v2_service.drain[0]
}

moved {
  from = google_cloud_run_v2_service.verify
  to   = google_cloud_run_v2_service.verify[0]
}

moved {
  from = google_cloud_run_v2_job.replication
  to   = google_cloud_run_v2_job.replication[0]
}

moved {
  from = google_cloud_run_v2_job.replication[0]
  to   = google_cloud_run_v2_job.replication["replication-job"]
}

resource "google_cloud_run_v2_service" "drain" {
  count                = local.deploy ? 1 : 0
  project              = var.project
  name                 = "replication-drain"
  location             = var.region
  deletion_protection  = var.deletion_protection
  labels               = var.labels
  ingress              = local.drain_ingress[var.drain_exposure]
  invoker_iam_disabled = var.drain_exposure != "invoker"

  template {
    service_account = google_service_account.component["drain"].email
    timeout         = "60s"
    # A wake-up is answered in about a millisecond, before any database or
    # Pub/Sub call; the work is each workspace's drainer's, behind the
    # answers, whatever the concurrency.
    max_instance_request_concurrency = var.drain_request_concurrency
    scaling {
      # The drainers work after their answers: an instance must not scale
      # to zero while a drainer runs (Cloud Run scales from zero only on a
      # request, and "If your service is using CPU even when it's not
      # processing requests, you should set minimum instances equal to 1":
      # run/docs/about-instance-autoscaling).
      min_instance_count = var.drain_min_instances
      max_instance_count = var.drain_max_instances
    }
    containers {
      image = var.functions_image
      # The drain's shutdown grace within Cloud Run's 10 s from SIGTERM to
      # SIGKILL: its drainers publish and acknowledge their batches out.
      args = ["-shutdown-grace", var.drain_shutdown_grace]
      resources {
        # Instance-based billing: CPU outside requests, for the drainers
        # that drain behind their answers ("Configure instance-based billing
        # to use background activities": run/docs/tips/general; request-based
        # billing "disables or severely limits" CPU after a response).
        cpu_idle          = false
        startup_cpu_boost = true
        limits = {
          cpu    = "1"
          memory = "512Mi"
        }
      }
      env {
        name  = "FUNCTION_TARGET"
        value = "Drain"
      }
      env {
        name  = "REPLICATION_WORKSPACES_FILE"
        value = local.registry_path
      }
      env {
        name  = "GOOGLE_CLOUD_PROJECT"
        value = var.project
      }
      env {
        name  = "DATABASE_SERVER_MAX_CONNS"
        value = tostring(local.server_max_conns["drain"])
      }
      env {
        name  = "DRAIN_GATHER"
        value = var.drain_gather
      }
      env {
        name  = "DRAIN_BATCHES_OUT"
        value = tostring(var.drain_batches_out)
      }
      env {
        name  = "LOG_LEVEL"
        value = var.log_level
      }
      volume_mounts {
        name       = "registry"
        mount_path = dirname(local.registry_path)
      }
    }
    volumes {
      name = "registry"
      secret {
        secret = google_secret_manager_secret.registry["drain"].secret_id
        items {
          version = google_secret_manager_secret_version.registry["drain"].version
          path    = basename(local.registry_path)
        }
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

  lifecycle {
    ignore_changes = [template[0].containers[0].image, client, client_version]
    precondition {
      condition     = var.drain_exposure != "invoker" || length(var.drain_invokers) > 0
      error_message = "drain_exposure = \"invoker\" needs drain_invokers: the gateway's service account."
    }
  }

  depends_on = [time_sleep.grants, terraform_data.connection_budget, terraform_data.network]
}

resource "google_cloud_run_v2_service_iam_member" "drain_invoker" {
  for_each = var.drain_exposure == "invoker" && local.deploy ? toset(var.drain_invokers) : toset([])
  project  = var.project
  name     = google_cloud_run_v2_service.drain[0].name
  location = var.region
  role     = "roles/run.invoker"
  member   = each.value
}

# The verifier is private: internal ingress (Cloud Scheduler's requests in
# the same project count as internal) and only the scheduler's identity may
# invoke it.
resource "google_cloud_run_v2_service" "verify" {
  count               = local.deploy ? 1 : 0
  project             = var.project
  name                = "replication-verify"
  location            = var.region
  deletion_protection = var.deletion_protection
  labels              = var.labels
  ingress             = "INGRESS_TRAFFIC_INTERNAL_ONLY"

  template {
    service_account = google_service_account.component["verify"].email
    timeout         = "120s"
    # One instance: its memory of the workspaces a pass did not reach puts
    # them first in the next pass (the shards' passes share it).
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
        name  = "REPLICATION_WORKSPACES_FILE"
        value = local.registry_path
      }
      env {
        name  = "GOOGLE_CLOUD_PROJECT"
        value = var.project
      }
      env {
        name  = "DATABASE_SERVER_MAX_CONNS"
        value = tostring(local.server_max_conns["verify"])
      }
      env {
        name  = "VERIFY_TIME_BUDGET"
        value = var.verify_time_budget
      }
      env {
        name  = "VERIFY_WORKERS"
        value = tostring(var.verify_workers)
      }
      # The verifier checks its caller in code too: the scheduler's Google
      # OIDC token, for this service's URL.
      env {
        name  = "VERIFY_CALLER"
        value = google_service_account.scheduler.email
      }
      env {
        name  = "VERIFY_AUDIENCE"
        value = local.verify_url
      }
      env {
        name  = "LOG_LEVEL"
        value = var.log_level
      }
      volume_mounts {
        name       = "registry"
        mount_path = dirname(local.registry_path)
      }
    }
    volumes {
      name = "registry"
      secret {
        secret = google_secret_manager_secret.registry["verify"].secret_id
        items {
          version = google_secret_manager_secret_version.registry["verify"].version
          path    = basename(local.registry_path)
        }
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

  lifecycle {
    ignore_changes = [template[0].containers[0].image, client, client_version]
  }

  depends_on = [time_sleep.grants, terraform_data.connection_budget, terraform_data.network]
}

resource "google_cloud_run_v2_service_iam_member" "verify_invoker" {
  count    = local.deploy ? 1 : 0
  project  = var.project
  name     = google_cloud_run_v2_service.verify[0].name
  location = var.region
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.scheduler.email}"
}

# One scheduler job per verifier shard: each names its shard of the
# registry, so that a fleet too large for one pass is verified by several
# (the workspaces whose position in id order is the shard modulo the count).
resource "google_cloud_scheduler_job" "verify" {
  for_each         = local.deploy ? { for shard in range(var.verifier_shards) : tostring(shard) => shard } : {}
  project          = var.project
  name             = var.verifier_shards == 1 ? "replication-verify" : "replication-verify-${each.key}"
  region           = var.region
  schedule         = var.verify_schedule
  attempt_deadline = "120s"

  http_target {
    uri         = google_cloud_run_v2_service.verify[0].uri
    http_method = "POST"
    body        = base64encode(var.verifier_shards == 1 ? "{}" : jsonencode({ shard = each.value, shards = var.verifier_shards }))
    headers     = { "Content-Type" = "application/json" }
    oidc_token {
      service_account_email = google_service_account.scheduler.email
      audience              = local.verify_url
    }
  }
}

moved {
  from = google_cloud_scheduler_job.verify
  to   = google_cloud_scheduler_job.verify["0"]
}

# The job: replication-job, which people execute with their arguments
# (runbook), and, with audit_schedule, replication-audit, the same job
# with `audit` for arguments and no retries, which Cloud Scheduler runs: an
# audit that finds differences exits 1, a result and not a failure to
# retry (each retry would read the warehouse again), and only its result
# lines count in the "warehouse differs" alert (an operator's audit, or
# typo, run through replication-job pages nobody).
locals {
  jobs = local.deploy ? merge(
    { "replication-job" = { args = ["status"], max_retries = var.job_max_retries } },
    var.audit_schedule != "" ? { "replication-audit" = { args = ["audit"], max_retries = 0 } } : {},
  ) : {}
}

resource "google_cloud_run_v2_job" "replication" {
  for_each            = local.jobs
  project             = var.project
  name                = each.key
  location            = var.region
  deletion_protection = var.deletion_protection
  labels              = var.labels

  template {
    task_count = var.job_tasks
    template {
      service_account = google_service_account.component["job"].email
      timeout         = var.job_task_timeout
      max_retries     = each.value.max_retries
      containers {
        image = var.job_image
        args  = each.value.args
        env {
          name  = "REPLICATION_WORKSPACES_FILE"
          value = local.registry_path
        }
        env {
          name  = "GOOGLE_CLOUD_PROJECT"
          value = var.project
        }
        env {
          name  = "DATABASE_SERVER_MAX_CONNS"
          value = tostring(local.server_max_conns["job"])
        }
        env {
          name  = "LOG_LEVEL"
          value = var.log_level
        }
        volume_mounts {
          name       = "registry"
          mount_path = dirname(local.registry_path)
        }
      }
      volumes {
        name = "registry"
        secret {
          secret = google_secret_manager_secret.registry["job"].secret_id
          items {
            version = google_secret_manager_secret_version.registry["job"].version
            path    = basename(local.registry_path)
          }
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

  lifecycle {
    ignore_changes = [template[0].template[0].containers[0].image, client, client_version]
  }

  depends_on = [time_sleep.grants, terraform_data.connection_budget, terraform_data.network]
}

# The scheduled audit (var.audit_schedule, off by default): Cloud Scheduler
# runs replication-audit through the Cloud Run Admin API's jobs.run, as the
# scheduler's account, which may run that job and nothing else. The result
# is each workspace's "replication audit" log line (monitoring.tf).
resource "google_cloud_scheduler_job" "audit" {
  count            = local.deploy && var.audit_schedule != "" ? 1 : 0
  project          = var.project
  name             = "replication-audit"
  region           = var.region
  schedule         = var.audit_schedule
  attempt_deadline = "180s"

  http_target {
    uri         = "https://run.googleapis.com/v2/projects/${var.project}/locations/${var.region}/jobs/${google_cloud_run_v2_job.replication["replication-audit"].name}:run"
    http_method = "POST"
    headers     = { "Content-Type" = "application/json" }
    oauth_token {
      service_account_email = google_service_account.scheduler.email
      scope                 = "https://www.googleapis.com/auth/cloud-platform"
    }
  }
}

resource "google_cloud_run_v2_job_iam_member" "audit_runner" {
  count    = local.deploy && var.audit_schedule != "" ? 1 : 0
  project  = var.project
  location = var.region
  name     = google_cloud_run_v2_job.replication["replication-audit"].name
  role     = "roles/run.invoker"
  member   = "serviceAccount:${google_service_account.scheduler.email}"
}
