variable "project" {
  description = "Google Cloud project that runs the drain, the verifier, the scheduler and the job."
  type        = string
}

variable "region" {
  description = "Region of the Cloud Run services, the Cloud Run job and the Cloud Scheduler job."
  type        = string
  default     = "europe-west1"
}

variable "functions_image" {
  description = "Container image of the functions (built from ./functions/cmd by cloudbuild.yaml); FUNCTION_TARGET chooses Drain or Verify."
  type        = string
}

variable "job_image" {
  description = "Container image of the Cloud Run job (built from ./job by cloudbuild.yaml)."
  type        = string
}

variable "identity" {
  description = "Runtime identity tokens the drain accepts: issuer (iss), audience (aud) and the issuer's JWKS URL."
  type = object({
    issuer   = string
    audience = string
    jwks_url = string
  })
}

variable "workspaces" {
  description = "Workspaces to replicate, by workspace id: organisation, runtime token subject, Cloud SQL database, and where events go."
  type = map(object({
    organization_id = string
    runtime_subject = string
    database = object({
      instance   = string # project:region:instance
      name       = string
      private_ip = optional(bool, true)
    })
    pubsub_project    = optional(string) # default: var.project
    topic             = optional(string) # default: ontology-replication-<workspace>
    bigquery_project  = optional(string) # default: var.project
    dataset           = optional(string, "ontology_internal")
    table             = optional(string, "events")
    bigquery_location = optional(string, "EU")
  }))
}

variable "drain_invokers" {
  description = "Principals allowed to invoke the drain service. The drain authenticates every call itself with the runtime token; use the platform gateway's service account to also restrict it at the edge."
  type        = list(string)
  default     = ["allUsers"]
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

variable "verify_time_budget" {
  description = "Time budget of one verifier run (a Go duration); keep it under the scheduler's attempt deadline."
  type        = string
  default     = "50s"
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
}

variable "job_task_timeout" {
  description = "Timeout of one Cloud Run job task (a backfill or replay of a large workspace can take hours)."
  type        = string
  default     = "86400s"
}

variable "job_max_retries" {
  description = "Retries of a failed job task; every page is its own transaction, so a retry resumes."
  type        = number
  default     = 3
}

variable "dead_letter_max_delivery_attempts" {
  description = "Delivery attempts before the BigQuery subscription moves a message to the dead-letter topic (5 to 100)."
  type        = number
  default     = 5
}
