variable "project" {
  description = "Google Cloud project that runs the drain, the verifier, the scheduler, the job and the build."
  type        = string
}

variable "region" {
  description = "Region of the Cloud Run services and job, the Cloud Scheduler jobs and the Artifact Registry repository."
  type        = string
  default     = "europe-west1"
}

variable "functions_image" {
  description = "The functions image by digest (…/functions@sha256:…), as the first build prints it. Empty for the first apply, which creates everything the build needs and no service. terraform sets the image once; later builds roll the services forward (terraform ignores the image)."
  type        = string
  default     = ""
  validation {
    condition     = var.functions_image == "" || can(regex("@sha256:[0-9a-f]{64}$", var.functions_image))
    error_message = "functions_image must be an image digest (…/functions@sha256:<64 hex digits>), not a tag: a tag can move under a running service."
  }
}

variable "job_image" {
  description = "The job image by digest (…/job@sha256:…), as the first build prints it; empty with functions_image."
  type        = string
  default     = ""
  validation {
    condition     = var.job_image == "" || can(regex("@sha256:[0-9a-f]{64}$", var.job_image))
    error_message = "job_image must be an image digest (…/job@sha256:<64 hex digits>), not a tag."
  }
}

variable "identity" {
  description = "Runtime identity tokens the drain accepts: issuer (iss), audience (aud), the issuer's JWKS URL, and optionally the typ header every token carries and the claim holding the organisation id."
  type = object({
    issuer             = string
    audience           = string
    jwks_url           = string
    token_type         = optional(string)
    organization_claim = optional(string)
  })
}

variable "workspaces" {
  description = "Workspaces to replicate, by workspace id: organisation, runtime token subject, Cloud SQL database, and where events go (projects default to var.project)."
  type = map(object({
    organization_id = string
    runtime_subject = string
    database = object({
      instance   = string # project:region:instance
      name       = string
      private_ip = optional(bool, true)
    })
    pubsub_project    = optional(string)
    topic             = optional(string) # default: ontology-replication-<workspace>
    bigquery_project  = optional(string)
    dataset           = optional(string, "ontology_internal")
    views_dataset     = optional(string, "ontology") # the latest-state views
    table             = optional(string, "events")
    bigquery_location = optional(string, "EU")
  }))
  validation {
    condition     = alltrue([for ws in var.workspaces : can(regex("^[a-z][a-z0-9.:-]*:[a-z0-9-]+:[a-z][a-z0-9-]*$", ws.database.instance))])
    error_message = "Each workspace's database.instance must be a Cloud SQL connection name, project:region:instance."
  }
  validation {
    condition     = alltrue([for ws in var.workspaces : ws.views_dataset != ws.dataset])
    error_message = "A workspace's views_dataset must not be its dataset: the job's role to create views must not be held on the dataset of the events table."
  }
  validation {
    condition     = length(distinct([for ws in var.workspaces : ws.runtime_subject])) == length(var.workspaces)
    error_message = "Two workspaces share a runtime_subject: one token would drain both."
  }
}

variable "drain_exposure" {
  description = <<-EOT
    How the drain is reached. "load_balancer" (the default): ingress from the VPC and Cloud Load
    Balancing only, no IAM check at the edge (the drain checks every call's runtime token). "invoker":
    any ingress, only var.drain_invokers (the gateway's service account, sending an ID token) may invoke.
    "public": any ingress, no IAM check at the edge (invoker_iam_disabled, which organisations whose
    domain-restricted sharing policy refuses allUsers accept).
  EOT
  type        = string
  default     = "load_balancer"
  validation {
    condition     = contains(["load_balancer", "invoker", "public"], var.drain_exposure)
    error_message = "drain_exposure must be load_balancer, invoker or public."
  }
}

variable "drain_invokers" {
  description = "With drain_exposure = \"invoker\": the principals that may invoke the drain (serviceAccount:gateway@…)."
  type        = list(string)
  default     = []
}

variable "vpc_network" {
  description = "VPC network for Direct VPC egress, needed to reach Cloud SQL on a private IP; empty for none."
  type        = string
  default     = ""
}

variable "vpc_subnetwork" {
  description = "Subnetwork for Direct VPC egress (with vpc_network)."
  type        = string
  default     = ""
}

variable "verify_schedule" {
  description = "Cron schedule of the verifier (Cloud Scheduler)."
  type        = string
  default     = "* * * * *"
}

variable "audit_schedule" {
  description = "Cron schedule of a scheduled `job audit` (Cloud Scheduler runs the job with the args [\"audit\"]); empty, the default, schedules none. Each run reads every audited generation's rows of seven columns in BigQuery once (README: Audit and repair)."
  type        = string
  default     = ""
}

variable "verify_time_budget" {
  description = "Time budget of one verifier pass, in seconds (\"50s\") or minutes (\"1m\"); under the scheduler's attempt deadline (120 s)."
  type        = string
  default     = "50s"
  validation {
    condition = can(regex("^[0-9]+(s|m)$", var.verify_time_budget)) && (
      endswith(var.verify_time_budget, "s") ? tonumber(trimsuffix(var.verify_time_budget, "s")) : 60 * tonumber(trimsuffix(var.verify_time_budget, "m"))
      ) >= 5 && (
      endswith(var.verify_time_budget, "s") ? tonumber(trimsuffix(var.verify_time_budget, "s")) : 60 * tonumber(trimsuffix(var.verify_time_budget, "m"))
    ) <= 110
    error_message = "verify_time_budget must be whole seconds (\"50s\") or minutes (\"1m\") from 5 s to 110 s, under the scheduler's 120 s attempt deadline."
  }
}

variable "verify_workers" {
  description = "Workspaces one verifier pass verifies at once."
  type        = number
  default     = 16
  validation {
    condition     = var.verify_workers >= 1 && var.verify_workers <= 64
    error_message = "verify_workers must be between 1 and 64."
  }
}

variable "verifier_shards" {
  description = "Scheduler jobs the registry is split across, each verifying its shard in its own pass (all on the verifier service). Raise it when passes report workspaces not reached."
  type        = number
  default     = 1
  validation {
    condition     = var.verifier_shards >= 1 && var.verifier_shards <= 100 && floor(var.verifier_shards) == var.verifier_shards
    error_message = "verifier_shards must be a whole number between 1 and 100."
  }
}

variable "log_level" {
  description = "Log level of the services and the job: DEBUG, INFO, WARN or ERROR."
  type        = string
  default     = "INFO"
  validation {
    condition     = contains(["DEBUG", "INFO", "WARN", "WARNING", "ERROR"], upper(var.log_level))
    error_message = "log_level must be DEBUG, INFO, WARN or ERROR (a service started with another one exits at once)."
  }
}

variable "job_task_timeout" {
  description = "Timeout of one Cloud Run job task (a backfill or replay of a large workspace can take hours)."
  type        = string
  default     = "86400s"
}

variable "job_max_retries" {
  description = "Retries of a failed task of replication-job, the job operators run by hand. 0: a command runs once (an audit that finds differences exits 1, which a retry would only run again, 4 times the BigQuery bytes); every command retries transient faults itself for 2 minutes, and every page is its own transaction, so running it again resumes. The scheduled audit's job (replication-audit) never retries: a finding is a result."
  type        = number
  default     = 0
  validation {
    condition     = var.job_max_retries >= 0 && var.job_max_retries <= 10 && floor(var.job_max_retries) == var.job_max_retries
    error_message = "job_max_retries must be a whole number from 0 to 10."
  }
}

variable "dead_letter_max_delivery_attempts" {
  description = "Delivery attempts before the BigQuery subscription moves a message to the dead-letter topic (5 to 100)."
  type        = number
  default     = 5
  validation {
    condition     = var.dead_letter_max_delivery_attempts >= 5 && var.dead_letter_max_delivery_attempts <= 100 && floor(var.dead_letter_max_delivery_attempts) == var.dead_letter_max_delivery_attempts
    error_message = "dead_letter_max_delivery_attempts must be a whole number from 5 to 100 (Pub/Sub's bounds)."
  }
}

# The connection budget (terraform/README.md): on one workspace database,
# drain_max_instances × drain_pool_size + verifier_pool_size + job_tasks ×
# job_pool_size; on one Cloud SQL instance, for each component its most
# instances × min(its per-server cap, its pool size × the instance's
# workspace databases), summed.

variable "drain_gather" {
  description = "How long a busy workspace's drainer waits on the next turn before its claim, so that one batch takes several commits (a Go duration, 0 to 1s; 0 turns it off): the database's cost per commit against a commit's latency (PERFORMANCE.md)."
  type        = string
  default     = "85ms"
  validation {
    condition     = can(regex("^(0|[0-9]{1,3}ms|1s)$", var.drain_gather))
    error_message = "drain_gather must be a duration from 0 to 1s, such as 85ms."
  }
}

variable "drain_max_instances" {
  description = "Most instances of the drain service (each answers up to drain_request_concurrency wake-ups at once)."
  type        = number
  default     = 10
}

variable "drain_min_instances" {
  description = "Instances of the drain service kept running (instance-based billing: each costs its vCPU and memory all month, about 49 USD at 1 vCPU and 512 MiB in a tier-1 region; terraform/README.md). At least 1: a drainer works after its answer, and an instance must not scale to zero under it."
  type        = number
  default     = 1
  validation {
    condition     = var.drain_min_instances >= 1
    error_message = "drain_min_instances must be at least 1: a drainer works after its wake-up's answer."
  }
}

variable "drain_request_concurrency" {
  description = "Wake-ups one drain instance answers at once (each in about a millisecond; the drainers' work is behind the answers)."
  type        = number
  default     = 80
  validation {
    condition     = var.drain_request_concurrency >= 80 && var.drain_request_concurrency <= 1000
    error_message = "drain_request_concurrency must be from 80 to 1000: a wake-up is answered at once, so fewer would only scale out instances that sit idle."
  }
}

variable "drain_shutdown_grace" {
  description = "How long a stopping drain instance (Cloud Run's SIGTERM, then SIGKILL 10 s later) waits for its drainers to publish and acknowledge their batches out (a Go duration under 10s)."
  type        = string
  default     = "8s"
  validation {
    condition     = can(regex("^[1-9]s$", var.drain_shutdown_grace))
    error_message = "drain_shutdown_grace must be whole seconds from 1s to 9s: Cloud Run kills the instance 10 s after SIGTERM."
  }
}

variable "drain_batches_out" {
  description = "Batches a workspace's drainer has out at once (DRAIN_BATCHES_OUT), each one Publish request: what keeps a workspace's delivery up with a slow Pub/Sub."
  type        = number
  default     = 4
  validation {
    condition     = var.drain_batches_out >= 1 && var.drain_batches_out <= 64
    error_message = "drain_batches_out must be from 1 to 64."
  }
}

variable "drain_pool_size" {
  description = "Connections each drain instance keeps at most per workspace database (DATABASE_POOL_SIZE)."
  type        = number
  default     = 2
}

variable "verifier_pool_size" {
  description = "Connections the verifier keeps at most per workspace database."
  type        = number
  default     = 2
}

variable "job_tasks" {
  description = "Tasks of one job execution, each taking its share of the workspaces (gcloud run jobs execute --tasks); the budget counts them all on one database."
  type        = number
  default     = 1
}

variable "job_pool_size" {
  description = "Connections each job task keeps at most per workspace database."
  type        = number
  default     = 4
}

variable "drain_server_max_connections" {
  description = "Connections each drain instance keeps at most on one Cloud SQL instance, however many workspace databases live there (DATABASE_SERVER_MAX_CONNS): wake-ups past it wait for a connection or answer 503."
  type        = number
  default     = 4
  validation {
    condition     = var.drain_server_max_connections >= 1 && var.drain_server_max_connections <= 10000
    error_message = "drain_server_max_connections must be from 1 to 10000."
  }
}

variable "verifier_server_max_connections" {
  description = "Connections the verifier keeps at most on one Cloud SQL instance (DATABASE_SERVER_MAX_CONNS)."
  type        = number
  default     = 8
  validation {
    condition     = var.verifier_server_max_connections >= 1 && var.verifier_server_max_connections <= 10000
    error_message = "verifier_server_max_connections must be from 1 to 10000."
  }
}

variable "job_server_max_connections" {
  description = "Connections each job task keeps at most on one Cloud SQL instance (DATABASE_SERVER_MAX_CONNS)."
  type        = number
  default     = 8
  validation {
    condition     = var.job_server_max_connections >= 1 && var.job_server_max_connections <= 10000
    error_message = "job_server_max_connections must be from 1 to 10000."
  }
}

variable "sql_instance_max_connections" {
  description = "The max_connections flag of each Cloud SQL instance the workspaces use, by connection name (project:region:instance); an instance not listed counts as default_sql_max_connections."
  type        = map(number)
  default     = {}
}

variable "default_sql_max_connections" {
  description = "The max_connections of an instance not listed in sql_instance_max_connections (Cloud SQL's default for a 3.75 GB instance is 100)."
  type        = number
  default     = 100
}

variable "sdk_reserved_connections" {
  description = "Connections each Cloud SQL instance keeps for the ontology service, the SDK's migrations and administrators; this deployment's worst case must fit in max_connections less this."
  type        = number
  default     = 20
}

variable "max_connections_per_database" {
  description = "The most connections this deployment may hold on one workspace database (what the SDK's database can spare beside the ontology service's own). terraform refuses a configuration whose worst case exceeds it."
  type        = number
  default     = 50
}

# Monitoring.

variable "notification_channels" {
  description = "Existing Cloud Monitoring notification channels (projects/…/notificationChannels/…) the alerts notify."
  type        = list(string)
  default     = []
}

variable "alert_emails" {
  description = "Email addresses the paging alerts notify (an email notification channel is created for each)."
  type        = list(string)
  default     = []
}

variable "ticket_notification_channels" {
  description = "Notification channels of the WARNING alerts (tickets: dead letters, workspaces not reached, the scheduled audit, the SLO's slow burn); empty, the default: the paging channels (notification_channels and alert_emails)."
  type        = list(string)
  default     = []
}

variable "set_aside_alert_minutes" {
  description = "Page when a workspace has had an event set aside (one the drain cannot publish) for longer than this many minutes: 1, 5, 15, 30 or 60."
  type        = number
  default     = 15
  validation {
    condition     = contains([1, 5, 15, 30, 60], var.set_aside_alert_minutes)
    error_message = "set_aside_alert_minutes must be 1, 5, 15, 30 or 60, the bands the verifier reports lags in."
  }
}

variable "subscription_backlog_alert_minutes" {
  description = "Page when a BigQuery subscription's oldest unacknowledged message is older than this many minutes (it is not writing to its table)."
  type        = number
  default     = 10
  validation {
    condition     = var.subscription_backlog_alert_minutes >= 2 && var.subscription_backlog_alert_minutes <= 1440
    error_message = "subscription_backlog_alert_minutes must be between 2 and 1440."
  }
}

variable "drain_failure_min_count" {
  description = "The drain-failing alert needs at least this many failed or unavailable invocations of a workspace in 10 minutes, besides drain_failure_ratio_alert of them (one 503 in two wake-ups is no page)."
  type        = number
  default     = 10
  validation {
    condition     = var.drain_failure_min_count >= 1 && floor(var.drain_failure_min_count) == var.drain_failure_min_count
    error_message = "drain_failure_min_count must be a whole number of at least 1."
  }
}

variable "connections_alert_ratio" {
  description = "Page when a Cloud SQL instance's backends exceed this share of its max_connections (sql_instance_max_connections, or default_sql_max_connections)."
  type        = number
  default     = 0.9
  validation {
    condition     = var.connections_alert_ratio > 0 && var.connections_alert_ratio <= 1
    error_message = "connections_alert_ratio must be more than 0 and at most 1."
  }
}

variable "audit_result_max_hours" {
  description = "With audit_schedule set: open a ticket when no scheduled audit has written its result for this many hours (1 to 24; keep it above the schedule's interval)."
  type        = number
  default     = 24
  validation {
    condition     = var.audit_result_max_hours >= 1 && var.audit_result_max_hours <= 24 && floor(var.audit_result_max_hours) == var.audit_result_max_hours
    error_message = "audit_result_max_hours must be a whole number from 1 to 24."
  }
}

variable "delivery_lag_alert_minutes" {
  description = "Alert when a workspace's oldest pending event has waited longer than this many minutes (delivery stall): 1, 5, 15, 30 or 60, the bands the verifier reports lags in."
  type        = number
  default     = 5
  validation {
    condition     = contains([1, 5, 15, 30, 60], var.delivery_lag_alert_minutes)
    error_message = "delivery_lag_alert_minutes must be 1, 5, 15, 30 or 60."
  }
}

variable "verification_lag_alert_minutes" {
  description = "Alert when a workspace's oldest accepted event has not been found in BigQuery for longer than this many minutes (the verifier requeues after 15): 1, 5, 15, 30 or 60."
  type        = number
  default     = 30
  validation {
    condition     = contains([1, 5, 15, 30, 60], var.verification_lag_alert_minutes)
    error_message = "verification_lag_alert_minutes must be 1, 5, 15, 30 or 60."
  }
}

variable "workspace_gauges" {
  description = "Per-workspace distributions of the lags and backlogs (the dashboard's per-workspace charts). About $0.85 per workspace and metric a month at list prices (README); false keeps the per-workspace lag bands (alerts, SLO) and drops these."
  type        = bool
  default     = true
}

variable "drain_failure_ratio_alert" {
  description = "Page when more than this share of a workspace's drain invocations fail or are unavailable over 10 minutes (and at least drain_failure_min_count of them)."
  type        = number
  default     = 0.1
  validation {
    condition     = var.drain_failure_ratio_alert > 0 && var.drain_failure_ratio_alert < 1
    error_message = "drain_failure_ratio_alert must be between 0 and 1 (a share, not a percentage)."
  }
}

variable "slo_minutes" {
  description = "The SLO: no event waits longer than this many minutes to be verified (1, 5, 15, 30 or 60)…"
  type        = number
  default     = 30
  validation {
    condition     = contains([1, 5, 15, 30, 60], var.slo_minutes)
    error_message = "slo_minutes must be 1, 5, 15, 30 or 60, the bands the verifier reports lags in."
  }
}

variable "slo_goal" {
  description = "…in this share of workspace-minutes over 28 days."
  type        = number
  default     = 0.999
  validation {
    condition     = var.slo_goal > 0 && var.slo_goal < 1
    error_message = "slo_goal must be between 0 and 1, exclusive (0.999, not 99.9)."
  }
}

variable "deletion_protection" {
  description = "Whether the Cloud Run services and jobs refuse deletion (the provider's default). Set it to false and apply before a terraform destroy (terraform/README.md, Teardown)."
  type        = bool
  default     = true
}

variable "labels" {
  description = "Labels put on every resource that takes them (services, jobs, topics, subscriptions, datasets, secrets, alert policies), for cost attribution."
  type        = map(string)
  default     = {}
}

variable "events_table_deletion_protection" {
  description = "Whether terraform refuses to delete the workspaces' events tables (the verification evidence). Set it to false and apply before a terraform destroy."
  type        = bool
  default     = true
}

variable "verifier_failure_passes" {
  description = "Alert when the verifier fails a workspace on this many passes within as many minutes (its grant revoked, its database unreachable)."
  type        = number
  default     = 3
  validation {
    condition     = var.verifier_failure_passes >= 1 && var.verifier_failure_passes <= 60
    error_message = "verifier_failure_passes must be between 1 and 60."
  }
}

variable "iam_propagation_wait" {
  description = "How long, on the apply that makes them, what needs a new grant waits for it to reach every Google API: the services and the job after their secret and Cloud SQL grants, each BigQuery subscription after the Pub/Sub agent's (a duration such as 60s; 0s on projects where the grants exist)."
  type        = string
  default     = "60s"
  validation {
    condition     = can(regex("^[0-9]+(s|m)$", var.iam_propagation_wait))
    error_message = "iam_propagation_wait must be a whole number of seconds or minutes, such as 60s or 2m."
  }
}

variable "metrics_propagation_wait" {
  description = "How long the first apply waits between creating the log-based metrics and the alert policies, SLO and dashboard that name them: Cloud Monitoring may take up to 10 minutes to know a new metric (Error 404: Cannot find metric(s)). Only a change of the metrics waits again."
  type        = string
  default     = "10m"
  validation {
    condition     = can(regex("^[0-9]+(s|m)$", var.metrics_propagation_wait))
    error_message = "metrics_propagation_wait must be a duration in seconds or minutes, such as 10m."
  }
}
