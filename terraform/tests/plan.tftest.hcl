# Plans of the root module with mocked providers: what lands where, before
# anything is applied. `terraform test` in terraform/ runs them against the
# real providers where they install (Cloud Build), and TestTerraformRunsOffline
# (go test ./terraform) against a schema-only provider serving the real
# providers' recorded schemas everywhere else.

mock_provider "google" {
  # Values the real provider knows at plan (a new account's email), and
  # computed ones the configuration reads, mocked during plan too.
  override_during = plan

  mock_resource "google_service_account" {
    defaults = {
      email = "replication-component@acme.iam.gserviceaccount.com"
      name  = "projects/acme/serviceAccounts/replication-component@acme.iam.gserviceaccount.com"
      id    = "projects/acme/serviceAccounts/replication-component@acme.iam.gserviceaccount.com"
    }
  }
  mock_resource "google_project_iam_custom_role" {
    defaults = {
      id = "projects/acme/roles/replicationViews"
    }
  }
  mock_resource "google_secret_manager_secret_version" {
    defaults = {
      version = "1"
    }
  }
  mock_resource "google_monitoring_slo" {
    defaults = {
      name = "projects/acme/services/ontology-replication/serviceLevelObjectives/verified-within-30m"
    }
  }
  mock_resource "google_cloud_run_v2_service" {
    defaults = {
      uri = "https://replication.example.run.app"
    }
  }
  mock_data "google_project" {
    defaults = {
      number = "123456789"
    }
  }
}

# The beta provider makes the Pub/Sub service agent; time waits for grants
# to propagate. Neither is reached at plan.
mock_provider "google-beta" {}
mock_provider "time" {}

variables {
  project = "acme"
  identity = {
    issuer   = "https://identity.example"
    audience = "ontology-replication"
    jwks_url = "https://identity.example/jwks.json"
  }
  workspaces = {
    w1 = {
      organization_id = "org-1"
      runtime_subject = "runtime:w1"
      database        = { instance = "acme:europe-west1:ontology", name = "w1" }
    }
  }
  vpc_network    = "projects/acme/global/networks/default"
  vpc_subnetwork = "projects/acme/regions/europe-west1/subnetworks/default"
}

run "first_apply_creates_what_the_build_needs" {
  command = plan

  assert {
    condition     = length(google_cloud_run_v2_service.drain) == 0 && length(google_cloud_run_v2_job.replication) == 0
    error_message = "no service before the first build has pushed the images"
  }
  assert {
    condition     = google_artifact_registry_repository.images.format == "DOCKER"
    error_message = "the build's repository"
  }
  assert {
    condition     = contains(keys(google_project_service.enabled), "run.googleapis.com") && contains(keys(google_project_service.enabled), "secretmanager.googleapis.com")
    error_message = "the APIs are enabled"
  }
  assert {
    condition     = contains(keys(google_project_iam_member.build), "roles/run.developer") && length(google_service_account_iam_member.build_acts_as) == 3
    error_message = "the build may roll the services forward as the components' accounts"
  }
  assert {
    condition     = module.workspace["w1"].pubsub_agent_made == "pubsub.googleapis.com"
    error_message = "the Pub/Sub service agent is made before its grants"
  }
  assert {
    condition     = time_sleep.grants.create_duration == "60s"
    error_message = "the services wait for their grants to propagate"
  }
}

run "services_from_digests" {
  command = plan

  variables {
    functions_image = "europe-west1-docker.pkg.dev/acme/replication/functions@sha256:0000000000000000000000000000000000000000000000000000000000000001"
    job_image       = "europe-west1-docker.pkg.dev/acme/replication/job@sha256:0000000000000000000000000000000000000000000000000000000000000002"
  }

  assert {
    condition     = google_cloud_run_v2_service.verify[0].ingress == "INGRESS_TRAFFIC_INTERNAL_ONLY"
    error_message = "the verifier is private"
  }
  assert {
    condition     = google_cloud_run_v2_service_iam_member.verify_invoker[0].member == "serviceAccount:${google_service_account.scheduler.email}"
    error_message = "only the scheduler invokes the verifier"
  }
  assert {
    condition     = google_cloud_run_v2_service.drain[0].ingress == "INGRESS_TRAFFIC_INTERNAL_LOAD_BALANCER" && google_cloud_run_v2_service.drain[0].invoker_iam_disabled
    error_message = "the drain's default exposure: the load balancer, no allUsers binding"
  }
  assert {
    condition     = length(google_cloud_run_v2_service_iam_member.drain_invoker) == 0
    error_message = "no invoker binding (allUsers) by default"
  }
  assert {
    condition     = google_cloud_run_v2_service.drain[0].template[0].containers[0].resources[0].cpu_idle == false
    error_message = "the drain bills by instance: its drainers use the CPU after their answers"
  }
  assert {
    condition     = google_cloud_run_v2_service.drain[0].template[0].scaling[0].min_instance_count >= 1
    error_message = "a drain instance is always up: it does not scale to zero under a drainer"
  }
  assert {
    condition     = google_cloud_run_v2_service.drain[0].template[0].max_instance_request_concurrency >= 80
    error_message = "an instance answers many wake-ups at once: each is answered in about a millisecond"
  }
  assert {
    condition     = google_cloud_run_v2_service.drain[0].template[0].containers[0].args == tolist(["-shutdown-grace", "8s"])
    error_message = "the drain's shutdown grace fits Cloud Run's 10 s from SIGTERM to SIGKILL"
  }
  assert {
    condition     = can(regex("@sha256:", google_cloud_run_v2_service.drain[0].template[0].containers[0].image))
    error_message = "the services run digests"
  }
  assert {
    condition     = one([for e in google_cloud_run_v2_service.drain[0].template[0].containers[0].env : e.value if e.name == "REPLICATION_WORKSPACES_FILE"]) == "/etc/replication/registry.json"
    error_message = "the registry is mounted as a file"
  }
  assert {
    condition     = length(google_cloud_scheduler_job.verify) == 1
    error_message = "one scheduler job by default"
  }
  assert {
    condition = (
      one([for e in google_cloud_run_v2_service.verify[0].template[0].containers[0].env : e.value if e.name == "VERIFY_AUDIENCE"]) == google_cloud_scheduler_job.verify["0"].http_target[0].oidc_token[0].audience
      && one([for e in google_cloud_run_v2_service.verify[0].template[0].containers[0].env : e.value if e.name == "VERIFY_CALLER"]) == google_cloud_scheduler_job.verify["0"].http_target[0].oidc_token[0].service_account_email
    )
    error_message = "the verifier accepts exactly the scheduler's token"
  }
  assert {
    condition     = !can(jsondecode(google_secret_manager_secret_version.registry["verify"].secret_data).identity)
    error_message = "the verifier's registry has no identity section"
  }
}

run "sharded_verifier" {
  command = plan

  variables {
    functions_image = "europe-west1-docker.pkg.dev/acme/replication/functions@sha256:0000000000000000000000000000000000000000000000000000000000000001"
    job_image       = "europe-west1-docker.pkg.dev/acme/replication/job@sha256:0000000000000000000000000000000000000000000000000000000000000002"
    verifier_shards = 3
  }

  assert {
    condition     = length(google_cloud_scheduler_job.verify) == 3 && jsondecode(base64decode(google_cloud_scheduler_job.verify["2"].http_target[0].body)) == { shard = 2, shards = 3 }
    error_message = "one scheduler job per shard, each naming its shard"
  }
}

run "workspaces_in_other_projects" {
  command = plan

  variables {
    workspaces = {
      w1 = {
        organization_id  = "org-1"
        runtime_subject  = "runtime:w1"
        database         = { instance = "sql-one:europe-west1:ontology", name = "w1" }
        pubsub_project   = "ps-one"
        bigquery_project = "bq-one"
      }
      w2 = {
        organization_id  = "org-2"
        runtime_subject  = "runtime:w2"
        database         = { instance = "sql-two:europe-west1:ontology", name = "w2" }
        pubsub_project   = "ps-two"
        bigquery_project = "bq-two"
      }
    }
  }

  assert {
    condition     = google_project_iam_member.bigquery_jobs["verify bq-one"].project == "bq-one" && google_project_iam_member.bigquery_jobs["job bq-two"].project == "bq-two"
    error_message = "BigQuery jobs are allowed in the dataset's project"
  }
  assert {
    condition     = google_project_iam_member.cloudsql["drain sql-two:europe-west1:ontology roles/cloudsql.client"].project == "sql-two"
    error_message = "Cloud SQL roles are granted in the instance's project"
  }
  assert {
    condition     = strcontains(google_project_iam_member.cloudsql["drain sql-two:europe-west1:ontology roles/cloudsql.client"].condition[0].expression, "projects/sql-two/instances/ontology")
    error_message = "and only on the instance"
  }
  assert {
    condition     = google_sql_user.component["verify sql-one:europe-west1:ontology"].project == "sql-one" && google_sql_user.component["verify sql-one:europe-west1:ontology"].type == "CLOUD_IAM_SERVICE_ACCOUNT"
    error_message = "the IAM database users are created on each instance"
  }
  assert {
    condition     = google_project_iam_custom_role.views["bq-two"].project == "bq-two"
    error_message = "the views role is defined where the dataset lives"
  }
  assert {
    condition     = module.workspace["w2"].pubsub_project == "ps-two"
    error_message = "the topic lives in the workspace's Pub/Sub project"
  }
  assert {
    condition     = toset(keys(google_monitoring_monitored_project.pubsub)) == toset(["ps-one", "ps-two", "sql-one", "sql-two"]) && google_monitoring_monitored_project.pubsub["ps-one"].metrics_scope == "locations/global/metricsScopes/acme"
    error_message = "the Pub/Sub and Cloud SQL projects join the deployment project's metrics scope, so that their dead letters and connections alert"
  }
}

# A database on its private IP (the default) needs Direct VPC egress.
run "private_ip_without_a_network" {
  command = plan

  variables {
    vpc_network    = ""
    vpc_subnetwork = ""
  }

  expect_failures = [terraform_data.network]
}

run "public_ip_without_a_network" {
  command = plan

  variables {
    vpc_network    = ""
    vpc_subnetwork = ""
    workspaces = {
      w1 = {
        organization_id = "org-1"
        runtime_subject = "runtime:w1"
        database        = { instance = "acme:europe-west1:ontology", name = "w1", private_ip = false }
      }
    }
  }
}

run "oversized_connection_budget" {
  command = plan

  variables {
    drain_max_instances = 100
  }

  expect_failures = [terraform_data.connection_budget]
}

# Ten workspace databases on one instance of 50 connections: each drain
# instance's per-server cap (4) × 10 instances + the verifier's 8 + the job's
# 8 = 56 > 50 − 20 reserved. One database each is within it.
run "shared_instance_over_its_budget" {
  command = plan

  variables {
    workspaces = { for i in range(10) : "w${i}" => {
      organization_id = "org-1"
      runtime_subject = "runtime:w${i}"
      database        = { instance = "acme:europe-west1:shared", name = "w${i}" }
    } }
    sql_instance_max_connections = { "acme:europe-west1:shared" = 50 }
  }

  expect_failures = [terraform_data.connection_budget]
}

run "shared_instance_within_its_budget" {
  command = plan

  variables {
    workspaces = { for i in range(10) : "w${i}" => {
      organization_id = "org-1"
      runtime_subject = "runtime:w${i}"
      database        = { instance = "acme:europe-west1:shared", name = "w${i}" }
    } }
  }

  assert {
    condition     = local.instance_connections["acme:europe-west1:shared"] == 10 * 4 + 8 + 8
    error_message = "the worst case on the shared instance is each component's per-server cap"
  }
}

# The connections alert reads each instance's own max_connections: one
# declared at 400 pages past 360 backends (connections_alert_ratio 0.9), one
# left at the default (100) past 90.
run "connections_alert_per_instance" {
  command = plan

  variables {
    workspaces = {
      w1 = {
        organization_id = "org-1"
        runtime_subject = "runtime:w1"
        database        = { instance = "acme:europe-west1:large", name = "w1" }
      }
      w2 = {
        organization_id = "org-2"
        runtime_subject = "runtime:w2"
        database        = { instance = "acme:europe-west1:small", name = "w2" }
      }
    }
    sql_instance_max_connections = { "acme:europe-west1:large" = 400 }
  }

  assert {
    condition     = google_monitoring_alert_policy.connections["acme:europe-west1:large"].conditions[0].condition_threshold[0].threshold_value == 360
    error_message = "the large instance alerts at 90% of its declared 400"
  }
  assert {
    condition     = google_monitoring_alert_policy.connections["acme:europe-west1:small"].conditions[0].condition_threshold[0].threshold_value == 90
    error_message = "an instance with no declared max_connections alerts at 90% of the default"
  }
}

run "image_tags_are_refused" {
  command = plan

  variables {
    functions_image = "europe-west1-docker.pkg.dev/acme/replication/functions:latest"
  }

  expect_failures = [var.functions_image]
}

run "monitoring" {
  command = plan

  variables {
    alert_emails = ["oncall@acme.example"]
  }

  assert {
    condition     = strcontains(google_monitoring_alert_policy.lag["delivery_stall"].conditions[0].condition_threshold[0].filter, "delivery_lag_band=one_of(\"under_15m\", \"under_30m\", \"under_1h\", \"over_1h\")")
    error_message = "the delivery stall alert fires on the bands over 5 minutes"
  }
  assert {
    condition     = strcontains(google_monitoring_slo.verified_in_time.request_based_sli[0].good_total_ratio[0].good_service_filter, "outstanding_band=one_of(\"under_1m\", \"under_5m\", \"under_15m\", \"under_30m\")")
    error_message = "the SLO counts the samples within 30 minutes as good"
  }
  assert {
    condition     = length(google_monitoring_notification_channel.email) == 1 && length(google_monitoring_alert_policy.dead_letters.notification_channels) == 1
    error_message = "the alerts notify the email channel"
  }
  assert {
    condition     = length(google_logging_metric.distribution["replication/delivery_lag"].label_extractors) == 1 && length(google_logging_metric.distribution["replication/drain_duration"].label_extractors) == 0
    error_message = "lags by workspace, latencies for the fleet"
  }
}

run "scheduled_audit_is_its_own_job" {
  command = plan

  variables {
    functions_image = "europe-west1-docker.pkg.dev/acme/replication/functions@sha256:0000000000000000000000000000000000000000000000000000000000000001"
    job_image       = "europe-west1-docker.pkg.dev/acme/replication/job@sha256:0000000000000000000000000000000000000000000000000000000000000002"
    audit_schedule  = "0 3 * * *"
  }

  assert {
    condition     = google_cloud_run_v2_job.replication["replication-audit"].template[0].template[0].max_retries == 0
    error_message = "the scheduled audit never retries: a finding is a result"
  }
  assert {
    condition     = google_cloud_run_v2_job.replication["replication-audit"].template[0].template[0].containers[0].args == tolist(["audit"])
    error_message = "the audit job audits"
  }
  assert {
    condition     = google_cloud_run_v2_job_iam_member.audit_runner[0].role == "roles/run.invoker"
    error_message = "the scheduler may run the audit job, without overrides"
  }
  assert {
    condition     = google_cloud_run_v2_job.replication["replication-job"].deletion_protection && google_cloud_run_v2_service.drain[0].deletion_protection
    error_message = "the services and jobs are protected unless deletion_protection is false"
  }
}

run "teardown_unprotects_the_services" {
  command = plan

  variables {
    functions_image                  = "europe-west1-docker.pkg.dev/acme/replication/functions@sha256:0000000000000000000000000000000000000000000000000000000000000001"
    job_image                        = "europe-west1-docker.pkg.dev/acme/replication/job@sha256:0000000000000000000000000000000000000000000000000000000000000002"
    deletion_protection              = false
    events_table_deletion_protection = false
  }

  assert {
    condition = (
      !google_cloud_run_v2_service.drain[0].deletion_protection && !google_cloud_run_v2_service.verify[0].deletion_protection
      && !google_cloud_run_v2_job.replication["replication-job"].deletion_protection
    )
    error_message = "with deletion_protection false, a destroy removes the services and the job"
  }
}

run "bad_log_level_is_refused" {
  command = plan

  variables {
    log_level = "verbose"
  }

  expect_failures = [var.log_level]
}
